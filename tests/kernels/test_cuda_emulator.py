"""The CUDA kernels (decode split, quantise-on-write) on the CPU, in the warp emulator, against the
torch reference: the GPU tests' checks (test_gpu_cuda_decode.py, test_gpu_cuda_quantize.py) at
smaller sizes, so that a change to a kernel's logic is caught without a GPU.

The emulator (kvwire/kernels/cuda_emulator.py) compiles each kernel's source with g++ and runs
every CUDA thread as a fiber; its stand-ins for the PTX primitives (conversions, f16 arithmetic,
mma.sync, shuffles, mbarriers and bulk copies) are a model of the hardware. So these tests check
what the kernels compute, not the hardware's rounding of approximate instructions; the exhaustive
division check and timing stay GPU-only.
"""
import ctypes

import pytest
import torch

from kvwire.kernels import cuda_emulator, paged_decode_cuda, quantize_cuda
from kvwire.kernels._common import interpreting
from kvwire.kernels.quantize import write_pages, write_pages_reference
from kvwire.quant import NonFiniteInputError

from .helpers import (
    DECODE_VARIANT_IDS, DECODE_VARIANTS, check_decode, check_quantize_bit_identical,
    decode_problem, magnitude_problem, make_format, random_kv,
)

pytestmark = pytest.mark.skipif(not interpreting() or not cuda_emulator.available(),
                                reason="the emulator runs where the Triton interpreter does (CPU), with g++ on x86-64")
DEV = "cpu"
SMALL = {"num_pages": (40, 7, 0, 13), "tail_len": (16, 3, 1, 9)}
COMPACT = ("fp8-tensor", "fp8-head", "fp8-page", "fp8-token", "nvfp4", "fp8-token/nvfp4", "nvfp4/fp8-token",
           "fp8-tensor/nvfp4", "fp8-head/fp8-page", "fp8-page/fp8-token")


@pytest.mark.parametrize("name", COMPACT)
def test_emulated_decode_formats(name):
    check_decode(decode_problem(DEV, name, **SMALL), 1e-2, backend="cuda")


@pytest.mark.parametrize("tuning", DECODE_VARIANTS, ids=DECODE_VARIANT_IDS)
@pytest.mark.parametrize("name", ["fp8-token", "nvfp4"])
def test_emulated_decode_variants(name, tuning, monkeypatch):
    """Every code path of the split kernel (register rings, shared-memory rings filled by bulk copies
    on mbarriers, whole-page blocks), fp32 q, three splits."""
    monkeypatch.setattr(paged_decode_cuda, "TUNING", dict(tuning))
    check_decode(decode_problem(DEV, name, q_dtype=torch.float32, **SMALL), 4e-3, backend="cuda", num_splits=3)


@pytest.mark.parametrize("name", ["fp8-token", "fp8-page", "fp8-token/nvfp4", "nvfp4"])
@pytest.mark.parametrize("page_size,splits", [(32, None), (64, None), (64, 3), (32, 1)])
def test_emulated_decode_pages_of_two_and_four_tiles(name, page_size, splits):
    """Pages of 32 and 64 tokens, whose 16-token tiles the block's warps share (PT): every tile's
    rows, token and block scales, and per-page scales at the right offsets, for any split count."""
    args = decode_problem(DEV, name, page_size=page_size, num_pages=(23, 5, 0, 9), tail_len=(page_size, 3, 1, 17),
                          gqa=3, head_dim=64, heads=4, seed=page_size)
    assert paged_decode_cuda.reads_page_size(args[2])
    check_decode(args, 1e-2, backend="cuda", num_splits=splits)


def test_pages_of_other_sizes_or_on_other_paths_stay_on_triton(monkeypatch):
    """48 tokens (3 tiles) is not read; nor are multi-tile pages through the staged ring."""
    assert not paged_decode_cuda.reads_page_size(make_format("nvfp4", page_size=48, layers=1, heads=2, head_dim=64))
    two_tiles = make_format("fp8-token", page_size=32, layers=1, heads=2, head_dim=64)
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {"STAGES": 2})
    assert not paged_decode_cuda.reads_page_size(two_tiles)
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {})
    assert paged_decode_cuda.reads_page_size(two_tiles) and paged_decode_cuda.deep_grid_stages(two_tiles) == 0


@pytest.mark.parametrize("name", ["fp8-token/nvfp4", "nvfp4/fp8-tensor"])
@pytest.mark.parametrize("gqa,head_dim", [(1, 128), (3, 64), (4, 64), (8, 128), (3, 128)])
def test_emulated_decode_gqa_and_head_dim(name, gqa, head_dim):
    check_decode(decode_problem(DEV, name, gqa=gqa, head_dim=head_dim, heads=4, **SMALL), 1e-2, backend="cuda")


