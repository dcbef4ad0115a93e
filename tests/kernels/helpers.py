"""Shared builders and checks for the kernel tests (random, non-zero, scattered pages), used by the
CPU tests and the GPU ones alike (each takes the device)."""
from __future__ import annotations

import torch

from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels.paged_decode import paged_decode_attention, paged_decode_reference
from kvwire.kernels.quantize import write_pages, write_pages_reference

ALL_UNIFORM = ("bf16", "fp8-tensor", "fp8-head", "fp8-page", "fp8-token", "nvfp4")
MIXED = ("fp8-token/nvfp4", "nvfp4/fp8-token", "bf16/nvfp4", "fp8-tensor/nvfp4", "fp8-head/fp8-page",
         "nvfp4/bf16")

# Code paths of the CUDA decode split kernel (paged_decode_cuda.TUNING overrides), for the GPU tests
# and the emulated ones: the shipped tuning, register rings of 2 and 3 pages, the L2 prefetch, the
# exact running max, q in registers, fp8-token scales by one load each, pages loaded straight into
# registers, shared-memory page rings of 1 and 2 slots, blocks of one KV head, and whole-page blocks
# (a warp per KV head) from registers, through a block ring of 2 slots, of 3 slots for 2 heads (a
# 4-head fp8 ring of 3 exceeds 48 KB of static shared memory), and with 8 warps and q in registers
# (for 4 KV heads: blocks of 4 heads); and, for up to 4 query heads per KV head, the score MMA's
# columns all used (EVENCOLS=0: heads in columns 0..G-1 instead of the even ones); and FP8 keys
# (D = 128) loaded in fragment order, half lines per load (KLINES=0), instead of whole lines.
DECODE_VARIANTS = [{}, {"DEPTH": 2, "MINB": 1}, {"DEPTH": 3, "MINB": 1}, {"PREF": 2}, {"LAZYMAX": 0},
                   {"QSMEM": 0, "MINB": 4}, {"SCALESHFL": 0}, {"STAGES": 0}, {"STAGES": 1}, {"STAGES": 2},
                   {"WHOLEPAGE": 0, "STAGES": 0}, {"WHOLEPAGE": 1, "STAGES": 0}, {"WHOLEPAGE": 1, "STAGES": 2},
                   {"WHOLEPAGE": 1, "STAGES": 3, "REFILL_LAG": 2, "NW": 2},
                   {"WHOLEPAGE": 1, "NW": 8, "MINB": 2, "QSMEM": 0}, {"EVENCOLS": 0}, {"KLINES": 0}]
DECODE_VARIANT_IDS = ["default", "depth-2", "depth-3", "l2-prefetch", "exact-max", "q-in-registers", "scale-loads",
                      "registers", "staged-1", "staged-2", "head-blocks", "whole-pages", "whole-pages-staged-2",
                      "whole-pages-2-staged-3-lag-2", "whole-pages-8-warps",
                      "all-columns", "half-line-keys"]


def make_format(name: str, page_size=16, layers=2, heads=2, head_dim=64) -> PageFormat:
    return PageFormat(KVFormat.parse(name), page_size, layers, heads, head_dim)


