"""The CUDA (NVRTC) decode split kernel against the torch reference, on a GPU at real sizes.

Skipped without CUDA. The CPU cannot run this kernel (there is no CUDA interpreter); the CPU suite
runs the Triton kernels it shares the contract and the reduce step with, and checks the dispatch.
"""
import pytest
import torch

from kvwire.kernels import paged_decode_cuda
from kvwire.kernels.paged_decode import paged_decode_attention, paged_decode_reference
from kvwire.kernels.quantize import write_pages_reference

from .helpers import make_format, random_kv, rel_err
from .test_gpu import _check_decode, _decode_problem

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = "cuda"
VARIANTS = [{}, {"DEPTH": 2, "MINB": 1}, {"DEPTH": 3, "MINB": 1}, {"PREF": 2}, {"LAZYMAX": 0},
            {"QSMEM": 0, "MINB": 4}, {"SCALESHFL": 0}, {"STAGES": 0}, {"STAGES": 1}, {"STAGES": 2},
            {"WHOLEPAGE": 0, "STAGES": 0}, {"WHOLEPAGE": 1, "STAGES": 0}, {"WHOLEPAGE": 1, "STAGES": 2},
            {"WHOLEPAGE": 1, "STAGES": 3, "REFILL_LAG": 2, "NW": 2}, {"WHOLEPAGE": 1, "NW": 8, "MINB": 2, "QSMEM": 0}]


@pytest.fixture(params=VARIANTS, ids=["default", "depth-2", "depth-3", "l2-prefetch", "exact-max", "q-in-registers",
                                      "scale-loads", "registers", "staged-1", "staged-2", "head-blocks",
                                      "whole-pages", "whole-pages-staged-2", "whole-pages-2-staged-3-lag-2",
                                      "whole-pages-8-warps"])
def variant(request, monkeypatch):
    """The shipped tuning, then other code paths: register rings of 2 and 3 pages, the L2
    prefetch, the exact running max, q in registers, fp8-token scales by one load each, pages
    loaded straight into registers, shared-memory page rings of 1 and 2 slots, blocks of one KV
    head, and whole-page blocks (a warp per KV head) from registers, through a block ring of 2
    slots, of 3 slots for 2 heads (a 4-head fp8 ring of 3 exceeds 48 KB of static shared memory),
    and with 8 warps and q in registers (for 4 KV heads: blocks of 4 heads)."""
    tuning = dict(paged_decode_cuda.TUNING)
    tuning.update(request.param)
    monkeypatch.setattr(paged_decode_cuda, "TUNING", tuning)
    return request.param


COMPACT = ("fp8-tensor", "fp8-head", "fp8-page", "fp8-token", "nvfp4", "fp8-token/nvfp4", "nvfp4/fp8-token",
           "fp8-tensor/nvfp4", "fp8-head/fp8-page", "fp8-page/fp8-token")


@pytest.mark.parametrize("name", COMPACT)
def test_cuda_decode_formats(name, variant):
    _check_decode(_decode_problem(name), 1e-2, backend="cuda")


@pytest.mark.parametrize("name", ["fp8-token", "nvfp4", "fp8-token/nvfp4", "fp8-tensor"])
@pytest.mark.parametrize("gqa,head_dim", [(1, 128), (3, 64), (4, 64), (8, 128), (3, 128)])
def test_cuda_decode_gqa_and_head_dim(name, gqa, head_dim, variant):
    _check_decode(_decode_problem(name, gqa=gqa, head_dim=head_dim, heads=4), 1e-2, backend="cuda")


@pytest.mark.parametrize("name", ["fp8-token/nvfp4", "nvfp4", "fp8-tensor", "fp8-page"])
def test_cuda_decode_fp32_q_tight(name, variant):
    _check_decode(_decode_problem(name, q_dtype=torch.float32), 4e-3, backend="cuda")


@pytest.mark.parametrize("splits", [1, 3, 13, 64])
def test_cuda_decode_any_split_count(splits, variant):
    """More splits than some sequences have pages, and blocks whose warps get no page at all."""
    _check_decode(_decode_problem("fp8-token/nvfp4", q_dtype=torch.float32), 4e-3, backend="cuda",
                  num_splits=splits)


def _magnitude_problem(name, seed, n, key_mag, value_mag, static_scale, num_pages, tail_len):
    """Two sequences over ``n`` random pages whose K (V) values are multiplied per page by ``key_mag``
    (``value_mag``), tensors of shape [n, 1, 1, 1] or 1.0."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    f = make_format(name, page_size=16, layers=1, heads=4, head_dim=128)
    storage = torch.empty((n + 8, f.page_bytes), dtype=torch.uint8, device=DEV)
    static = torch.full((1, 2, 4), static_scale, device=DEV)
    ids = torch.randperm(n + 8, device=DEV, generator=gen)[:n]
    for part, mag in ((0, key_mag), (1, value_mag)):
        write_pages_reference(storage, f, 0, part, ids, random_kv((n, 16, 4, 128), gen, DEV) * mag, static[0, part])
    q = torch.randn((2, 16, 128), device=DEV, generator=gen)
    tail = torch.randn((2, 1, 2, 4, 16, 128), device=DEV, generator=gen).to(torch.bfloat16)
    return (q, storage, f, 0, ids.view(2, n // 2).int(), torch.tensor(num_pages, dtype=torch.int32, device=DEV), tail,
            torch.tensor([0, 1], dtype=torch.int32, device=DEV), torch.tensor(tail_len, dtype=torch.int32, device=DEV),
            static)


@pytest.mark.parametrize("name", ["fp8-token", "fp8-page", "nvfp4", "fp8-token/nvfp4"])
def test_cuda_decode_value_scales_far_apart(name, variant):
    """Pages whose K/V magnitudes differ by up to 2^28: the kernel's value reference must rescale."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    page_mag = torch.exp2(torch.randint(-14, 15, (300, 1, 1, 1), device=DEV, generator=gen).float())
    _check_decode(_magnitude_problem(name, 3, 300, 1.0, page_mag, 0.01, [150, 100], [5, 16]), 4e-3, backend="cuda")


