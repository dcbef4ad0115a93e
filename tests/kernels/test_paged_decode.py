"""paged_decode_attention (Triton, interpreter) against paged_decode_reference."""
import pytest
import torch

from kvwire.kernels._common import interpreting

from .helpers import ALL_UNIFORM, MIXED, check_decode, make_format, make_pool

pytestmark = pytest.mark.skipif(not interpreting(), reason="interpreter tests (TRITON_INTERPRET=1, set without CUDA)")


def build(name, gqa=4, heads=2, head_dim=64, page_size=16, num_pages=(5, 0, 11), tail_len=(1, 16, 7),
          q_dtype=torch.float32, seed=0, pool_pages=40, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    f = make_format(name, page_size=page_size, layers=2, heads=heads, head_dim=head_dim)
    storage, static = make_pool(f, pool_pages, gen, device)
    b = len(num_pages)
    width = max(max(num_pages), 1) + 2
    pt = torch.full((b, width), -1, dtype=torch.int32)          # unused entries are never read
    for i, n in enumerate(num_pages):
        pt[i, :n] = torch.randperm(pool_pages, generator=gen)[:n].int()
    slots = b + 2
    tail = torch.randn((slots, 2, 2, heads, page_size, head_dim), generator=gen).to(torch.bfloat16)
    tail_slot = torch.randperm(slots, generator=gen)[:b].int()
    q = torch.randn((b, gqa * heads, head_dim), generator=gen).to(q_dtype)
    args = (q.to(device), storage, f, 1, pt.to(device), torch.tensor(num_pages, dtype=torch.int32, device=device),
            tail.to(device), tail_slot.to(device), torch.tensor(tail_len, dtype=torch.int32, device=device), static)
    return args


@pytest.mark.parametrize("name", ALL_UNIFORM + MIXED)
def test_formats(name):
    check_decode(build(name), 1e-4)


@pytest.mark.parametrize("gqa", [1, 3, 8])
def test_gqa_ratios(gqa):
    check_decode(build("fp8-token/nvfp4", gqa=gqa, seed=gqa), 1e-4)


def test_head_dim_128_bf16_q_and_splits():
    # bf16 in and out: the output rounding dominates the error
    args = build("nvfp4", head_dim=128, q_dtype=torch.bfloat16, num_pages=(7, 3), tail_len=(5, 16))
    check_decode(args, 1e-2, num_splits=3, block_n=32)        # 3 splits: some short, one empty for row 1


@pytest.mark.parametrize("name", ["nvfp4", "fp8-token/nvfp4", "nvfp4/bf16"])
def test_small_heads_with_nvfp4(name):
    # head_dim 16: the NVFP4 half tiles are padded to 16 columns (tl.dot's least K on the GPU)
    check_decode(build(name, head_dim=16, gqa=2), 1e-4)


def test_odd_contexts_partial_tail_many_splits():
    args = build("fp8-page/fp8-token", page_size=8, num_pages=(9, 1, 4, 2), tail_len=(3, 8, 1, 5))
    check_decode(args, 1e-4, num_splits=5, block_n=16)        # tiles straddle pages (P=8 < 16)


@pytest.mark.parametrize("name", ["fp8-token/nvfp4", "bf16/fp8-tensor"])
def test_packed_heads_kernel(name):
    check_decode(build(name, gqa=3), 1e-4, packed=True)
    check_decode(build(name, gqa=4, heads=4, seed=5), 1e-4, packed=True)


def test_page_ids_past_65536_and_offsets_past_2_31():
    # a pool > 2**31 bytes (lazily allocated) and pages > 65,536: int64 addressing throughout
    f = make_format("fp8-token/nvfp4", heads=2, head_dim=64)
    n_pool = (2**31) // f.page_bytes + 1000
    gen = torch.Generator().manual_seed(3)
    used = torch.tensor([70_000, n_pool - 1, n_pool - 500, 123, 65_537, n_pool - 2])
    storage, static = make_pool(f, n_pool, gen, fill_pages=used, empty=True)
    assert storage.numel() > 2**31
    pt = used.view(2, 3).int()
    tail = torch.randn((2, 2, 2, 2, 16, 64), generator=gen).to(torch.bfloat16)
    args = (torch.randn((2, 8, 64), generator=gen), storage, f, 1, pt, torch.tensor([3, 3], dtype=torch.int32),
            tail, torch.tensor([1, 0], dtype=torch.int32), torch.tensor([16, 2], dtype=torch.int32), static)
    check_decode(args, 1e-4)
