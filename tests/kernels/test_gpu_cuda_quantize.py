"""The CUDA (NVRTC) quantise-on-write kernel: bit-identical to the torch reference on a GPU.

Skipped without CUDA. On the CPU, test_cuda_emulator.py runs the same kernel in the warp emulator
(kvwire/kernels/cuda_emulator.py); test_quantize.py checks the dispatch and the kernel's scope.
"""
import ctypes

import pytest
import torch

from kvwire.kernels import nvrtc, quantize_cuda
from kvwire.kernels.quantize import write_page_layers, write_pages, write_pages_reference
from kvwire.quant import NonFiniteCount, NonFiniteInputError

from .helpers import check_quantize_bit_identical, make_format, random_kv

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = "cuda"
COMPACT = ("fp8-tensor", "fp8-head", "fp8-page", "fp8-token", "nvfp4")

# Every (bf16 significand, fp32 significand) pair: x = 1.m (7 bits), s = 1.m (23 bits). Power-of-two
# scaling is exact without underflow/overflow, so this covers every bf16 x and every normal s.
_DIVISION_CHECK = r"""
#include "exact_division.cuh"
extern "C" __global__ void check_division(unsigned long long* bad, unsigned int* example) {
    const unsigned int idx = blockIdx.x * blockDim.x + threadIdx.x;          // 2^30 of them
    const float x = __uint_as_float(0x3f800000u | ((idx >> 23) << 16));
    const float s = __uint_as_float(0x3f800000u | (idx & 0x7fffffu));
    const float q = div_fast(x, s, rcp_rn(s));
    bool wrong = __float_as_uint(q) != __float_as_uint(div_rn(x, s));
    // rcp_rn_in_range == rcp.rn for every significand, at both ends of div_fast_ok's range too
    const float ends[3] = {s, s * 0x1p-80f, s * 0x1p99f};
    for (int k = 0; k < 3; ++k)
        wrong |= __float_as_uint(rcp_rn_in_range(ends[k])) != __float_as_uint(rcp_rn(ends[k]));
    if (wrong) {
        if (atomicAdd(bad, 1ull) == 0ull) { example[0] = __float_as_uint(x); example[1] = __float_as_uint(s); }
    }
}
"""


@pytest.mark.parametrize("steps", [1, 2])
def test_fast_division_is_exact_for_every_bf16_numerator(steps):
    """The claim quantize_cuda.DIVISION_STEPS rests on, checked for all 2^30 significand pairs, and
    the branch-free reciprocal (rcp_rn_in_range) against rcp.rn for every fp32 significand."""
    import ctypes

    from kvwire.kernels.nvrtc import load_source
    kern = load_source(_DIVISION_CHECK, "check_division", {"DIVSTEPS": steps}, torch.device(DEV))
    bad = torch.zeros(1, dtype=torch.int64, device=DEV)
    example = torch.zeros(2, dtype=torch.int32, device=DEV)
    kern.launch((1 << 22, 1, 1), (256, 1, 1), [ctypes.c_void_p(bad.data_ptr()), ctypes.c_void_p(example.data_ptr())])
    torch.cuda.synchronize()
    x, s = example.cpu().view(torch.float32).tolist()
    assert int(bad) == 0, (f"{int(bad)} quotients differ from div.rn with {steps} step(s), or reciprocals from "
                           f"rcp.rn, e.g. {x!r} / {s!r}")


@pytest.fixture(params=[1, 2], ids=["1-step", "2-step"])
def division_steps(request, monkeypatch):
    """Both exact-division variants of the kernel (cuda/exact_division.cuh)."""
    monkeypatch.setattr(quantize_cuda, "DIVISION_STEPS", request.param)
    return request.param


SHAPES = [(8, 128, 16), (3, 64, 16), (5, 64, 32), (2, 128, 4)]


@pytest.mark.parametrize("name", COMPACT)
@pytest.mark.parametrize("heads,head_dim,page_size", SHAPES)
def test_cuda_quantize_bit_identical(name, heads, head_dim, page_size, division_steps):
    check_quantize_bit_identical(DEV, name, heads, head_dim, page_size)


