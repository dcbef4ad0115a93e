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
import torch.nn.functional as F


def page_causal_mask(q_pos: torch.Tensor, num_page_tokens: int, open_start: int, open_len: int,
                     page_size: int) -> torch.Tensor:
    """Which keys each query sees: bool [N, num_page_tokens + open_len] (pages first, then open).

    The same for every layer, so the runner builds it once per forward.
    """
    dev = q_pos.device
    q_page = (q_pos // page_size)[:, None]
    pos_p = torch.arange(num_page_tokens, device=dev)
    pos_o = open_start + torch.arange(open_len, device=dev)
    mask_p = (pos_p[None, :] // page_size) < q_page
    mask_o = ((pos_o[None, :] // page_size) == q_page) & (pos_o[None, :] <= q_pos[:, None])
    return torch.cat((mask_p, mask_o), dim=1)


def attend_paged_reference(q: torch.Tensor, q_pos: torch.Tensor,
                           k_pages: torch.Tensor, v_pages: torch.Tensor,
                           k_open: torch.Tensor, v_open: torch.Tensor,
                           open_start: int, page_size: int,
                           mask: torch.Tensor | None = None) -> torch.Tensor:
    """GQA attention of one sequence's queries over its pages plus its open (bf16) tokens.

    q: [N, Hq, D] at positions ``q_pos`` [N]; k_pages/v_pages: [Lp, H, D] decoded pages covering
    positions 0..Lp-1 (Lp a multiple of page_size); k_open/v_open: [Lo, H, D] bf16-precision
    tokens at positions open_start..open_start+Lo-1 (open_start a multiple of page_size).
    ``mask``: ``page_causal_mask(...)`` if already built. Softmax and accumulation in fp32;
    returns [N, Hq, D] in q's dtype.
    """
    n, hq, d = q.shape
    h = k_open.shape[1] if k_open.numel() else k_pages.shape[1]
    if hq % h:
        raise ValueError(f"{hq} query heads are not a multiple of {h} KV heads")
    if open_start % page_size or k_pages.shape[0] % page_size:
        raise ValueError("pages and the open region must start on page boundaries")
    if mask is None:
        mask = page_causal_mask(q_pos, k_pages.shape[0], open_start, k_open.shape[0], page_size)
    k = torch.cat((k_pages.float(), k_open.float())).transpose(0, 1)[None]      # [1, H, L, D]
    v = torch.cat((v_pages.float(), v_open.float())).transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1)[None], k, v, attn_mask=mask,
                                         scale=1.0 / math.sqrt(d), enable_gqa=True)
    return out[0].transpose(0, 1).to(q.dtype)
