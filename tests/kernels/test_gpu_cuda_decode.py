"""The CUDA (NVRTC) decode split kernel against the torch reference, on a GPU at real sizes.

Skipped without CUDA. On the CPU, test_cuda_emulator.py runs the same kernel in the warp emulator
(kvwire/kernels/cuda_emulator.py) at smaller sizes.
"""
import pytest
import torch

from kvwire.kernels import paged_decode_cuda
from kvwire.kernels.paged_decode import paged_decode_attention, paged_decode_reference
from kvwire.kernels.quantize import write_pages_reference

from .helpers import (
    DECODE_VARIANT_IDS, DECODE_VARIANTS, check_decode, decode_problem, magnitude_problem,
    make_format, random_kv, rel_err,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = "cuda"


@pytest.fixture(params=DECODE_VARIANTS, ids=DECODE_VARIANT_IDS)
def variant(request, monkeypatch):
    """The shipped tuning, then the other code paths (helpers.DECODE_VARIANTS)."""
    tuning = dict(paged_decode_cuda.TUNING)
    tuning.update(request.param)
    monkeypatch.setattr(paged_decode_cuda, "TUNING", tuning)
    return request.param


COMPACT = ("fp8-tensor", "fp8-head", "fp8-page", "fp8-token", "nvfp4", "fp8-token/nvfp4", "nvfp4/fp8-token",
           "fp8-tensor/nvfp4", "fp8-head/fp8-page", "fp8-page/fp8-token")


@pytest.mark.parametrize("name", COMPACT)
def test_cuda_decode_formats(name, variant):
    check_decode(decode_problem(DEV, name), 1e-2, backend="cuda")


@pytest.mark.parametrize("name", ["fp8-token", "nvfp4", "fp8-token/nvfp4", "fp8-tensor"])
@pytest.mark.parametrize("gqa,head_dim", [(1, 128), (3, 64), (4, 64), (8, 128), (3, 128)])
def test_cuda_decode_gqa_and_head_dim(name, gqa, head_dim, variant):
    check_decode(decode_problem(DEV, name, gqa=gqa, head_dim=head_dim, heads=4), 1e-2, backend="cuda")


@pytest.mark.parametrize("name", ["fp8-token", "fp8-page", "nvfp4", "fp8-token/nvfp4", "fp8-tensor/nvfp4"])
@pytest.mark.parametrize("page_size", [32, 64])
@pytest.mark.parametrize("gqa,head_dim", [(4, 128), (3, 64), (8, 128)])
def test_cuda_decode_pages_of_several_tiles(name, page_size, gqa, head_dim):
    """Pages of 2 and 4 tiles (PT), whose tiles the block's warps share, at real sizes."""
    args = decode_problem(DEV, name, gqa=gqa, head_dim=head_dim, page_size=page_size,
                          num_pages=(150, 37, 0, 63), tail_len=(page_size, 3, 1, 33), seed=page_size)
    check_decode(args, 1e-2, backend="cuda")


@pytest.mark.parametrize("name", ["fp8-token/nvfp4", "nvfp4", "fp8-tensor", "fp8-page"])
def test_cuda_decode_fp32_q_tight(name, variant):
    check_decode(decode_problem(DEV, name, q_dtype=torch.float32), 4e-3, backend="cuda")


@pytest.mark.parametrize("splits", [1, 3, 13, 64])
def test_cuda_decode_any_split_count(splits, variant):
    """More splits than some sequences have pages, and blocks whose warps get no page at all."""
    check_decode(decode_problem(DEV, "fp8-token/nvfp4", q_dtype=torch.float32), 4e-3, backend="cuda",
                  num_splits=splits)


@pytest.mark.parametrize("name", ["fp8-token", "fp8-page", "nvfp4", "fp8-token/nvfp4"])
def test_cuda_decode_value_scales_far_apart(name, variant):
    """Pages whose K/V magnitudes differ by up to 2^28: the kernel's value reference must rescale."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    page_mag = torch.exp2(torch.randint(-14, 15, (300, 1, 1, 1), device=DEV, generator=gen).float())
    check_decode(magnitude_problem(DEV, name, 3, 300, 1.0, page_mag, 0.01, [150, 100], [5, 16]), 4e-3, backend="cuda")


@pytest.mark.parametrize("name", ["fp8-tensor", "fp8-token", "nvfp4", "fp8-token/nvfp4"])
def test_cuda_decode_scores_rising_along_the_sequence(name, variant):
    """Key magnitudes growing 30x along the sequence: the running max moves in steps both under and
    over the kernel's lazy-rescale threshold, and P must stay inside f16 either way."""
    ramp = torch.linspace(0.2, 6.0, 400, device=DEV).view(400, 1, 1, 1)
    check_decode(magnitude_problem(DEV, name, 5, 400, ramp, 1.0, 0.05, [200, 193], [3, 16]), 4e-3, backend="cuda")


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
    check_decode(args, 4e-3, backend="cuda")


def test_cuda_decode_refuses_misaligned_storage():
    """Pages are read with 16-byte loads (and bulk copies): a storage view 8 bytes off gets a clear error."""
    args = list(decode_problem(DEV, "fp8-token"))
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
    args = decode_problem(DEV, "fp8-token")
    kernels = paged_decode_cuda.select("cuda", args[2], args[0].shape[1], args[0], True)
    assert kernels.deep_grid is not None and kernels.deep_grid.defines["STAGES"] > 0
    launched = []
    pick = paged_decode_cuda.DecodeKernels.for_launch

    def spy(self, *launch):
        launched.append(pick(self, *launch))
        return launched[-1]

    monkeypatch.setattr(paged_decode_cuda.DecodeKernels, "for_launch", spy)
    rows = paged_decode_cuda.grid(kernels.deep_grid, 1, args[0].shape[0], args[2].num_kv_heads)[1]
    check_decode(args, 1e-2, backend="cuda", num_splits=-(-kernels.deep_grid_blocks // rows))
    check_decode(args, 1e-2, backend="cuda", num_splits=4)
    assert launched == [kernels.deep_grid, kernels.regular]


def test_auto_picks_cuda_where_it_applies_and_triton_elsewhere():
    args = decode_problem(DEV, "fp8-token/nvfp4")
    assert paged_decode_cuda.supports(args[2], args[0].shape[1], args[0])
    bf = decode_problem(DEV, "bf16/nvfp4")
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
    args = decode_problem(DEV, "fp8-token/nvfp4", num_pages=(300, 41), tail_len=(7, 16))
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
    check_decode(decode_problem(DEV, name), 1e-2, backend="cuda")