@pytest.mark.parametrize("variant", [{"NOCLAMP": 0, "AMAX2": 0}, {"NOCLAMP": 1, "AMAX2": 0}, {"NOCLAMP": 0, "AMAX2": 1},
                                     {"E2M1MIN": 0}, {"E2M1MIN": 1, "NOCLAMP": 0}],
                         ids=["clamped", "no-clamp", "packed-amax", "exponent-e2m1", "min-e2m1-clamped"])
@pytest.mark.parametrize("heads,head_dim,page_size", SHAPES)
def test_cuda_quantize_nvfp4_variants_bit_identical(variant, heads, head_dim, page_size, monkeypatch):
    """The NVFP4 path's other compile-time variants (quantize_cuda.TUNING) against the reference
    (the shipped one, NOCLAMP, AMAX2, HFAST, E2M1MIN and LDL1, is test_cuda_quantize_bit_identical's;
    HFAST=0 and LDL1=0 are tested for every format below)."""
    monkeypatch.setattr(quantize_cuda, "TUNING", {**quantize_cuda.TUNING, **variant})
    check_quantize_bit_identical(DEV, "nvfp4", heads, head_dim, page_size)


@pytest.mark.parametrize("name", COMPACT)
@pytest.mark.parametrize("heads,head_dim,page_size", SHAPES)
@pytest.mark.parametrize("variant", [{"HFAST": 0}, {"LDL1": 0}], ids=["pages-fastest-grid", "loads-not-through-l1"])
def test_cuda_quantize_other_grid_and_loads_bit_identical(name, heads, head_dim, page_size, variant, monkeypatch):
    """HFAST=0 (the grid with pages fastest) and LDL1=0 (input loads not allocated in L1), every
    format (quantize_cuda.TUNING): the same bytes."""
    monkeypatch.setattr(quantize_cuda, "TUNING", {**quantize_cuda.TUNING, **variant})
    check_quantize_bit_identical(DEV, name, heads, head_dim, page_size)


@pytest.mark.parametrize("name", ["nvfp4", "fp8-token"])
def test_cuda_quantize_other_chunks_per_thread_bit_identical(name, monkeypatch):
    """CPL from TUNING: the launch takes its block size from the compiled kernel."""
    monkeypatch.setattr(quantize_cuda, "TUNING", {**quantize_cuda.TUNING, "CPL": 4})
    check_quantize_bit_identical(DEV, name, 8, 128, 16)


@pytest.mark.parametrize("name", ["fp8-token", "nvfp4"])
def test_cuda_quantize_strided_input_and_auto_backend(name, monkeypatch):
    """A [n, P, H, D] view of a wider K|V buffer (as a fused QKV projection gives) goes to the CUDA
    kernel under "auto", and writes the same bytes."""
    gen = torch.Generator().manual_seed(1)
    f = make_format(name, page_size=16, layers=1, heads=4, head_dim=64)
    kv = random_kv((40, 16, 2, 4, 64), gen).to(torch.bfloat16)
    x = kv[:, :, 1]                                      # stride over the K|V axis
    launched = []
    real = quantize_cuda.launch
    monkeypatch.setattr(quantize_cuda, "launch", lambda *a, **k: (launched.append(1), real(*a, **k)))
    storage = torch.randint(0, 256, (64, f.page_bytes), dtype=torch.uint8, generator=gen)   # poisoned
    expect = storage.clone()
    storage = storage.to(DEV)
    ids = torch.randperm(64, generator=gen)[:40]
    write_pages(storage, f, 0, 0, ids.to(DEV), kv.to(DEV)[:, :, 1])
    write_pages_reference(expect, f, 0, 0, ids, x)
    assert launched, "auto did not pick the CUDA kernel"
    assert int((storage.cpu() != expect).sum()) == 0


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("name", ["fp8-token", "nvfp4", "fp8-token/nvfp4", "fp8-page/nvfp4"])
def test_write_page_layers_on_the_gpu(name, backend):
    """All 30 layers of a SmolLM2-shaped page in one launch per part (each section at its layer
    stride, format version 2) write what one reference write per layer does."""
    gen = torch.Generator().manual_seed(5)
    f = make_format(name, page_size=16, layers=30, heads=3, head_dim=64)
    storage = torch.randint(0, 256, (12, f.page_bytes), dtype=torch.uint8, generator=gen)
    expect = storage.clone()
    storage = storage.to(DEV)
    ids = torch.randperm(12, generator=gen)[:5]
    for part in (0, 1):
        tails = random_kv((5, 30, 3, 16, 64), gen).to(torch.bfloat16)       # [n, layers, H, P, D]
        write_page_layers(storage, f, part, ids.to(DEV), tails.to(DEV).transpose(2, 3), backend=backend)
        for layer in range(30):
            write_pages_reference(expect, f, layer, part, ids, tails[:, layer].transpose(1, 2))
    assert int((storage.cpu() != expect).sum()) == 0