@pytest.mark.parametrize("seed", range(6))
def test_emulated_decode_random_shapes(seed, monkeypatch):
    """Shapes the fixed tests do not pick: any GQA ratio 1-8, 1-8 KV heads, sequences of 0-33 pages
    with any tail, a random code path and split count (a different draw per seed)."""
    import random
    rng = random.Random(seed)
    name = rng.choice(COMPACT)
    batch = rng.randint(1, 4)
    monkeypatch.setattr(paged_decode_cuda, "TUNING", dict(rng.choice(DECODE_VARIANTS)))
    args = decode_problem(DEV, name, gqa=rng.randint(1, 8), heads=rng.choice([1, 2, 3, 5, 6, 8]),
                          head_dim=rng.choice([64, 128]), num_pages=tuple(rng.randint(0, 33) for _ in range(batch)),
                          tail_len=tuple(rng.randint(1, 16) for _ in range(batch)), q_dtype=torch.float32, seed=seed)
    check_decode(args, 4e-3, backend="cuda", num_splits=rng.choice([None, 1, 2, 5, 40]))


@pytest.mark.parametrize("splits", [None, 1, 13, 64])
def test_emulated_decode_any_split_count(splits):
    """The default split policy (an emulated 132-SM GPU), more splits than a sequence has pages, and
    blocks whose warps get no page at all."""
    check_decode(decode_problem(DEV, "fp8-token/nvfp4", q_dtype=torch.float32, **SMALL), 4e-3, backend="cuda",
                 num_splits=splits)


@pytest.mark.parametrize("name", ["fp8-token", "nvfp4", "fp8-token/nvfp4"])
def test_emulated_decode_value_scales_far_apart(name):
    """Pages whose V magnitudes differ by up to 2^28: the kernel's value reference must rescale."""
    gen = torch.Generator().manual_seed(3)
    page_mag = torch.exp2(torch.randint(-14, 15, (60, 1, 1, 1), generator=gen).float())
    check_decode(magnitude_problem(DEV, name, 3, 60, 1.0, page_mag, 0.01, [30, 20], [5, 16]), 4e-3, backend="cuda")


@pytest.mark.parametrize("name", ["fp8-tensor", "nvfp4"])
def test_emulated_decode_scores_rising_along_the_sequence(name):
    """Key magnitudes growing 30x along the sequence: the lazy running max moves under and over its
    threshold, and P must stay inside f16 either way."""
    ramp = torch.linspace(0.2, 6.0, 80).view(80, 1, 1, 1)
    check_decode(magnitude_problem(DEV, name, 5, 80, ramp, 1.0, 0.05, [40, 33], [3, 16]), 4e-3, backend="cuda")


