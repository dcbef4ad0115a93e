"""paged_chunk_attention (Triton, interpreter) against attend_paged_reference over decoded pages."""
import pytest
import torch

from kvwire.kernels._common import interpreting
from kvwire.kernels.chunk_attention import paged_chunk_attention, paged_chunk_reference

from .helpers import make_format, make_pool, rel_err

pytestmark = pytest.mark.skipif(not interpreting(), reason="interpreter tests (TRITON_INTERPRET=1, set without CUDA)")


def run_case(name, gqa=4, heads=2, head_dim=64, page_size=16, n_pages=5, open_start=48, open_len=37,
             q_index=None, q_dtype=torch.float32, seed=0, tol=1e-4, device="cpu", num_splits=None):
    gen = torch.Generator().manual_seed(seed)
    f = make_format(name, page_size=page_size, layers=2, heads=heads, head_dim=head_dim)
    storage, static = make_pool(f, 24, gen, device)
    ids = torch.randperm(24, generator=gen)[:n_pages].to(device)
    ko = torch.randn((open_len, heads, head_dim), generator=gen).to(torch.bfloat16).to(device)
    vo = torch.randn((open_len, heads, head_dim), generator=gen).to(torch.bfloat16).to(device)
    pos = torch.arange(open_start, open_start + open_len)
    if q_index is not None:
        pos = pos[q_index]
    pos = pos.to(device)
    q = torch.randn((len(pos), gqa * heads, head_dim), generator=gen).to(q_dtype).to(device)
    out = torch.full_like(q, float("nan"))
    paged_chunk_attention(q, pos, storage, f, 1, ids, ko, vo, open_start, static, out=out, num_splits=num_splits)
    ref = paged_chunk_reference(q, pos, storage, f, 1, ids, ko, vo, open_start, static)
    assert not out.isnan().any(), "an output was left unwritten"
    err = rel_err(out, ref)
    assert err < tol, f"relative error {err:.2e}"


@pytest.mark.parametrize("name", ["bf16", "fp8-token", "fp8-tensor", "fp8-page", "nvfp4", "fp8-token/nvfp4",
                                  "nvfp4/fp8-head"])
def test_formats_prefix_hit(name):
    # 3 stored pages (a prefix-cache hit), then a 37-token chunk spanning three open pages
    run_case(name, n_pages=3, open_start=48, open_len=37)


@pytest.mark.parametrize("gqa", [1, 3, 8])
def test_gqa_ratios(gqa):
    run_case("fp8-token/nvfp4", gqa=gqa, seed=gqa)


def test_runner_layout_pages_overlap_open_region():
    # as the runner calls it: the chunk's own full pages are already stored (page_ids covers
    # positions past open_start) and must not be read for queries on those pages
    run_case("nvfp4", n_pages=5, open_start=32, open_len=45, head_dim=128, q_dtype=torch.bfloat16, tol=1e-2)


def test_cold_start_and_unsorted_queries():
    run_case("fp8-token", n_pages=0, open_start=0, open_len=40)
    run_case("fp8-head/nvfp4", gqa=1, heads=6, n_pages=4, open_start=32, open_len=30,
             q_index=torch.tensor([29, 3, 17, 0]))


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_split_prefix_merges_to_the_same_result(splits):
    # the stored prefix in `splits` ranges plus the open tokens as one more partial, merged by
    # log-sum-exp; 7 splits of 5 pages leave some ranges empty (their partials must not count)
    run_case("fp8-token/nvfp4", n_pages=5, open_start=80, open_len=21, seed=10 + splits, num_splits=splits)


def test_split_with_pages_past_the_open_start():
    # the runner's layout: stored pages overlap the open region, so late splits hold pages that
    # only some query blocks may see
    run_case("fp8-tensor", n_pages=5, open_start=32, open_len=45, head_dim=128, q_dtype=torch.bfloat16,
             tol=1e-2, num_splits=3)


def test_split_count_must_be_positive():
    with pytest.raises(ValueError, match="num_splits"):
        run_case("bf16", n_pages=1, open_start=16, open_len=3, num_splits=0)


@pytest.mark.parametrize("name", ["fp8-token", "fp8-page/nvfp4"])
def test_value_scales_spread_over_decades(name):
    # pages 1e-3 to 1e3 in magnitude: the kernels keep per-token value scales relative to a running
    # reference (f16 range on the GPU), which must move (and rescale the accumulator) both ways
    from kvwire.kernels.quantize import write_pages_reference

    from .helpers import make_format, make_pool, random_kv
    gen = torch.Generator().manual_seed(5)
    f = make_format(name, page_size=16, layers=2, heads=2, head_dim=64)
    storage, static = make_pool(f, 12, gen)
    ids = torch.arange(12)
    # per 64-token tile (4 pages): ~1e-3, ~1e3, ~1e-1, so the reference moves up, then down
    factor = torch.tensor([1e-3, 1e-3, 2e-3, 1e-3, 1e3, 5e2, 1e3, 1e2, 1e-1, 1e-1, 5e-2, 1e-1])
    for part in (0, 1):
        x = random_kv((12, 16, 2, 64), gen) * factor[:, None, None, None] * (0.05 if part == 0 else 1.0)
        write_pages_reference(storage, f, 1, part, ids, x, static[1, part])
    ko = torch.randn((20, 2, 64), generator=gen).to(torch.bfloat16)
    vo = torch.randn((20, 2, 64), generator=gen).to(torch.bfloat16)
    pos = torch.arange(12 * 16, 12 * 16 + 20)
    q = torch.randn((20, 8, 64), generator=gen)
    for splits in (1, 3):
        out = torch.full_like(q, float("nan"))
        paged_chunk_attention(q, pos, storage, f, 1, ids, ko, vo, 12 * 16, static, out=out, num_splits=splits)
        ref = paged_chunk_reference(q, pos, storage, f, 1, ids, ko, vo, 12 * 16, static)
        assert not out.isnan().any()
        assert rel_err(out, ref) < 1e-4, f"splits={splits}: relative error {rel_err(out, ref):.2e}"