def test_cuda_quantize_counts_non_finite():
    f = make_format("nvfp4", heads=8, head_dim=128)
    storage = torch.zeros((8, f.page_bytes), dtype=torch.uint8, device=DEV)
    x = torch.randn((4, 16, 8, 128), device=DEV).to(torch.bfloat16)
    x[2, 3, 4, 5] = float("nan")
    x[0, 0, 0, 0] = float("inf")
    x[3, 15, 7, 127] = -float("inf")
    with pytest.raises(NonFiniteInputError, match="3 non-finite"):
        write_pages(storage, f, 0, 0, torch.arange(4, device=DEV), x, backend="cuda")


def test_cuda_backend_outside_the_scope_raises():
    f = make_format("fp8-token", heads=8, head_dim=128)
    storage = torch.zeros((8, f.page_bytes), dtype=torch.uint8, device=DEV)
    x = torch.randn((4, 16, 8, 128), device=DEV)                     # fp32 input: Triton only
    with pytest.raises(ValueError, match="CUDA quantise kernel does not cover"):
        write_pages(storage, f, 0, 0, torch.arange(4, device=DEV), x, backend="cuda")
    write_pages(storage, f, 0, 0, torch.arange(4, device=DEV), x)    # auto: Triton


def _captured_node_types(fn) -> list[int]:
    """The CUgraphNodeType of every node one call of ``fn`` puts into a CUDA graph (0 is a kernel,
    1 a copy, 2 a memset), read from the captured graph through the driver: what a replay runs."""
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        fn()
    lib = nvrtc._load_cuda()
    graph = ctypes.c_void_p(g.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    nvrtc._check_cu(lib.cuGraphGetNodes(graph, None, ctypes.byref(count)), "graph node count")
    nodes = (ctypes.c_void_p * count.value)()
    nvrtc._check_cu(lib.cuGraphGetNodes(graph, nodes, ctypes.byref(count)), "graph nodes")
    types = []
    for node in nodes[:count.value]:
        kind = ctypes.c_int(-1)
        nvrtc._check_cu(lib.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "graph node type")
        types.append(kind.value)
    return types


@pytest.mark.parametrize("name", ["nvfp4", "fp8-token", "bf16"])
def test_write_pages_runs_one_kernel_without_the_check(name):
    """With the non-finite check off or deferred (the engine's writes), the quantiser is all that
    runs on the GPU: no fill of the flag and no cast of a dummy scale, each of which would be one
    more node per call in a CUDA graph (the engine's decode steps and every timed call of the bench
    are graph replays). The control, one zero fill before the call, shows the count sees extra work."""
    f = make_format(name, heads=8, head_dim=128)
    storage = torch.zeros((8, f.page_bytes), dtype=torch.uint8, device=DEV)
    x = torch.randn((4, 16, 8, 128), device=DEV).to(torch.bfloat16)
    ids = torch.arange(4, device=DEV)
    count = NonFiniteCount(DEV)
    write_pages(storage, f, 0, 0, ids, x, check_finite=False)           # compiles outside the capture
    write_pages(storage, f, 0, 0, ids, x, nonfinite=count)
    torch.cuda.synchronize()
    assert _captured_node_types(lambda: write_pages(storage, f, 0, 0, ids, x, check_finite=False)) == [0]
    assert _captured_node_types(lambda: write_pages(storage, f, 0, 0, ids, x, nonfinite=count)) == [0]
    with_fill = _captured_node_types(lambda: (count.tensor.zero_(), write_pages(storage, f, 0, 0, ids, x,
                                                                                check_finite=False)))
    assert len(with_fill) == 2 and 0 in with_fill, with_fill
