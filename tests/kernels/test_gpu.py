"""The same checks on a GPU at real sizes (compiled kernels, hardware conversions)."""
import pytest
import torch

from kvwire.kernels.chunk_attention import paged_chunk_attention, paged_chunk_reference
from kvwire.kernels.quantize import write_pages, write_pages_reference

from .helpers import ALL_UNIFORM, MIXED, check_decode, decode_problem, make_format, make_pool, random_kv, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = "cuda"


@pytest.mark.parametrize("name", ALL_UNIFORM)
@pytest.mark.parametrize("hw", [True, False], ids=["hw-cast", "bit-ops"])
def test_quantize_bit_identical_to_cpu_reference(name, hw):
    gen = torch.Generator().manual_seed(0)
    f = make_format(name, page_size=16, layers=2, heads=8, head_dim=128)
    n, pool = 300, 512
    storage = torch.randint(0, 256, (pool, f.page_bytes), dtype=torch.uint8, generator=gen)
    expect = storage.clone()
    storage = storage.to(DEV)
    ids = torch.randperm(pool, generator=gen)[:n]
    static = torch.rand((2, 8), generator=gen) * 0.01 + 0.001
    for part, dtype in ((0, torch.bfloat16), (1, torch.float32)):
        x = random_kv((n, 16, 8, 128), gen).to(dtype)
        x[0] = 0
        x[1] *= 1e-7
        write_pages(storage, f, 1, part, ids.to(DEV), x.to(DEV), static[part].to(DEV), _hw_cast=hw)
        write_pages_reference(expect, f, 1, part, ids, x, static[part])
    diff = int((storage.cpu() != expect).sum())
    assert diff == 0, f"{diff} bytes differ from the CPU reference"


def test_quantize_nvfp4_block_scales_with_the_hardware_cast():
    """Diagnostic: the hardware fp32 -> E4M3 cast for NVFP4 block scales (the shipped kernel uses
    the bit-op encoder for them, which matches). Reports what differs; xfails if anything does."""
    gen = torch.Generator().manual_seed(0)
    f = make_format("nvfp4", page_size=16, layers=1, heads=8, head_dim=128)
    n = 300
    storage = torch.zeros((n, f.page_bytes), dtype=torch.uint8)
    expect = storage.clone()
    storage = storage.to(DEV)
    x = random_kv((n, 16, 8, 128), gen)
    ids = torch.arange(n)
    write_pages(storage, f, 0, 0, ids.to(DEV), x.to(DEV), _hw_block_scale=True)
    write_pages_reference(expect, f, 0, 0, ids, x)
    got = storage.cpu()
    msgs = []
    for name in ("data", "block_scale", "global_scale"):
        from kvwire.kernels._common import section_view
        a, b = section_view(got, f, 0, 0, name), section_view(expect, f, 0, 0, name)
        bad = (a.view(torch.uint8) != b.view(torch.uint8)).reshape(n, -1).any(dim=1)
        if bad.any():
            i = int(bad.nonzero()[0])
            diff = (a[i].view(torch.uint8) != b[i].view(torch.uint8)).nonzero()[:4].tolist()
            msgs.append(f"{name}: {int(bad.sum())} pages differ, page {i} at {diff}: "
                        f"{[int(a[i].view(torch.uint8)[tuple(t)]) for t in diff]} vs "
                        f"{[int(b[i].view(torch.uint8)[tuple(t)]) for t in diff]}")
    print("\n".join(msgs) or "hardware cast matches")
    if msgs:
        pytest.xfail("; ".join(msgs))


def test_quantize_non_finite_raises():
    from kvwire.quant import NonFiniteInputError
    f = make_format("fp8-token", heads=8, head_dim=128)
    storage = torch.zeros((8, f.page_bytes), dtype=torch.uint8, device=DEV)
    x = torch.randn((4, 16, 8, 128), device=DEV)
    x[2, 3, 4, 5] = float("nan")
    with pytest.raises(NonFiniteInputError):
        write_pages(storage, f, 0, 0, torch.arange(4, device=DEV), x)


@pytest.mark.parametrize("backend", ["triton", "auto"])
@pytest.mark.parametrize("name", ALL_UNIFORM + MIXED)
def test_decode_formats(name, backend):
    check_decode(decode_problem(DEV, name), 1e-2, backend=backend)