def test_emulated_decode_page_ids_past_65536_and_offsets_past_2_31():
    f = make_format("fp8-token/nvfp4", heads=8, head_dim=128)
    n_pool = max((2**31) // f.page_bytes + 5000, 70_100)
    gen = torch.Generator().manual_seed(1)
    used = torch.tensor([70_000, n_pool - 1, n_pool - 500, 123, 65_537, n_pool - 2])
    storage = torch.empty((n_pool, f.page_bytes), dtype=torch.uint8)      # > 2 GiB, untouched but for 6 pages
    for part in (0, 1):
        write_pages_reference(storage, f, 1, part, used, random_kv((6, 16, 8, 128), gen))
    tail = torch.randn((2, 2, 2, 8, 16, 128), generator=gen).to(torch.bfloat16)
    i32 = {"dtype": torch.int32}
    args = (torch.randn((2, 32, 128), generator=gen), storage, f, 1, used.view(2, 3).int(), torch.tensor([3, 3], **i32),
            tail, torch.tensor([1, 0], **i32), torch.tensor([16, 2], **i32), None)
    check_decode(args, 4e-3, backend="cuda")


def test_emulated_decode_deep_grid_takes_the_staged_ring(monkeypatch):
    """fp8-token pages on a grid of DEEP_GRID_WAVES waves or more run the staged kernel."""
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {})
    args = decode_problem(DEV, "fp8-token", num_pages=(20, 7), tail_len=(16, 3))
    kernels = paged_decode_cuda.select("cuda", args[2], args[0].shape[1], args[0], True)
    assert kernels.deep_grid is not None and kernels.deep_grid.defines["STAGES"] > 0
    launched = []
    pick = paged_decode_cuda.DecodeKernels.for_launch
    monkeypatch.setattr(paged_decode_cuda.DecodeKernels, "for_launch",
                        lambda self, *a: launched.append(pick(self, *a)) or launched[-1])
    rows = paged_decode_cuda.grid(kernels.deep_grid, 1, args[0].shape[0], args[2].num_kv_heads)[1]
    check_decode(args, 1e-2, backend="cuda", num_splits=-(-kernels.deep_grid_blocks // rows))
    check_decode(args, 1e-2, backend="cuda", num_splits=4)
    assert launched == [kernels.deep_grid, kernels.regular]


@pytest.mark.parametrize("name", ["fp8-tensor", "fp8-page", "fp8-token", "nvfp4"])
@pytest.mark.parametrize("heads,head_dim,page_size", [(3, 64, 16), (2, 128, 32), (2, 128, 4)])
def test_emulated_quantize_bit_identical(name, heads, head_dim, page_size):
    check_quantize_bit_identical(DEV, name, heads, head_dim, page_size, n=12, pool=20)


@pytest.mark.parametrize("tuning", [{"NOCLAMP": 0, "AMAX2": 0}, {"NOCLAMP": 1, "AMAX2": 0}, {"NOCLAMP": 0, "AMAX2": 1},
                                    {"CPL": 4}, {"E2M1MIN": 0}, {"E2M1MIN": 1, "NOCLAMP": 0}],
                         ids=["clamped", "no-clamp", "packed-amax", "4-chunks", "exponent-e2m1", "min-e2m1-clamped"])
def test_emulated_quantize_nvfp4_variants_bit_identical(tuning, monkeypatch):
    monkeypatch.setattr(quantize_cuda, "TUNING", dict(tuning))
    check_quantize_bit_identical(DEV, "nvfp4", 2, 128, 16, n=12, pool=20)


@pytest.mark.parametrize("name", ["fp8-tensor", "fp8-page", "fp8-token", "nvfp4"])
@pytest.mark.parametrize("variant", [{"HFAST": 0}, {"LDL1": 0}], ids=["pages-fastest-grid", "loads-not-through-l1"])
def test_emulated_quantize_other_grid_and_loads_bit_identical(name, variant, monkeypatch):
    """HFAST=0 (the two-dimensional grid, pages fastest; the default has the head fastest) and
    LDL1=0 (input loads not allocated in L1)."""
    monkeypatch.setattr(quantize_cuda, "TUNING", dict(variant))
    check_quantize_bit_identical(DEV, name, 3, 64, 16, n=12, pool=20)


def test_emulated_quantize_counts_non_finite():
    f = make_format("nvfp4", heads=2, head_dim=128)
    storage = torch.zeros((8, f.page_bytes), dtype=torch.uint8)
    x = torch.randn((4, 16, 2, 128)).to(torch.bfloat16)
    x[2, 3, 1, 5] = float("nan")
    x[0, 0, 0, 0] = float("inf")
    x[3, 15, 1, 127] = -float("inf")
    with pytest.raises(NonFiniteInputError, match="3 non-finite"):
        write_pages(storage, f, 0, 0, torch.arange(4), x, backend="cuda")


_DEADLOCK = r"""
#include "ptx_common.cuh"
extern "C" __global__ void wait_forever(int* out) {
    if (threadIdx.x == 5) warp_sync();           // waits for lanes that wait for it at the block barrier
    else block_sync();
    out[threadIdx.x] = 1;
}
"""


def test_a_deadlocked_kernel_fails_with_an_error_not_a_hang():
    kern = cuda_emulator.load_emulated("deadlock_test.cu", "wait_forever", {}, {"deadlock_test.cu": _DEADLOCK})
    out = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="deadlock"):
        kern.launch((1, 1, 1), (64, 1, 1), [ctypes.c_void_p(out.data_ptr())])


def test_inline_ptx_lives_only_in_the_primitives_headers():
    """The emulator swaps the primitives headers for its twins and compiles everything else as it is:
    inline PTX anywhere else would not build (or would be skipped), so keep it out."""
    from kvwire.kernels.nvrtc import CUDA_SOURCE_DIR
    twins = {p.name for p in cuda_emulator.EMULATOR_DIR.glob("*.cuh")}
    assert twins == {"ptx_common.cuh", "fragment_ops.cuh", "bulk_copy.cuh", "float_ops.cuh"}
    assert twins <= {p.name for p in CUDA_SOURCE_DIR.glob("*.cuh")}
    for path in sorted(CUDA_SOURCE_DIR.glob("*.cu*")):
        if path.name not in twins:
            assert "asm(" not in path.read_text() and "asm volatile" not in path.read_text(), path.name