@pytest.mark.parametrize("name", ["fp8-tensor", "fp8-token", "nvfp4", "fp8-token/nvfp4"])
def test_cuda_decode_scores_rising_along_the_sequence(name, variant):
    """Key magnitudes growing 30x along the sequence: the running max moves in steps both under and
    over the kernel's lazy-rescale threshold, and P must stay inside f16 either way."""
    ramp = torch.linspace(0.2, 6.0, 400, device=DEV).view(400, 1, 1, 1)
    _check_decode(_magnitude_problem(name, 5, 400, ramp, 1.0, 0.05, [200, 193], [3, 16]), 4e-3, backend="cuda")


def test_cuda_decode_page_ids_past_65536_and_offsets_past_2_31(variant):
    f = make_format("fp8-token", heads=8, head_dim=128)
    n_pool = max((2**31) // f.page_bytes + 5000, 70_100)
    gen = torch.Generator(device=DEV).manual_seed(1)
    used = torch.tensor([70_000, n_pool - 1, n_pool - 500, 123, 65_537, n_pool - 2], device=DEV)
    storage = torch.empty((n_pool, f.page_bytes), dtype=torch.uint8, device=DEV)
    for part in (0, 1):
        write_pages_reference(storage, f, 1, part, used, random_kv((6, 16, 8, 128), gen, DEV))
    tail = torch.randn((2, 2, 2, 8, 16, 128), device=DEV, generator=gen).to(torch.bfloat16)
    args = (torch.randn((2, 32, 128), device=DEV, generator=gen), storage, f, 1, used.view(2, 3).int(),
            torch.tensor([3, 3], dtype=torch.int32, device=DEV), tail, torch.tensor([1, 0], dtype=torch.int32, device=DEV),
            torch.tensor([16, 2], dtype=torch.int32, device=DEV), None)
    _check_decode(args, 4e-3, backend="cuda")


def test_cuda_decode_refuses_misaligned_storage():
    """Pages are read with 16-byte loads (and bulk copies): a storage view 8 bytes off gets a clear error."""
    args = list(_decode_problem("fp8-token"))
    storage = args[1]
    raw = torch.empty(storage.numel() + 16, dtype=torch.uint8, device=DEV)
    shifted = raw[8:8 + storage.numel()].view_as(storage)
    shifted.copy_(storage)
    args[1] = shifted
    with pytest.raises(ValueError, match="16-byte aligned"):
        paged_decode_attention(*args, backend="cuda")


def test_cuda_decode_deep_grid_takes_the_staged_ring(monkeypatch):
    """fp8-token pages on a grid of DEEP_GRID_WAVES waves or more run the staged kernel, correctly."""
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {})
    args = _decode_problem("fp8-token")
    kernels = paged_decode_cuda.select("cuda", args[2], args[0].shape[1], args[0], True)
    assert kernels.deep_grid is not None and kernels.deep_grid.defines["STAGES"] > 0
    launched = []
    pick = paged_decode_cuda.DecodeKernels.for_launch

    def spy(self, *launch):
        launched.append(pick(self, *launch))
        return launched[-1]

    monkeypatch.setattr(paged_decode_cuda.DecodeKernels, "for_launch", spy)
    rows = paged_decode_cuda.grid(kernels.deep_grid, 1, args[0].shape[0], args[2].num_kv_heads)[1]
    _check_decode(args, 1e-2, backend="cuda", num_splits=-(-kernels.deep_grid_blocks // rows))
    _check_decode(args, 1e-2, backend="cuda", num_splits=4)
    assert launched == [kernels.deep_grid, kernels.regular]


def test_auto_picks_cuda_where_it_applies_and_triton_elsewhere():
    args = _decode_problem("fp8-token/nvfp4")
    assert paged_decode_cuda.supports(args[2], args[0].shape[1], args[0])
    bf = _decode_problem("bf16/nvfp4")
    assert not paged_decode_cuda.supports(bf[2], bf[0].shape[1], bf[0])
    with pytest.raises(ValueError, match="does not cover"):
        paged_decode_attention(*bf, backend="cuda")
    out_auto = paged_decode_attention(*args)
    out_cuda = paged_decode_attention(*args, backend="cuda")
    assert torch.equal(out_auto, out_cuda)
    ref = paged_decode_reference(*args)
    out_triton = paged_decode_attention(*args, backend="triton")
    assert rel_err(out_triton, ref) < 1e-2


def test_cuda_decode_in_a_cuda_graph(variant):
    """Serving loops capture decode in a graph: the ctypes launch must capture and replay."""
    args = _decode_problem("fp8-token/nvfp4", num_pages=(300, 41), tail_len=(7, 16))
    out = torch.full_like(args[0], float("nan"))
    paged_decode_attention(*args, out=out, backend="cuda")
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(*args, out=out, backend="cuda", num_splits=4)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, paged_decode_reference(*args)) < 1e-2


@pytest.mark.parametrize("name", ["fp8-token/nvfp4", "fp8-tensor"])
def test_cuda_decode_in_plain_stream_order(name, monkeypatch):
    """The reduce kernel launched after the split kernel in plain stream order (no programmatic
    dependent launch), the path taken before sm_90."""
    monkeypatch.setattr(paged_decode_cuda, "DEPENDENT_LAUNCH", False)
    _check_decode(_decode_problem(name), 1e-2, backend="cuda")
