"""The CUDA (NVRTC) quantise-on-write kernel: bit-identical to the torch reference on a GPU.

Skipped without CUDA (there is no CUDA interpreter); the CPU suite runs the Triton kernel that
writes the same bytes, and checks the dispatch and the kernel's scope in test_quantize.py.
"""
import pytest
import torch

from kvwire.kernels import quantize_cuda
from kvwire.kernels.quantize import write_pages, write_pages_reference
from kvwire.quant import NonFiniteInputError

from .helpers import make_format, random_kv

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


def _special_pages(x: torch.Tensor, name: str, gen: torch.Generator) -> None:
    """Pages that reach every branch: all zero, tiny (div.rn path), ties at every rounding point."""
    n, p, h, d = x.shape
    x[0] = 0
    x[1] *= 1e-7
    x[2] *= 1e-30                        # scales below 2^-80: exact division by div.rn
    x[3, :, :, ::3] = -0.0               # negative zeros keep their sign
    # Exact ties: with a page amax of 448 (fp8) or 2688 (nvfp4) the scales are powers of two, so
    # x / scale lands exactly on the E4M3 / E2M1 rounding midpoints.
    sign = 1 - 2 * (torch.arange(p * h * d) % 2).reshape(p, h, d)
    if name == "nvfp4":
        mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.125, 0.3125, 1.125, 6.5, 9.0, 13.0])
        vals = mids[torch.arange(p * h * d) % len(mids)].reshape(p, h, d)
        blocks = torch.tensor([1.0, 2.0, 0.5, 4.0]).repeat_interleave(16).repeat(d // 64)
        x[4] = vals.clamp(max=6.0) * blocks * sign
        x[4, :, :, ::16] = 6.0 * blocks[::16]        # each block's amax: 6 x a power of two
        x[4, 0, :, 0] = 2688.0                          # page amax: global scale 1
        # Blocks far below their page's amax: subnormal E4M3 block scales, whose rounding can put
        # |x / s| far past 6 (the clamped path), next to blocks with normal scales.
        x[5, :, :, 16:32] *= 1e-5
        x[5, :, :, 48:64] *= 3e-5
    else:
        # 1.xxxx * 2^j: five significant bits, E4M3 keeps four, so half of them are exact ties
        # (subnormal E4M3 ones included, j down to -12).
        sig = torch.randint(16, 32, (p, h, d), generator=gen) / 16.0
        x[4] = sig * torch.exp2(torch.randint(-12, 8, (p, h, d), generator=gen).float()) * sign
        x[4, :, :, 1] = 448.0                           # page and token amax 448: scale 1


SHAPES = [(8, 128, 16), (3, 64, 16), (5, 64, 32), (2, 128, 4)]


@pytest.mark.parametrize("name", COMPACT)
@pytest.mark.parametrize("heads,head_dim,page_size", SHAPES)
def test_cuda_quantize_bit_identical(name, heads, head_dim, page_size, division_steps):
    _check_bit_identical(name, heads, head_dim, page_size)


@pytest.mark.parametrize("variant", [{"NOCLAMP": 0, "AMAX2": 0}, {"NOCLAMP": 1, "AMAX2": 0}, {"NOCLAMP": 0, "AMAX2": 1}],
                         ids=["clamped", "no-clamp", "packed-amax"])
@pytest.mark.parametrize("heads,head_dim,page_size", SHAPES)
def test_cuda_quantize_nvfp4_variants_bit_identical(variant, heads, head_dim, page_size, monkeypatch):
    """The NVFP4 path's other compile-time variants (quantize_cuda.TUNING) against the reference
    (the shipped one, NOCLAMP and AMAX2, is test_cuda_quantize_bit_identical's)."""
    monkeypatch.setattr(quantize_cuda, "TUNING", {**quantize_cuda.TUNING, **variant})
    _check_bit_identical("nvfp4", heads, head_dim, page_size)


@pytest.mark.parametrize("name", ["nvfp4", "fp8-token"])
def test_cuda_quantize_other_chunks_per_thread_bit_identical(name, monkeypatch):
    """CPL from TUNING: the launch takes its block size from the compiled kernel."""
    monkeypatch.setattr(quantize_cuda, "TUNING", {**quantize_cuda.TUNING, "CPL": 4})
    _check_bit_identical(name, 8, 128, 16)


def _check_bit_identical(name, heads, head_dim, page_size):
    gen = torch.Generator().manual_seed(heads * 7 + head_dim + page_size)
    f = make_format(name, page_size=page_size, layers=2, heads=heads, head_dim=head_dim)
    n, pool = 300, 512
    storage = torch.randint(0, 256, (pool, f.page_bytes), dtype=torch.uint8, generator=gen)
    expect = storage.clone()
    storage = storage.to(DEV)
    ids = torch.randperm(pool, generator=gen)[:n]
    static = torch.rand((2, heads), generator=gen) * 0.01 + 0.001
    static[1, 0] = 1e-12                                 # far below the data: saturates, |x/s| > 2^60
    for part in (0, 1):
        x = random_kv((n, page_size, heads, head_dim), gen)
        _special_pages(x, name, gen)
        x = x.to(torch.bfloat16)
        write_pages(storage, f, 1, part, ids.to(DEV), x.to(DEV), static[part].to(DEV), backend="cuda")
        write_pages_reference(expect, f, 1, part, ids, x, static[part])
    diff = int((storage.cpu() != expect).sum())
    assert diff == 0, f"{diff} bytes differ from the CPU reference"


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
    storage = torch.zeros((64, f.page_bytes), dtype=torch.uint8)
    expect = storage.clone()
    storage = storage.to(DEV)
    ids = torch.randperm(64, generator=gen)[:40]
    write_pages(storage, f, 0, 0, ids.to(DEV), kv.to(DEV)[:, :, 1])
    write_pages_reference(expect, f, 0, 0, ids, x)
    assert launched, "auto did not pick the CUDA kernel"
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
