"""Chunk attention for chunked prefill and prefix-cache hits, over compact pages plus an open region.

Exactly the page-causal rule of ``kvwire.attention.attend_paged_reference``: a query at position
p sees every key of the stored pages before its own page (``page_ids[j]`` holds positions
j*P .. j*P+P-1, decoded from the pool) and the keys of its own page from the bf16 open region
(``k_open``/``v_open`` at positions ``open_start ..``) up to p. So a prefix-cache hit and a cold
run compute the same thing.

One program per (block of queries, KV head, split): the rows of its tiles are (query, head of the
GQA group) pairs, so each page is read once per block for the whole group. It streams the stored
pages the block can see and then the open tokens of the block's pages, with an fp32 online
softmax. On the GPU, FP8 keys go to FP8 tensor cores as stored (q as two E4M3 halves, hi + lo);
NVFP4 keys and all compact values are dequantised to fp16 tiles in registers, like the decode
kernel; the open tokens are bf16 dots.

Split-KV, as in decode: a short chunk makes only (queries / block) x KV heads programs, fewer
than the GPU has SMs (64 queries: 16 programs on 132 SMs), and each would stream the whole prefix
alone. With ``num_splits`` > 1, splits 0 .. S-1 each take one range of the stored prefix, split S
takes the open tokens, each writes an fp32 partial (max, sum, accumulator), and
``_chunk_merge_kernel`` merges them (log-sum-exp) into the output. ``chunk_plan.default_splits``
picks S from the SM count.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kvwire.attention import attend_paged_reference
from kvwire.formats import ElementType, PageFormat
from kvwire.kernels._common import (
    bf16_bits_to_f32, check_storage, elem_code, gran_code, interpreting, part_offsets, partials, pow2,
    read_pages_reference, static_arg, use_triton,
)
from kvwire.kernels.chunk_plan import (INTERPRETER_TILE, default_tile, fp8_tensor_cores, launch_fitting,
                                       planned_splits, queries_per_block)
from kvwire.kernels.tile_loads import load_colscale, load_fp8_codes, load_kv_tile, load_nvfp4_tile_folded

LOG2E = 1.4426950408889634


@triton.jit
def _chunk_kernel(
    q_ptr, sq_n, sq_h, sq_d, qpos_ptr, n_q,
    st8, stf8, st16k, st16v, st32, ids_ptr, n_pages, static_ptr,
    ko_ptr, sko_l, sko_h, sko_d, vo_ptr, svo_l, svo_h, svo_d, n_open, open_start,
    out_ptr, so_n, so_h, so_d,
    part_acc_ptr, part_m_ptr, part_l_ptr, num_splits, split_tokens,
    page_bytes, layer, qk_scale,
    k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs,
    H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr,
    P: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BN: tl.constexpr,
    K_ELEM: tl.constexpr, K_GRAN: tl.constexpr, V_ELEM: tl.constexpr, V_GRAN: tl.constexpr,
    HW: tl.constexpr, NV_ASM: tl.constexpr, SPLIT: tl.constexpr, FP8_DOT: tl.constexpr,
    PREC: tl.constexpr = "tf32",
):
    R: tl.constexpr = BLOCK_M * BLOCK_G
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    pid_s = tl.program_id(2)
    r = tl.arange(0, R)
    qn = pid_m * BLOCK_M + r // BLOCK_G
    g = r % BLOCK_G
    rvalid = (qn < n_q) & (g < G)
    d = tl.arange(0, BLOCK_D)
    qmask = rvalid[:, None] & (d < D)[None, :]
    qoffs = qn.to(tl.int64)[:, None] * sq_n + (h * G + g).to(tl.int64)[:, None] * sq_h + d[None, :].to(tl.int64) * sq_d
    q = tl.load(q_ptr + qoffs, mask=qmask, other=0.0).to(tl.float32)
    qpos = tl.load(qpos_ptr + qn, mask=qn < n_q, other=0).to(tl.int64)
    qpage = qpos // P
    big = 1 << 40
    min_page = tl.min(tl.where(rvalid, qpage, big), axis=0)
    max_page = tl.max(tl.where(rvalid, qpage, -1), axis=0)

    ck = qk_scale
    if K_GRAN == 3:            # > 0: it multiplies -inf scores inside the exponent's FMA
        ck = tl.maximum(ck * tl.load(static_ptr + (layer * 2 + 0) * H + h), 1.0e-30)
    qlo = q
    if HW:
        if K_ELEM == 0:
            qk = q.to(tl.bfloat16)
        elif K_ELEM == 1 and FP8_DOT:
            # FP8 keys go to the tensor cores as stored; q as two E4M3 halves (hi + lo, ~2^-8 relative),
            # scaled by one factor per block into E4M3 range (|q a| < 256; 1/a rides in ck)
            amax = tl.maximum(tl.max(tl.max(tl.abs(q), axis=1), axis=0), 1.0e-30)
            a = tl.math.exp2(7.0 - tl.floor(tl.math.log2(amax)))
            qa = q * a
            qk = qa.to(tl.float8e4nv)
            qlo = (qa - qk.to(tl.float32)).to(tl.float8e4nv)
            ck = ck / a
        else:
            qk = q.to(tl.float16)
    else:
        qk = q
    m_i = tl.full([R], -1.0e30, tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BLOCK_D], tl.float32)
    vref = tl.full([], 0.0, tl.float32)   # per-token value scales: acc is in vref units (0: no tile yet)
    t = tl.arange(0, BN)

    # stored pages 0 .. min(n_pages, max_page) - 1; row sees page j iff j < its own page. Tiles
    # below the block's first query page are seen by every row: no mask there (most of a long
    # prefix), the per-row page test only on the tiles after it.
    end_tok = (tl.minimum(max_page, n_pages) * P).to(tl.int32)
    t_lo = 0
    if SPLIT:      # split s < S: stored tokens [s, s + 1) * split_tokens; split S: none
        t_lo = pid_s * split_tokens
        end_tok = tl.minimum(t_lo + split_tokens, end_tok)
    full_end = (t_lo + (tl.maximum(tl.minimum(min_page * P, end_tok) - t_lo, 0) // BN) * BN).to(tl.int32)
    for t0 in range(t_lo, full_end, BN):
        m_i, l_i, acc, vref = _stored_tile(
            t0, m_i, l_i, acc, vref, qk, qlo, qpage, end_tok, ck, st8, stf8, st16k, st16v, st32, ids_ptr, page_bytes, h,
            k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs,
            K_ELEM, K_GRAN, V_ELEM, V_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM, FP8_DOT, PREC, False)
    for t0 in range(full_end, end_tok, BN):
        m_i, l_i, acc, vref = _stored_tile(
            t0, m_i, l_i, acc, vref, qk, qlo, qpage, end_tok, ck, st8, stf8, st16k, st16v, st32, ids_ptr, page_bytes, h,
            k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs,
            K_ELEM, K_GRAN, V_ELEM, V_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM, FP8_DOT, PREC, True)
    if V_ELEM == 2 or (V_ELEM == 1 and (V_GRAN == 1 or V_GRAN == 2)):
        acc = acc * vref       # from units of the running value reference to real ones
    if V_GRAN == 3:            # static value scale: once, before the (unscaled) open tokens join
        acc = acc * tl.load(static_ptr + (layer * 2 + 1) * H + h)

    # open tokens of the block's pages (bf16; bf16 dots on the GPU), causal within the page
    o_lo = tl.minimum(tl.maximum(min_page * P - open_start, 0), n_open).to(tl.int32)
    o_hi = tl.minimum((max_page + 1) * P - open_start, n_open).to(tl.int32)
    if SPLIT:      # the open tokens belong to the last split only
        o_hi = tl.where(pid_s == num_splits, o_hi, o_lo)
    if HW:     # reloaded (not kept from the start): no [rows, D] tile stays live across the stored loop
        qo = tl.load(q_ptr + qoffs, mask=qmask & (o_hi > o_lo), other=0.0).to(tl.bfloat16)
    for o0 in range(o_lo, o_hi, BN):
        oi = o0 + t
        ovalid = oi < o_hi
        pos = (open_start + oi).to(tl.int64)
        omask = ovalid[:, None] & (d < D)[None, :]
        kraw = tl.load(ko_ptr + (oi.to(tl.int64)[:, None] * sko_l + h * sko_h + d[None, :].to(tl.int64) * sko_d),
                       mask=omask, other=0)
        if HW:     # bf16 x bf16 products are exact in the fp32 accumulator
            s = tl.dot(qo, tl.trans(kraw.to(tl.bfloat16, bitcast=True))) * qk_scale
        else:
            s = tl.dot(q, tl.trans(bf16_bits_to_f32(kraw)), input_precision=PREC) * qk_scale
        vis = ovalid[None, :] & ((pos // P)[None, :] == qpage[:, None]) & (pos[None, :] <= qpos[:, None])
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vraw = tl.load(vo_ptr + (oi.to(tl.int64)[:, None] * svo_l + h * svo_h + d[None, :].to(tl.int64) * svo_d),
                       mask=omask, other=0)
        if HW:
            acc = tl.dot(p.to(tl.bfloat16), vraw.to(tl.bfloat16, bitcast=True), acc * alpha[:, None])
        else:
            acc = acc * alpha[:, None] + tl.dot(p, bf16_bits_to_f32(vraw), input_precision=PREC)
        m_i = m_new

    if SPLIT:      # partial [split, query, query head]: merged by _chunk_merge_kernel
        prow = (pid_s * n_q + qn).to(tl.int64) * (H * G) + h * G + g
        tl.store(part_m_ptr + prow, m_i, mask=rvalid)
        tl.store(part_l_ptr + prow, l_i, mask=rvalid)
        tl.store(part_acc_ptr + prow[:, None] * D + d[None, :], acc, mask=qmask)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        ooffs = (qn.to(tl.int64)[:, None] * so_n + (h * G + g).to(tl.int64)[:, None] * so_h
                 + d[None, :].to(tl.int64) * so_d)
        tl.store(out_ptr + ooffs, out.to(out_ptr.dtype.element_ty), mask=qmask)


@triton.jit
def _stored_tile(t0, m_i, l_i, acc, vref, qk, qlo, qpage, end_tok, ck, st8, stf8, st16k, st16v, st32, ids_ptr,
                 page_bytes, h, k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs,
                 K_ELEM: tl.constexpr, K_GRAN: tl.constexpr, V_ELEM: tl.constexpr, V_GRAN: tl.constexpr,
                 P: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BN: tl.constexpr, HW: tl.constexpr,
                 NV_ASM: tl.constexpr, FP8_DOT: tl.constexpr, PREC: tl.constexpr, MASKED: tl.constexpr):
    """One tile of BN stored tokens from t0 into the online softmax (m_i, l_i, acc; log2 units).

    Per score element the work is kept to what FlashAttention does: the softmax scale rides in the
    exponent's FMA, P.V accumulates inside the MMA, and the page-causal test runs only on MASKED
    tiles (those past the block's first query page or the range's end). Per-token scales (FP8
    token/page, the NVFP4 global scale) are applied to the [BN, D] K and V tiles in their load
    layout, relative to a reference that keeps them in f16 range: the tile's largest key scale
    (a scalar folded into the exponent's FMA) and a running value reference ``vref`` (acc is kept
    in its units; it moves, with one scalar rescale of acc, when a tile's scales leave 2^+-7 of it).
    With FP8_DOT, FP8 keys skip all that: their bytes go to an E4M3 dot as stored (q = qk + qlo,
    two E4M3 halves) and their token/page scales multiply the fp32 score columns. NVFP4's per-token
    factor rides on its block scales (``load_nvfp4_tile_folded``).
    """
    tk = t0 + tl.arange(0, BN)
    valid = tk < end_tok
    page = tl.load(ids_ptr + tk // P, mask=valid, other=0).to(tl.int64)
    base = page * page_bytes
    row = tk % P
    if K_ELEM == 1 and HW and FP8_DOT:     # E4M3 bytes straight to the tensor cores (q = qk + qlo)
        k8 = load_fp8_codes(stf8, base, row, valid, h, k_data, P, D, BLOCK_D)
        k8t = tl.trans(k8)
        s = tl.dot(qlo, k8t, tl.dot(qk, k8t))
        if K_GRAN == 1 or K_GRAN == 2:     # per-token key scales on the score columns
            s = s * load_colscale(st32, base, row, valid, h, k_s, k_gs, K_ELEM, K_GRAN, P, HW)[None, :]
    else:
        if K_ELEM == 2 and HW:     # the global scale over the tile's largest rides on the block scales
            kg = load_colscale(st32, base, row, valid, h, k_s, k_gs, K_ELEM, K_GRAN, P, HW)
            kmax = tl.max(kg, axis=0)
            kmax = tl.where(kmax > 0, kmax, 1.0)
            k = load_nvfp4_tile_folded(st8, base, row, valid, h, k_data, k_bs, kg / kmax, P, D, BLOCK_D, BN, NV_ASM)
            ck = ck * kmax
        else:
            k, kcs = load_kv_tile(st8, st16k, st32, base, row, valid, h, k_data, k_s, k_bs, k_gs,
                                  K_ELEM, K_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM)
            if K_ELEM == 2 or (K_ELEM == 1 and (K_GRAN == 1 or K_GRAN == 2)):     # relative to the tile's largest
                kmax = tl.max(kcs, axis=0)
                kmax = tl.where(kmax > 0, kmax, 1.0)
                k = (k * (kcs / kmax).to(k.dtype)[:, None]).to(k.dtype)
                ck = ck * kmax
        s = tl.dot(qk, tl.trans(k), input_precision=PREC)
    if MASKED:
        vis = valid[None, :] & ((tk // P).to(tl.int64)[None, :] < qpage[:, None])
        s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * ck)
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s * ck - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if V_ELEM == 2 and HW:     # scales first, then the tile with (scale / reference) on its block scales
        vcs = load_colscale(st32, base, row, valid, h, v_s, v_gs, V_ELEM, V_GRAN, P, HW)
    else:
        v, vcs = load_kv_tile(st8, st16v, st32, base, row, valid, h, v_data, v_s, v_bs, v_gs,
                              V_ELEM, V_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM)
    if V_ELEM == 2 or (V_ELEM == 1 and (V_GRAN == 1 or V_GRAN == 2)):
        vmax = tl.max(vcs, axis=0)
        vmax = tl.where(vmax > 0, vmax, 1.0)
        keep = (vref > 0) & (vmax <= vref * 128.0) & (vmax >= vref * 0.0078125)
        new_ref = tl.where(keep, vref, vmax)
        alpha = alpha * tl.where(vref > 0, vref / new_ref, 0.0)
        if V_ELEM == 2 and HW:     # bs (<= 448) x vcs / new_ref (<= 128) stays in fp16
            v = load_nvfp4_tile_folded(st8, base, row, valid, h, v_data, v_bs, vcs / new_ref, P, D, BLOCK_D, BN,
                                       NV_ASM)
        else:
            v = (v * (vcs / new_ref).to(v.dtype)[:, None]).to(v.dtype)
        vref = new_ref
    if HW:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PREC)
    else:
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PREC)
    return m_new, l_i, acc, vref


@triton.jit
def _chunk_merge_kernel(part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr, so_n, so_h, so_d, n_rows, num_parts,
                        HQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """out[query, head] = the log-sum-exp merge of its ``num_parts`` partials (rows = query x head)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, BLOCK_D)
    rmask = r < n_rows
    mask = rmask[:, None] & (d < D)[None, :]
    r64 = r.to(tl.int64)
    m = tl.full([ROWS], -1.0e30, tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for s in range(0, num_parts):
        prow = s * n_rows + r64
        ms = tl.load(part_m_ptr + prow, mask=rmask, other=-1.0e30)
        m_new = tl.maximum(m, ms)
        a = tl.math.exp2(m - m_new)
        b = tl.math.exp2(ms - m_new)
        l = l * a + tl.load(part_l_ptr + prow, mask=rmask, other=0.0) * b
        acc = acc * a[:, None] + tl.load(part_acc_ptr + prow[:, None] * D + d[None, :], mask=mask, other=0.0) * b[:, None]
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    ooffs = (r64 // HQ)[:, None] * so_n + (r64 % HQ)[:, None] * so_h + d[None, :].to(tl.int64) * so_d
    tl.store(out_ptr + ooffs, out.to(out_ptr.dtype.element_ty), mask=mask)


def paged_chunk_attention(q: torch.Tensor, q_pos: torch.Tensor, storage: torch.Tensor, page_format: PageFormat,
                          layer: int, page_ids: torch.Tensor, k_open: torch.Tensor, v_open: torch.Tensor,
                          open_start: int, static_scales: torch.Tensor | None = None,
                          out: torch.Tensor | None = None, *, block_n: int | None = None, rows: int | None = None,
                          num_warps: int | None = None, num_stages: int | None = None,
                          num_splits: int | None = None, prefix_partial: tuple[torch.Tensor, torch.Tensor] | None = None,
                          nvfp4_asm: bool = True, fp8_dot: bool = True, _hw: bool | None = None) -> torch.Tensor:
    """Attention of one sequence's queries ``q`` [N, Hq, D] at positions ``q_pos`` [N].

    page_ids [Np]: the sequence's stored pages (positions 0 .. Np*P-1) in ``storage``;
    k_open/v_open [Lo, H, D] bf16 at positions ``open_start ..`` (a multiple of P; each query's
    own position must lie in it); static_scales [L, 2, H] for fp8 tensor/head formats.
    num_splits: ranges the stored pages are split into (None: ``chunk_plan.planned_splits``; 1: one pass,
    no partials). fp8_dot: FP8 keys on E4M3 tensor cores (sm_89+; False: dequantised to fp16 first).
    prefix_partial: (out [N, Hq, D], log-sum-exp [N, Hq], natural log) of the same queries over keys
    that lie before all of these (``chunk_gathered``), merged in as one more partial; or K of them,
    ([K, N, Hq, D], [K, N, Hq]), over disjoint key sets.
    Returns [N, Hq, D] in q's dtype, as ``attend_paged_reference`` over the decoded pages.
    """
    f = page_format
    check_storage(storage, f)
    n, hq, d = q.shape
    h = f.num_kv_heads
    if d != f.head_dim or hq % h:
        raise ValueError(f"q must be [N, k*{h}, {f.head_dim}], got {tuple(q.shape)}")
    if open_start % f.page_size:
        raise ValueError("open_start must be a multiple of the page size")
    if k_open.shape != v_open.shape or (k_open.dim() != 3) or tuple(k_open.shape[1:]) != (h, d):
        raise ValueError(f"k_open/v_open must be [Lo, {h}, {d}], got {tuple(k_open.shape)} / {tuple(v_open.shape)}")
    if out is None:
        out = torch.empty_like(q)
    if n == 0:
        return out
    if prefix_partial is not None:
        po, pl = prefix_partial
        if po.dim() not in (3, 4) or tuple(po.shape[-3:]) != (n, hq, d) or tuple(pl.shape) != tuple(po.shape[:-1]):
            raise ValueError(f"prefix_partial must be ([K,] [{n}, {hq}, {d}], [K,] [{n}, {hq}]), got "
                             f"{tuple(po.shape)} / {tuple(pl.shape)}")
    if not use_triton(storage):
        if prefix_partial is not None:
            raise ValueError("prefix_partial needs the Triton kernel (CUDA or TRITON_INTERPRET=1)")
        out.copy_(paged_chunk_reference(q, q_pos, storage, f, layer, page_ids, k_open, v_open, open_start,
                                        static_scales))
        return out
    hw = (not interpreting()) if _hw is None else _hw
    dev = storage.device
    tile = default_tile(f, dev) if hw else INTERPRETER_TILE
    explicit = rows is not None or block_n is not None or num_warps is not None or num_stages is not None
    if explicit:
        tile = (rows or tile[0], block_n or tile[1], num_warps or tile[2], num_stages or tile[3])
    launch = functools.partial(_launch, q, q_pos, storage, f, layer, page_ids, k_open, v_open, open_start,
                               static_scales, out, num_splits, prefix_partial, nvfp4_asm, fp8_dot, hw)
    launch_fitting(launch, tile, (str(dev), f.kv.name, d, hq // h), explicit)
    return out


def _launch(q: torch.Tensor, q_pos: torch.Tensor, storage: torch.Tensor, f: PageFormat, layer: int,
            page_ids: torch.Tensor, k_open: torch.Tensor, v_open: torch.Tensor, open_start: int,
            static_scales: torch.Tensor | None, out: torch.Tensor, num_splits: int | None,
            prefix_partial: tuple[torch.Tensor, torch.Tensor] | None, nvfp4_asm: bool, fp8_dot: bool, hw: bool,
            tile: tuple[int, int, int, int]) -> None:
    """One call of ``paged_chunk_attention`` (arguments checked) in launch tile ``tile``."""
    n, hq, d = q.shape
    h = f.num_kv_heads
    dev = storage.device
    g = hq // h
    block_g = pow2(g)
    rows, bn, warps, stages = tile
    block_m = queries_per_block(rows, block_g)
    block_d = pow2(d)
    static = static_arg(f, static_scales, dev)
    kf, vf = f.kv.key, f.kv.value
    st32 = storage.view(torch.float32)
    st16 = storage.view(torch.bfloat16) if hw else storage.view(torch.int16)
    ko = k_open.to(torch.bfloat16).view(torch.int16)
    vo = v_open.to(torch.bfloat16).view(torch.int16)
    ids = page_ids.to(device=dev, dtype=torch.int64)
    qpos = q_pos.to(device=dev, dtype=torch.int64)
    m_blocks = triton.cdiv(n, block_m)
    stored = ids.numel() * f.page_size
    splits = planned_splits(n, hq, f, ids.numel(), dev, tile) if num_splits is None else int(num_splits)
    if splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {splits}")
    split = splits > 1 or prefix_partial is not None
    # every split's range a whole number of key tiles, the ranges covering the stored prefix
    split_tokens = triton.cdiv(triton.cdiv(max(stored, 1), splits), bn) * bn
    programs = splits + 1 if split else 1               # split S: the open tokens
    prefix_parts = 0 if prefix_partial is None else prefix_partial[1].numel() // (n * hq)
    parts = programs + prefix_parts                     # and the prefix's partials last
    # an E4M3 dot reduces over at least 32 elements: smaller heads keep the fp16 path
    fp8_keys = fp8_dot and kf.element is ElementType.FP8 and block_d >= 32 and fp8_tensor_cores(dev)
    # the FP8 key bytes as E4M3 for that dot only: an fp8e4nv pointer does not compile before sm_89,
    # where bf16 pages must still run
    stf8 = storage.view(torch.float8_e4m3fn) if fp8_keys else storage
    if split:
        part_acc = partials((parts, n, hq, d), dev, hw)
        part_m = partials((parts, n, hq), dev, hw)
        part_l = partials((parts, n, hq), dev, hw)
        if prefix_parts:   # as partials: normalised (l = 1), their max the log2-sum-exp
            part_acc[-prefix_parts:].copy_(prefix_partial[0].view(prefix_parts, n, hq, d))
            torch.mul(prefix_partial[1].view(prefix_parts, n, hq), LOG2E, out=part_m[-prefix_parts:])
            part_l[-prefix_parts:].fill_(1.0)
    else:
        part_acc = part_m = part_l = out                # not touched
    _chunk_kernel[(m_blocks, h, programs)](
        q, *q.stride(), qpos, n, storage, stf8, st16, st16, st32, ids, ids.numel(), static,
        ko, *ko.stride(), vo, *vo.stride(), ko.shape[0], open_start,
        out, *out.stride(), part_acc, part_m, part_l, splits, split_tokens,
        f.page_bytes, layer, LOG2E / math.sqrt(d),
        *part_offsets(f, layer, 0), *part_offsets(f, layer, 1),
        H=h, G=g, BLOCK_G=block_g, BLOCK_M=block_m, P=f.page_size, D=d, BLOCK_D=block_d, BN=bn,
        K_ELEM=elem_code(kf), K_GRAN=gran_code(kf), V_ELEM=elem_code(vf), V_GRAN=gran_code(vf),
        HW=hw, NV_ASM=nvfp4_asm, SPLIT=split, FP8_DOT=fp8_keys, PREC="tf32" if hw else "ieee",
        num_warps=warps, num_stages=stages,
    )
    if split:
        rows_per_program = 16 if hw else 64
        _chunk_merge_kernel[(triton.cdiv(n * hq, rows_per_program),)](
            part_acc, part_m, part_l, out, *out.stride(), n * hq, parts,
            HQ=hq, D=d, BLOCK_D=block_d, ROWS=rows_per_program, num_warps=4)


# ---- torch reference -----------------------------------------------------------------------------

def paged_chunk_reference(q: torch.Tensor, q_pos: torch.Tensor, storage: torch.Tensor, page_format: PageFormat,
                          layer: int, page_ids: torch.Tensor, k_open: torch.Tensor, v_open: torch.Tensor,
                          open_start: int, static_scales: torch.Tensor | None = None,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """``attend_paged_reference`` over the pages decoded by ``kvwire.quant.dequantize_pages``."""
    kp = read_pages_reference(storage, page_format, layer, 0, page_ids, static_scales).to(q.device)
    vp = read_pages_reference(storage, page_format, layer, 1, page_ids, static_scales).to(q.device)
    res = attend_paged_reference(q, q_pos.to(q.device), kp, vp, k_open.to(q.device), v_open.to(q.device),
                                 open_start, page_format.page_size)
    if out is not None:
        out.copy_(res)
        return out
    return res


# ---- benchmark -----------------------------------------------------------------------------------

def benchmark(page_format: PageFormat, prefix: int = 8192, chunk: int = 512, num_q_heads: int = 32,
              device: str = "cuda", **launch) -> dict:
    """Time one layer's chunk of ``chunk`` queries after a ``prefix``-token stored prefix."""
    from triton.testing import do_bench

    from kvwire.kernels.quantize import write_pages
    f = page_format
    p = f.page_size
    np_ = prefix // p
    storage = torch.empty((np_, f.page_bytes), dtype=torch.uint8, device=device)
    static = torch.full((f.num_layers, 2, f.num_kv_heads), 0.01, device=device)
    ids = torch.randperm(np_, device=device)
    for part in (0, 1):
        x = torch.randn((np_, p, f.num_kv_heads, f.head_dim), device=device, dtype=torch.bfloat16)
        write_pages(storage, f, 0, part, ids, x, static[0, part], check_finite=False)
    q = torch.randn((chunk, num_q_heads, f.head_dim), device=device, dtype=torch.bfloat16)
    pos = torch.arange(prefix, prefix + chunk, device=device)
    ko = torch.randn((chunk, f.num_kv_heads, f.head_dim), device=device, dtype=torch.bfloat16)
    vo = torch.randn_like(ko)
    ms = do_bench(lambda: paged_chunk_attention(q, pos, storage, f, 0, ids, ko, vo, prefix, static, **launch),
                  return_mode="median")
    flops = 4 * chunk * num_q_heads * f.head_dim * (prefix + chunk / 2)
    return {"format": f.name, "prefix": prefix, "chunk": chunk, "ms": ms, "tflops": flops / ms / 1e9}
