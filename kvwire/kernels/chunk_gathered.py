"""Chunk attention with the prefix gathered to bf16 and handed to a FlashAttention-class kernel.

``paged_chunk_attention`` reads compact pages directly and dequantises each tile in registers.
That is what decode needs, but a chunk of hundreds of queries after a long prefix is
compute-bound, and there the paged Triton kernel reached 0.40-0.66x of bf16 SDPA on an H200
(docs/benchmarks.md, "Chunk attention"). This path splits the same computation in two:

1. the *prefix*: stored pages ``0 .. open_start/P - 1``, which every query sees in full (a
   query's own position lies in the open region). ``page_gather.gather_pages`` decodes them to
   contiguous bf16 (one read of the compact pages, one bf16 write), and one unmasked attention
   kernel of torch's (``PrefixBackend``) returns their output and log-sum-exp;
2. the *chunk region*: the stored pages from ``open_start`` on and the open tokens, with the
   page-causal rule, by ``paged_chunk_attention`` on those pages alone (positions shifted by whole
   pages, which that rule does not see), which merges (1) in as more partials.

The result is ``paged_chunk_reference``'s; only the prefix's rounding differs (its keys and values
in bf16 rather than in the kernel's fp16 tiles). GQA needs nothing from the backend: the group's
query heads become rows of one KV head (queries x group), so each call is plain multi-head
attention over H heads. The gathered prefix is [2, H, T, D] bf16; a longer prefix than
``GATHER_MAX_BYTES`` holds goes in pieces, each one gather and one attention, whose partials merge
by log-sum-exp (so a 128k-token prefix never needs its whole bf16 copy at once).

cuDNN gives each 128-row tile of (query, head) rows one CTA and never splits the keys, so a narrow
chunk leaves SMs idle. ``key_splits`` S cuts each piece into S equal runs of keys and makes every
(KV head, run) a head of its own: [H, T, D] viewed as [H * S, T / S, D] is the same memory, the
query rows are repeated S times, and the grid is S times larger. Each run's (output, log-sum-exp)
is one more partial of ``paged_chunk_attention``, whose merge kernel combines them with its own, so
no torch-side merge runs (nor between pieces). The prefix is shortened to a multiple of S pages; the
pages left over go to ``paged_chunk_attention`` with the chunk's own.
"""
from __future__ import annotations

import enum
import logging

import torch

from kvwire.formats import PageFormat
from kvwire.kernels._common import use_triton
from kvwire.kernels.chunk_attention import paged_chunk_attention
from kvwire.kernels.chunk_plan import prefix_key_splits
from kvwire.kernels.page_gather import gather_pages


class PrefixBackend(enum.Enum):
    """Which of torch's attention kernels runs the gathered prefix (each returns its log-sum-exp)."""

    CUDNN = "cudnn"            # cuDNN's fused attention (Hopper: FlashAttention-3-class)
    FLASH = "flash"            # torch's FlashAttention-2
    EFFICIENT = "efficient"    # torch's memory-efficient (CUTLASS) kernel


DEFAULT_BACKEND = PrefixBackend.CUDNN
GATHER_MAX_BYTES = 256 << 20    # the bf16 prefix of one piece: 64k tokens at H = 8, D = 128