@pytest.mark.parametrize("name,gqa,head_dim", [("fp8-token/nvfp4", 1, 128), ("fp8-token/nvfp4", 8, 128),
                                               ("nvfp4", 8, 64), ("fp8-token", 3, 64), ("bf16", 4, 64),
                                               ("nvfp4", 2, 16), ("fp8-token/nvfp4", 4, 16)])
def test_decode_gqa_and_head_dim(name, gqa, head_dim):
    check_decode(decode_problem(DEV, name, gqa=gqa, head_dim=head_dim, heads=4), 1e-2, backend="triton")


@pytest.mark.parametrize("name", ["fp8-token/nvfp4", "nvfp4", "fp8-tensor"])
def test_decode_fp32_q_tight(name):
    check_decode(decode_problem(DEV, name, q_dtype=torch.float32), 4e-3, backend="triton")


@pytest.mark.parametrize("launch", [{"_hw": False}, {"nvfp4_asm": False}, {"num_splits": 7, "block_n": 64},
                                    {"v_fp8_asm": False}, {"packed": True}, {"packed": True, "_hw": False}],
                         ids=["bit-ops-path", "no-asm", "splits", "fp8-v-cast", "packed", "packed-bit-ops"])
def test_decode_variants(launch):
    check_decode(decode_problem(DEV, "fp8-token/nvfp4", q_dtype=torch.float32), 4e-3 if "_hw" not in launch else 1e-4,
                  backend="triton", **launch)


@pytest.mark.parametrize("name", ["bf16", "fp8-tensor", "fp8-token", "nvfp4"])
def test_decode_packed_kernel(name):
    check_decode(decode_problem(DEV, name), 1e-2, packed=True)