def random_kv(shape, gen, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Random values with per-token magnitudes spread over a few decades (never all zero)."""
    x = torch.randn(shape, generator=gen, device=device)
    mag = torch.exp(torch.empty(shape[:-1] + (1,), device=device).uniform_(-3, 2, generator=gen))
    return (x * mag).to(dtype)


def make_pool(f: PageFormat, num_pages: int, gen, device="cpu", fill_pages=None, empty=False):
    """A pool with random garbage bytes, pages ``fill_pages`` (default all) quantised from random K/V.

    Returns (storage, static_scales [L, 2, H])."""
    if empty:
        storage = torch.empty((num_pages, f.page_bytes), dtype=torch.uint8, device=device)
    else:
        storage = torch.randint(0, 256, (num_pages, f.page_bytes), dtype=torch.uint8, generator=gen,
                                device="cpu").to(device)
    static = (torch.rand((f.num_layers, 2, f.num_kv_heads), generator=gen, device=device) + 0.05) * 0.02
    ids = torch.arange(num_pages) if fill_pages is None else torch.as_tensor(fill_pages)
    for layer in range(f.num_layers):
        for part in (0, 1):
            x = random_kv((len(ids), f.page_size, f.num_kv_heads, f.head_dim), gen, device)
            write_pages_reference(storage, f, layer, part, ids.to(device), x, static[layer, part])
    return storage, static


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def decode_problem(device, name, gqa=4, heads=8, head_dim=128, num_pages=(600, 37, 0, 251), tail_len=(16, 3, 1, 9),
                   q_dtype=torch.bfloat16, seed=0, page_size=16):
    """Decode arguments for ``paged_decode_attention``: sequences of ``num_pages`` scattered pages
    (one empty), bf16 tails of ``tail_len`` tokens, q of ``gqa`` heads per KV head."""
    gen = torch.Generator(device=device).manual_seed(seed)
    f = make_format(name, page_size=page_size, layers=2, heads=heads, head_dim=head_dim)
    pool = sum(num_pages) + 64
    storage, static = make_pool(f, pool, gen, device, empty=True)
    b = len(num_pages)
    pt = torch.zeros((b, max(num_pages) + 3), dtype=torch.int32, device=device)
    perm = torch.randperm(pool, device=device, generator=gen).int()
    o = 0
    for i, n in enumerate(num_pages):
        pt[i, :n] = perm[o:o + n]
        o += n
    tail = torch.randn((b + 1, 2, 2, heads, page_size, head_dim), device=device, generator=gen).to(torch.bfloat16)
    q = torch.randn((b, gqa * heads, head_dim), device=device, generator=gen).to(q_dtype)
    i32 = {"dtype": torch.int32, "device": device}
    return (q, storage, f, 1, pt, torch.tensor(num_pages, **i32), tail, torch.arange(b, **i32) + 1,
            torch.tensor(tail_len, **i32), static)


def check_decode(args, tol, **launch):
    """``paged_decode_attention`` (into a NaN-poisoned output) against the torch reference."""
    q = args[0]
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(*args, out=out, **launch)
    ref = paged_decode_reference(*args)
    assert not out.isnan().any(), "an output was left unwritten"
    err = rel_err(out, ref)
    print(f"rel err {err:.2e}")
    assert err < tol, f"relative error {err:.2e}"


def magnitude_problem(device, name, seed, n, key_mag, value_mag, static_scale, num_pages, tail_len):
    """Two sequences over ``n`` random pages whose K (V) values are multiplied per page by ``key_mag``
    (``value_mag``), tensors of shape [n, 1, 1, 1] or 1.0."""
    gen = torch.Generator(device=device).manual_seed(seed)
    f = make_format(name, page_size=16, layers=1, heads=4, head_dim=128)
    storage = torch.empty((n + 8, f.page_bytes), dtype=torch.uint8, device=device)
    static = torch.full((1, 2, 4), static_scale, device=device)
    ids = torch.randperm(n + 8, device=device, generator=gen)[:n]
    for part, mag in ((0, key_mag), (1, value_mag)):
        write_pages_reference(storage, f, 0, part, ids, random_kv((n, 16, 4, 128), gen, device) * mag, static[0, part])
    q = torch.randn((2, 16, 128), device=device, generator=gen)
    tail = torch.randn((2, 1, 2, 4, 16, 128), device=device, generator=gen).to(torch.bfloat16)
    i32 = {"dtype": torch.int32, "device": device}
    return (q, storage, f, 0, ids.view(2, n // 2).int(), torch.tensor(num_pages, **i32), tail,
            torch.tensor([0, 1], **i32), torch.tensor(tail_len, **i32), static)


def special_pages(x: torch.Tensor, name: str, gen: torch.Generator) -> None:
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
        # Page 6 likewise, one bf16 step either side of each E2M1 midpoint: a rounding decided
        # by a strict comparison where the tie goes the other way.
        m = mids[:7].to(torch.bfloat16)
        near = torch.cat((torch.nextafter(m, m + 1), torch.nextafter(m, m - 1))).float()
        x[6] = near[torch.arange(p * h * d) % len(near)].reshape(p, h, d) * blocks * sign
        for i in (4, 6):
            x[i, :, :, ::16] = 6.0 * blocks[::16]        # each block's amax: 6 x a power of two
            x[i, 0, :, 0] = 2688.0                          # page amax: global scale 1
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


def check_quantize_bit_identical(device, name, heads, head_dim, page_size, n=300, pool=512):
    """``write_pages(backend="cuda")`` on random and ``special_pages`` K/V against the torch reference, bytewise."""
    gen = torch.Generator().manual_seed(heads * 7 + head_dim + page_size)
    f = make_format(name, page_size=page_size, layers=2, heads=heads, head_dim=head_dim)
    storage = torch.randint(0, 256, (pool, f.page_bytes), dtype=torch.uint8, generator=gen)
    expect = storage.clone()
    storage = storage.to(device)
    ids = torch.randperm(pool, generator=gen)[:n]
    static = torch.rand((2, heads), generator=gen) * 0.01 + 0.001
    static[1, 0] = 1e-12                                 # far below the data: saturates, |x/s| > 2^60
    for part in (0, 1):
        x = random_kv((n, page_size, heads, head_dim), gen)
        special_pages(x, name, gen)
        x = x.to(torch.bfloat16)
        write_pages(storage, f, 1, part, ids.to(device), x.to(device), static[part].to(device), backend="cuda")
        write_pages_reference(expect, f, 1, part, ids, x, static[part])
    diff = int((storage.cpu() != expect).sum())
    assert diff == 0, f"{diff} bytes differ from the CPU reference"
