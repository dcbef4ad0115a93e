"""The read bandwidth a decode kernel's floor is measured against, in the same run.

Issue 3 defines a kernel's floor as its compact bytes over "the read bandwidth measured in the same
run". A device-to-device copy (``attention.copy_bandwidth``) is not that: it reads and writes, and
on the H200 it moves 4.26-4.28 TB/s while bf16 SDPA alone reads 4.5-4.66 TB/s, so a floor taken
from the copy is up to 9% too easy (bf16 pages reached "104% of the floor"). The read bandwidth
here is therefore the fastest read measured in the run, of two kinds:

- a read pass: ``tile_maxima`` reads a 4 GiB fp32 buffer once (one 16 KB tile per program, one
  maximum written per tile: 1/4096 of the bytes read) and nothing else;
- bf16 SDPA at each shape the run measured: its contiguous K and V bytes over its time.

Taking the maximum keeps the floor honest when one of them falls short (SDPA at 1x32k does not
fill the chip; a reduction may not reach the peak either). ``attention.add_read_floor`` takes it
and adds each row's ``read_floor_ms`` and ``of_read_floor``, which the floor target judges;
``floor_ms`` / ``of_floor`` against the copy rate stay in the JSON as before. (This module imports
triton; the bench imports it only when it runs, so that importing the bench for its tables does
not decide Triton's interpreter mode for the kernel tests.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 4096                    # fp32 elements per program: 16 KB


@triton.jit
def _tile_max_kernel(x_ptr, out_ptr, TILE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * TILE + tl.arange(0, TILE)
    tl.store(out_ptr + pid, tl.max(tl.load(x_ptr + offs), axis=0))


def tile_maxima(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Maximum of each TILE-element tile of the contiguous fp32 ``x`` (numel a multiple of TILE)."""
    if x.dtype != torch.float32 or not x.is_contiguous() or x.numel() % TILE:
        raise ValueError(f"tile_maxima needs a contiguous fp32 tensor of a multiple of {TILE} elements, "
                         f"got {x.dtype} {tuple(x.shape)}")
    n = x.numel() // TILE
    if out is None:
        out = torch.empty(n, dtype=torch.float32, device=x.device)
    _tile_max_kernel[(n,)](x, out, TILE=TILE, num_warps=8)
    return out


def tile_maxima_reference(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1, TILE).amax(dim=1)


def read_pass(nbytes: int = 4 << 30, device: str = "cuda") -> dict:
    """Time ``tile_maxima`` over ``nbytes`` of fp32: {"bytes", "ms", "tb_per_s"} (bytes read only)."""
    from triton.testing import do_bench
    x = torch.empty(nbytes // 4 // TILE * TILE, dtype=torch.float32, device=device).normal_()
    out = torch.empty(x.numel() // TILE, dtype=torch.float32, device=device)
    ms = float(do_bench(lambda: tile_maxima(x, out), warmup=10, rep=100, return_mode="median"))
    read = x.numel() * 4
    del x, out
    torch.cuda.empty_cache()
    return {"bytes": read, "ms": ms, "tb_per_s": read / ms / 1e9}