def test_decode_page_ids_past_65536_and_offsets_past_2_31():
    f = make_format("fp8-token/nvfp4", heads=8, head_dim=128)
    n_pool = max((2**31) // f.page_bytes + 5000, 70_100)       # > 2**31 bytes and > 65,536 pages
    gen = torch.Generator(device=DEV).manual_seed(1)
    used = torch.tensor([70_000, n_pool - 1, n_pool - 500, 123, 65_537, n_pool - 2], device=DEV)
    assert n_pool * f.page_bytes > 2**31 and int(used.max()) < n_pool
    storage, static = make_pool(f, n_pool, gen, DEV, fill_pages=used, empty=True)
    tail = torch.randn((2, 2, 2, 8, 16, 128), device=DEV, generator=gen).to(torch.bfloat16)
    args = (torch.randn((2, 32, 128), device=DEV, generator=gen), storage, f, 1, used.view(2, 3).int(),
            torch.tensor([3, 3], dtype=torch.int32, device=DEV), tail, torch.tensor([1, 0], dtype=torch.int32, device=DEV),
            torch.tensor([16, 2], dtype=torch.int32, device=DEV), static)
    check_decode(args, 4e-3, backend="triton")


CHUNK_TILES = {"default": {}, "64x32x4": {"rows": 64, "block_n": 32, "num_warps": 4, "num_stages": 2},
               "128x128x8": {"rows": 128, "block_n": 128, "num_warps": 8, "num_stages": 2},
               "fp16-keys": {"fp8_dot": False},
               "128x64x8s3": {"rows": 128, "block_n": 64, "num_warps": 8, "num_stages": 3}}


@pytest.mark.parametrize("name", ["bf16", "fp8-token", "fp8-tensor", "nvfp4", "fp8-token/nvfp4"])
@pytest.mark.parametrize("splits", [1, 5, None], ids=["one-pass", "5-splits", "default-splits"])
@pytest.mark.parametrize("tile", list(CHUNK_TILES))
@pytest.mark.parametrize("n", [300, 40])
def test_chunk_attention(name, splits, tile, n):
    # 300 pages of prefix, then an n-token chunk (its pages stored too, as the runner does); the
    # 40-token chunk leaves SMs idle, so the default splits the prefix
    gen = torch.Generator(device=DEV).manual_seed(0)
    f = make_format(name, page_size=16, layers=2, heads=8, head_dim=128)
    storage, static = make_pool(f, 400, gen, DEV, empty=True)
    ids = torch.randperm(400, device=DEV, generator=gen)[:330]
    open_start = 300 * 16
    ko = torch.randn((n, 8, 128), device=DEV, generator=gen).to(torch.bfloat16)
    vo = torch.randn((n, 8, 128), device=DEV, generator=gen).to(torch.bfloat16)
    pos = torch.arange(open_start, open_start + n, device=DEV)
    q = torch.randn((n, 32, 128), device=DEV, generator=gen).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    paged_chunk_attention(q, pos, storage, f, 1, ids, ko, vo, open_start, static, out=out, num_splits=splits,
                          **CHUNK_TILES[tile])
    ref = paged_chunk_reference(q, pos, storage, f, 1, ids, ko, vo, open_start, static)
    assert not out.isnan().any()
    err = rel_err(out, ref)
    print(f"rel err {err:.2e}")
    assert err < 1e-2


@pytest.mark.parametrize("name", ["fp8-token", "fp8-tensor", "fp8-token/nvfp4", "nvfp4", "bf16"])
@pytest.mark.parametrize("head_dim", [16, 32, 64])
def test_chunk_attention_small_heads(name, head_dim):
    """Heads under 128 (the E4M3 key dot needs a reduction of 32 or more: 16 takes the fp16 path)."""
    gen = torch.Generator(device=DEV).manual_seed(4)
    f = make_format(name, page_size=16, layers=2, heads=2, head_dim=head_dim)
    storage, static = make_pool(f, 80, gen, DEV, empty=True)
    ids = torch.randperm(80, device=DEV, generator=gen)[:72]      # 64 prefix pages + the chunk's 7
    n, open_start = 100, 64 * 16
    ko = torch.randn((n, 2, head_dim), device=DEV, generator=gen).to(torch.bfloat16)
    vo = torch.randn((n, 2, head_dim), device=DEV, generator=gen).to(torch.bfloat16)
    pos = torch.arange(open_start, open_start + n, device=DEV)
    q = torch.randn((n, 4, head_dim), device=DEV, generator=gen).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    paged_chunk_attention(q, pos, storage, f, 1, ids, ko, vo, open_start, static, out=out)
    ref = paged_chunk_reference(q, pos, storage, f, 1, ids, ko, vo, open_start, static)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("name", ["fp8-token", "fp8-page/nvfp4", "nvfp4"])
def test_chunk_attention_scales_spread_over_decades(name):
    # K/V pages from 1e-3 to 1e3 in magnitude, in runs of 8 pages (one 128-token tile): the kernel's
    # f16 tiles hold per-token scales relative to the tile's (keys) or a running reference (values)
    gen = torch.Generator(device=DEV).manual_seed(3)
    f = make_format(name, page_size=16, layers=2, heads=8, head_dim=128)
    n_pages = 48
    storage, static = make_pool(f, n_pages, gen, DEV, empty=True)
    ids = torch.arange(n_pages, device=DEV)
    factor = torch.tensor([1e-3, 1e3, 1e-1, 1e2, 1e-2, 1.0], device=DEV).repeat_interleave(8)
    for part in (0, 1):
        x = random_kv((n_pages, 16, 8, 128), gen, DEV) * factor[:, None, None, None] * (0.05 if part == 0 else 1.0)
        write_pages_reference(storage, f, 1, part, ids, x, static[1, part])
    n, open_start = 40, n_pages * 16
    ko = torch.randn((n, 8, 128), device=DEV, generator=gen).to(torch.bfloat16)
    vo = torch.randn((n, 8, 128), device=DEV, generator=gen).to(torch.bfloat16)
    pos = torch.arange(open_start, open_start + n, device=DEV)
    q = torch.randn((n, 32, 128), device=DEV, generator=gen).to(torch.bfloat16)
    ref = paged_chunk_reference(q, pos, storage, f, 1, ids, ko, vo, open_start, static)
    for splits in (1, 3):
        out = torch.full_like(q, float("nan"))
        paged_chunk_attention(q, pos, storage, f, 1, ids, ko, vo, open_start, static, out=out, num_splits=splits)
        assert not out.isnan().any() and not out.isinf().any()
        assert rel_err(out, ref) < 1e-2, f"splits={splits}: relative error {rel_err(out, ref):.2e}"