def test_tile_and_split_policy_for_a_gpu_of_132_sms(monkeypatch):
    """The launcher's tile and split choice as on the H200 (132 SMs), without a GPU: compact pages
    take the 4-warp tile that fits twice per SM and split short chunks to fill both; bf16 pages the
    8-warp tile, one program per SM."""
    from kvwire.kernels import chunk_plan as ca

    monkeypatch.setattr(ca, "interpreting", lambda: False)
    monkeypatch.setattr(ca, "num_sms", lambda device: 132)
    gpu = torch.device("cuda")
    compact, bf16 = make_format("fp8-token/nvfp4", heads=8, head_dim=128), make_format("bf16", heads=8, head_dim=128)
    assert ca.default_tile(compact, gpu) == ca.COMPACT_TILE and ca.default_tile(bf16, gpu) == ca.CHUNK_TILE
    assert ca.default_tile(compact, torch.device("cpu")) == ca.CHUNK_TILE
    pages_32k = 2048
    # 64 queries x 4 heads: 4 blocks of 64 rows x 8 KV heads = 32 programs; 2 x 132 // 32 = 8 splits
    assert ca.planned_splits(64, 32, compact, pages_32k, gpu) == 8
    # the 128-row tile: 16 programs, one per SM -> 8 splits
    assert ca.planned_splits(64, 32, bf16, pages_32k, gpu) == 8
    # 512 queries fill the GPU (256 compact programs): one pass
    assert ca.planned_splits(512, 32, compact, pages_32k, gpu) == 1
    # a short prefix: splits of at least MIN_SPLIT_TOKENS
    assert ca.planned_splits(64, 32, compact, 130, gpu) == 130 * 16 // ca.MIN_SPLIT_TOKENS
    assert not ca.fp8_tensor_cores(torch.device("cpu"))


class SmallSharedMemory:
    """The chunk kernel as a GPU with little shared memory would run it: a launch whose tile has
    more than ``max_keys`` keys or more than one stage raises Triton's OutOfResources (as its
    launcher does before the kernel runs); others run. A stand-in: the interpreter never runs out."""

    def __init__(self, kernel, max_keys: int) -> None:
        self.kernel, self.max_keys, self.refused = kernel, max_keys, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            tile = (kw["BN"], kw["num_stages"])
            if kw["BN"] > self.max_keys or kw["num_stages"] > 1:
                from triton.runtime.errors import OutOfResources
                self.refused.append(tile)
                raise OutOfResources(200 * 1024, 99 * 1024, "shared memory")
            return self.kernel[grid](*args, **kw)
        return launch


def test_a_tile_too_big_for_the_gpu_steps_down_and_is_remembered(monkeypatch, caplog):
    from kvwire.kernels import chunk_attention, chunk_plan
    monkeypatch.setattr(chunk_plan, "_FITTED", {})
    monkeypatch.setattr(chunk_attention, "INTERPRETER_TILE", (32, 64, 4, 2))
    small = SmallSharedMemory(chunk_attention._chunk_kernel, max_keys=32)
    monkeypatch.setattr(chunk_attention, "_chunk_kernel", small)
    run_case("fp8-token/nvfp4", n_pages=5, open_start=80, open_len=21, seed=3)
    assert small.refused == [(64, 2), (64, 1)], "stages first, then keys per tile"
    assert "needs more shared memory than this GPU has" in caplog.text
    assert list(chunk_plan._FITTED.values()) == [(32, 32, 4, 1)]
    small.refused.clear()
    run_case("fp8-token/nvfp4", n_pages=5, open_start=80, open_len=21, seed=4)
    assert small.refused == [], "the second call starts at the tile that fitted"


def test_an_explicit_tile_that_does_not_fit_is_an_error(monkeypatch):
    from triton.runtime.errors import OutOfResources

    from kvwire.kernels import chunk_attention, chunk_plan
    monkeypatch.setattr(chunk_plan, "_FITTED", {})
    monkeypatch.setattr(chunk_attention, "_chunk_kernel", SmallSharedMemory(chunk_attention._chunk_kernel, 32))
    gen = torch.Generator().manual_seed(0)
    f = make_format("nvfp4", page_size=16, layers=2, heads=2, head_dim=64)
    storage, static = make_pool(f, 4, gen, "cpu")
    q = torch.randn((3, 4, 64), generator=gen)
    kv = torch.randn((3, 2, 64), generator=gen).to(torch.bfloat16)
    with pytest.raises(OutOfResources):
        paged_chunk_attention(q, torch.arange(32, 35), storage, f, 1, torch.arange(2), kv, kv, 32, static,
                              block_n=64)


def test_smaller_tiles_end_at_the_smallest():
    from kvwire.kernels.chunk_plan import COMPACT_TILE, smaller_tile
    tiles = [COMPACT_TILE]
    while (t := smaller_tile(tiles[-1])) is not None:
        tiles.append(t)
    assert tiles == [(64, 128, 4, 2), (64, 128, 4, 1), (64, 64, 4, 1), (64, 32, 4, 1), (32, 32, 4, 1),
                     (16, 32, 4, 1)]

