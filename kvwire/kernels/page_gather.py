"""Gather a sequence's stored pages into contiguous bf16 K/V: compact pages in, ``[2, H, T, D]`` out.

Why: a chunk of hundreds of queries after a long prefix is compute-bound, and there a
FlashAttention-class kernel over bf16 (cuDNN's on Hopper) does the arithmetic faster than the
paged chunk kernel can while it dequantises tiles. Decoding the prefix once per layer costs one
read of the compact pages and one bf16 write (about a tenth of the attention at 32k tokens), so
``chunk_gathered`` pays it and hands the prefix to such a kernel. Decode never does this: a
single query per head is memory-bound, and a bf16 copy would triple what it reads.

One program per (BN tokens, KV head), one launch per part (keys, values): each token's page
comes from ``page_ids[t // P]``, its bytes are decoded by ``tile_loads.load_kv_tile`` (the
decoders the attention kernels use) and multiplied by the token's scale (and the static scale
of fp8 tensor/head formats) in fp32, then rounded once to bf16. The torch reference is
``read_pages_reference`` rounded to bf16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvwire.formats import PageFormat
from kvwire.kernels._common import (
    check_storage, elem_code, gran_code, interpreting, part_offsets, pow2, read_pages_reference, rounded,
    static_arg, use_triton,
)
from kvwire.kernels.tile_loads import load_kv_tile

GATHER_TOKENS = 64     # tokens per program: 4 pages of 16, 16 KB of bf16 out per part at D = 128


@triton.jit
def _gather_kernel(st8, st16, st32, ids_ptr, static_ptr, out_ptr, n_tokens, page_bytes, static_off,
                   data_off, s_off, bs_off, gs_off,
                   H: tl.constexpr, P: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BN: tl.constexpr,
                   ELEM: tl.constexpr, GRAN: tl.constexpr, HW: tl.constexpr):
    h = tl.program_id(1)
    t = tl.program_id(0) * BN + tl.arange(0, BN)
    valid = t < n_tokens
    page = tl.load(ids_ptr + t // P, mask=valid, other=0).to(tl.int64)
    tile, cs = load_kv_tile(st8, st16, st32, page * page_bytes, t % P, valid, h, data_off, s_off, bs_off, gs_off,
                            ELEM, GRAN, P, D, BLOCK_D, BN, HW, True)
    x = tile.to(tl.float32) * cs[:, None]
    if GRAN == 3:      # fp8 tensor/head: one static scale per (layer, part, head)
        x = x * tl.load(static_ptr + static_off + h)
    if not HW:     # the interpreter's bf16 cast truncates; round to nearest even first, as the GPU's does
        x = rounded(x, tl.bfloat16)
    d = tl.arange(0, BLOCK_D)
    offs = (h * n_tokens + t).to(tl.int64)[:, None] * D + d[None, :]
    tl.store(out_ptr + offs, x.to(tl.bfloat16), mask=valid[:, None] & (d < D)[None, :])


def gather_pages(storage: torch.Tensor, page_format: PageFormat, layer: int, page_ids: torch.Tensor,
                 static_scales: torch.Tensor | None = None, out: torch.Tensor | None = None, *,
                 _hw: bool | None = None) -> torch.Tensor:
    """Keys and values of ``page_ids`` (positions 0 .. n*P-1) in layer ``layer``, decoded to bf16.

    Returns ``out`` [2, H, n*P, D] bf16 (part, KV head, token, dim): each part a [H, T, D] block
    that attention kernels take as [1, H, T, D]. static_scales [L, 2, H] for fp8 tensor/head.
    ``_hw`` (tests): the GPU's code path regardless of where the tensors are."""
    f = page_format
    check_storage(storage, f)
    n_tok = page_ids.numel() * f.page_size
    shape = (2, f.num_kv_heads, n_tok, f.head_dim)
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=storage.device)
    elif tuple(out.shape) != shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 {shape}, got {out.dtype} {tuple(out.shape)}")
    if n_tok == 0:
        return out
    if not use_triton(storage):
        return gather_pages_reference(storage, f, layer, page_ids, static_scales, out)
    hw = (not interpreting()) if _hw is None else _hw
    static = static_arg(f, static_scales, storage.device)
    ids = page_ids.to(device=storage.device, dtype=torch.int64)
    st16 = storage.view(torch.bfloat16) if hw else storage.view(torch.int16)
    grid = (triton.cdiv(n_tok, GATHER_TOKENS), f.num_kv_heads)
    for part in (0, 1):
        fmt = f.part_format(part)
        _gather_kernel[grid](storage, st16, storage.view(torch.float32), ids, static, out[part], n_tok,
                             f.page_bytes, (layer * 2 + part) * f.num_kv_heads, *part_offsets(f, layer, part),
                             H=f.num_kv_heads, P=f.page_size, D=f.head_dim, BLOCK_D=pow2(f.head_dim),
                             BN=GATHER_TOKENS, ELEM=elem_code(fmt), GRAN=gran_code(fmt), HW=hw, num_warps=4)
    return out


def gather_pages_reference(storage: torch.Tensor, page_format: PageFormat, layer: int, page_ids: torch.Tensor,
                           static_scales: torch.Tensor | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """``gather_pages`` by the torch decoders (``kvwire.quant.dequantize_pages``), rounded to bf16."""
    parts = [read_pages_reference(storage, page_format, layer, part, page_ids, static_scales)
             .to(torch.bfloat16).permute(1, 0, 2) for part in (0, 1)]
    res = torch.stack(parts).to(storage.device)
    if out is None:
        return res.contiguous()
    out.copy_(res)
    return out


def benchmark(page_format: PageFormat, num_tokens: int = 32768, device: str = "cuda") -> dict:
    """Median time of ``gather_pages`` for ``num_tokens`` random tokens in random pages of a
    one-layer pool, with the bytes it reads (the compact pages) and writes (bf16)."""
    from kvwire.bench.chunk import stored_pages
    from kvwire.bench.attention import time_graph

    f = page_format
    if f.num_layers != 1:
        raise ValueError("benchmark a one-layer page format")
    gen = torch.Generator(device=device).manual_seed(0)
    kv = [torch.randn((num_tokens, f.num_kv_heads, f.head_dim), device=device, generator=gen).to(torch.bfloat16)
          for _ in (0, 1)]
    storage, ids, static = stored_pages(f, kv[0], kv[1], gen)
    out = torch.empty((2, f.num_kv_heads, num_tokens, f.head_dim), dtype=torch.bfloat16, device=device)
    ms = time_graph([lambda: gather_pages(storage, f, 0, ids, static, out)])
    read = ids.numel() * f.page_bytes
    return {"format": f.kv.name, "tokens": num_tokens, "ms": ms, "bytes_read": read, "bytes_written": out.numel() * 2,
            "tb_per_s": (read + out.numel() * 2) / ms / 1e9}