log = logging.getLogger(__name__)
# (device, backend, head_dim) whose prefix kernel refused a call (a torch build or GPU without it):
# such calls take the paged kernel from then on, with one warning
_REFUSED: set[tuple[str, PrefixBackend, int]] = set()


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: PrefixBackend = DEFAULT_BACKEND,
                     key_splits: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of q [N, Hq, D] over k, v [H, T, D] (bf16) in ``key_splits`` S equal runs
    of keys (S dividing T; module docstring): (out [S, N, Hq, D] bf16, lse [S, N, Hq] fp32), one
    partial per run, each normalised over its own keys.

    lse is the natural-log sum of exp(q.k / sqrt(D)) over the run's keys. On the CPU (tests) torch's
    CPU flash kernel runs, whatever ``backend`` says."""
    n, hq, d = q.shape
    h, t = k.shape[0], k.shape[1]
    if key_splits < 1 or t % key_splits:
        raise ValueError(f"key_splits must be a positive divisor of the {t} keys, got {key_splits}")
    g, s = hq // h, key_splits
    rows = q.to(torch.bfloat16).view(n, h, g, d).permute(1, 0, 2, 3).reshape(1, h, n * g, d)
    if s > 1:
        rows = rows.repeat_interleave(s, dim=1)
    kk, vv = k.reshape(1, h * s, t // s, d), v.reshape(1, h * s, t // s, d)
    ops = torch.ops.aten
    if not q.is_cuda:
        o, lse = ops._scaled_dot_product_flash_attention_for_cpu(rows, kk, vv)
    elif backend is PrefixBackend.CUDNN:
        o, lse = ops._scaled_dot_product_cudnn_attention(rows, kk, vv, None, True)[:2]
    elif backend is PrefixBackend.FLASH:
        o, lse = ops._scaled_dot_product_flash_attention(rows, kk, vv)[:2]
    else:
        o, lse = ops._scaled_dot_product_efficient_attention(rows, kk, vv, None, True)[:2]
    lse = lse.reshape(h, s, -1)[..., : n * g]          # the efficient kernel pads its rows
    out = o.reshape(h, s, n, g, d).permute(1, 2, 0, 3, 4).reshape(s, n, hq, d)
    return out, lse.reshape(h, s, n, g).permute(1, 2, 0, 3).reshape(s, n, hq).float()


def gathered_chunk_attention(q: torch.Tensor, q_pos: torch.Tensor, storage: torch.Tensor, page_format: PageFormat,
                             layer: int, page_ids: torch.Tensor, k_open: torch.Tensor, v_open: torch.Tensor,
                             open_start: int, static_scales: torch.Tensor | None = None,
                             out: torch.Tensor | None = None, *, backend: PrefixBackend = DEFAULT_BACKEND,
                             key_splits: int | None = None, fallback: bool = True) -> torch.Tensor:
    """``paged_chunk_attention``'s arguments and result, the prefix through ``gather_pages`` and
    ``prefix_attention`` (module docstring). Every query's position must be >= ``open_start``.

    Without a prefix, without the Triton kernel, or where the backend refused before, this is
    ``paged_chunk_attention`` over everything. ``key_splits``: runs of the prefix's keys (default:
    ``chunk_plan.prefix_key_splits``). fallback=False (benchmarks): a refusal raises."""
    p = page_format.page_size
    if open_start % p:
        raise ValueError("open_start must be a multiple of the page size")
    if key_splits is not None and key_splits < 1:
        raise ValueError(f"key_splits must be at least 1, got {key_splits}")
    lead = min(open_start // p, page_ids.numel())
    splits = key_splits or prefix_key_splits(q.shape[0], q.shape[1], lead * p, page_format, storage.device)
    lead -= lead % splits
    key = (str(storage.device), backend, page_format.head_dim)
    partial = None
    if lead and q.shape[0] and use_triton(storage) and key not in _REFUSED:
        try:
            partial = _prefix_partial(q, storage, page_format, layer, page_ids[:lead], static_scales, backend,
                                      splits)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as exc:     # refused before it ran (unsupported here): nothing half written
            if not fallback:
                raise
            log.warning("chunk attention: torch's %s attention refused the gathered prefix on %s (%s); such "
                        "calls take the paged kernel from now on", backend.value, key[0], str(exc)[:200])
            _REFUSED.add(key)
    if partial is None:
        return paged_chunk_attention(q, q_pos, storage, page_format, layer, page_ids, k_open, v_open, open_start,
                                     static_scales, out)
    shift = lead * p
    return paged_chunk_attention(q, q_pos - shift, storage, page_format, layer, page_ids[lead:], k_open, v_open,
                                 open_start - shift, static_scales, out, num_splits=1, prefix_partial=partial)


def _prefix_partial(q: torch.Tensor, storage: torch.Tensor, f: PageFormat, layer: int, prefix_ids: torch.Tensor,
                    static_scales: torch.Tensor | None, backend: PrefixBackend,
                    splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partials (out [K, N, Hq, D], lse [K, N, Hq]) of q over the pages ``prefix_ids`` (a multiple of
    ``splits`` pages): gathered in pieces of at most GATHER_MAX_BYTES, each a multiple of ``splits``
    pages, its keys in that many runs; K = pieces x runs."""
    step = max(1, GATHER_MAX_BYTES // (2 * f.num_kv_heads * f.page_size * f.head_dim * 2))    # pages per piece
    step = max(splits, step - step % splits)
    pieces = []
    for first in range(0, prefix_ids.numel(), step):
        kv = gather_pages(storage, f, layer, prefix_ids[first:first + step], static_scales)
        pieces.append(prefix_attention(q, kv[0], kv[1], backend, splits))
        del kv          # the next piece's gather may reuse its memory
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat([o for o, _ in pieces]), torch.cat([lse for _, lse in pieces])
