"""Shared builders for the kernel tests (random, non-zero, scattered pages)."""
from __future__ import annotations

import torch

from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels.quantize import write_pages_reference

ALL_UNIFORM = ("bf16", "fp8-tensor", "fp8-head", "fp8-page", "fp8-token", "nvfp4")
MIXED = ("fp8-token/nvfp4", "nvfp4/fp8-token", "bf16/nvfp4", "fp8-tensor/nvfp4", "fp8-head/fp8-page",
         "nvfp4/bf16")


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
