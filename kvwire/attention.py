"""Attention over compact pages: the torch reference (the CPU path and the kernels' oracle).

Page-causal precision rule, the same for prefill chunks and decode steps: a query at position p
sees every key in a *full page before its own page* as stored (quantised, then decoded), and the
keys of *its own page* up to p in bf16 (that page is, or was when p was written, the open tail).
Because what a token sees never depends on how the prompt was chunked or which pages came from
the prefix cache, a prefix-cache hit computes the same thing as a cold run.
"""
from __future__ import annotations

import math

import torch


def attend_paged_reference(q: torch.Tensor, q_pos: torch.Tensor,
                           k_pages: torch.Tensor, v_pages: torch.Tensor,
                           k_open: torch.Tensor, v_open: torch.Tensor,
                           open_start: int, page_size: int) -> torch.Tensor:
    """GQA attention of one sequence's queries over its pages plus its open (bf16) tokens.

    q: [N, Hq, D] at positions ``q_pos`` [N]; k_pages/v_pages: [Lp, H, D] decoded pages covering
    positions 0..Lp-1 (Lp a multiple of page_size); k_open/v_open: [Lo, H, D] bf16-precision
    tokens at positions open_start..open_start+Lo-1 (open_start a multiple of page_size).
    Softmax and accumulation in fp32; returns [N, Hq, D] in q's dtype.
    """
    n, hq, d = q.shape
    h = k_open.shape[1] if k_open.numel() else k_pages.shape[1]
    if hq % h:
        raise ValueError(f"{hq} query heads are not a multiple of {h} KV heads")
    if open_start % page_size or k_pages.shape[0] % page_size:
        raise ValueError("pages and the open region must start on page boundaries")
    g = hq // h
    qf = q.float().reshape(n, h, g, d) * (1.0 / math.sqrt(d))
    q_page = (q_pos // page_size)[:, None]

    dev = q.device
    pos_p = torch.arange(k_pages.shape[0], device=dev)
    mask_p = (pos_p[None, :] // page_size) < q_page                               # [N, Lp]
    pos_o = open_start + torch.arange(k_open.shape[0], device=dev)
    mask_o = ((pos_o[None, :] // page_size) == q_page) & (pos_o[None, :] <= q_pos[:, None])

    s_p = torch.einsum("nhgd,lhd->nhgl", qf, k_pages.float())
    s_o = torch.einsum("nhgd,lhd->nhgl", qf, k_open.float())
    s = torch.cat((s_p.masked_fill(~mask_p[:, None, None, :], -math.inf),
                   s_o.masked_fill(~mask_o[:, None, None, :], -math.inf)), dim=-1)
    p = torch.softmax(s, dim=-1)
    lp = k_pages.shape[0]
    out = torch.einsum("nhgl,lhd->nhgd", p[..., :lp], v_pages.float()) + \
        torch.einsum("nhgl,lhd->nhgd", p[..., lp:], v_open.float())
    return out.reshape(n, hq, d).to(q.dtype)
