"""The packed variant of the paged decode split kernel: 16/G KV heads per program, no padded rows.

Selected by ``paged_decode_attention(..., packed=True)``. It issues fewer instructions than
``_decode_split_kernel`` (which pads one GQA group to a 16-row tile) but measured slower on the
H200 (docs/benchmarks.md), so it is not the default; it is kept, tested against the same torch
reference, for GPUs where the balance differs.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kvwire.kernels.tile_loads import load_colscale, load_kv_tile, load_nvfp4_ab, load_q_operands, nvfp4_perm

LOG2E = 1.4426950408889634


def heads_per_program(num_kv_heads: int, group: int, rows: int = 16) -> int:
    """KV heads one program handles: the largest divisor of H whose query heads fit ``rows`` rows."""
    best = 1
    for hp in range(1, num_kv_heads + 1):
        if num_kv_heads % hp == 0 and hp * group <= rows:
            best = hp
    return best


@triton.jit
def _decode_split_packed_kernel(
    q_ptr, sq_b, sq_h, sq_d,
    st8, st16k, st16v, st32, page_table_ptr, spt_b, num_pages_ptr, static_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,
    page_bytes, layer, num_splits, qk_scale,
    k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs,
    H: tl.constexpr, G: tl.constexpr, HP: tl.constexpr, ROWS: tl.constexpr, P: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, BN: tl.constexpr,
    K_ELEM: tl.constexpr, K_GRAN: tl.constexpr, V_ELEM: tl.constexpr, V_GRAN: tl.constexpr,
    HW: tl.constexpr, NV_ASM: tl.constexpr, V_FP8_ASM: tl.constexpr, PREC: tl.constexpr,
):
    """HP KV heads per program: the tile rows are the HP*G query heads of those KV heads (all real
    rows when HP*G = 16), so the softmax does no padding work. Each head's tiles are still read
    once; its scores fill only its own rows."""
    pid_s = tl.program_id(0)
    pid_bg = tl.program_id(1)
    NGRP: tl.constexpr = H // HP
    b = pid_bg // NGRP
    h0 = (pid_bg % NGRP) * HP
    n = tl.load(num_pages_ptr + b)
    pps = tl.cdiv(n, num_splits)
    start_tok = tl.minimum(pid_s * pps, n) * P
    end_tok = tl.minimum(pid_s * pps + pps, n) * P

    r = tl.arange(0, ROWS)
    rh = r // G                                   # head of the row within the group
    rvalid = r < HP * G
    d = tl.arange(0, BLOCK_D)
    dh = tl.arange(0, BLOCK_D // 2)
    dperm = nvfp4_perm(dh, BLOCK_D)
    qrow = q_ptr + b.to(tl.int64) * sq_b + (h0 * G + r)[:, None].to(tl.int64) * sq_h
    qmask = rvalid[:, None] & (d < D)[None, :]
    if K_GRAN == 3:
        c_rows = qk_scale * tl.load(static_ptr + (layer * 2 + 0) * H + h0 + rh, mask=rvalid, other=1.0)
    else:
        c_rows = tl.full([ROWS], qk_scale, tl.float32)
    qk, qa, qb = load_q_operands(qrow, rvalid, sq_d, K_ELEM, D, BLOCK_D, HW)

    m_i = tl.full([ROWS], -1.0e30, tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    acc_a = tl.zeros([ROWS, BLOCK_D // 2], tl.float32)
    acc_b = tl.zeros([ROWS, BLOCK_D // 2], tl.float32)
    t = tl.arange(0, BN)
    pt_row = page_table_ptr + b.to(tl.int64) * spt_b
    for t0 in range(start_tok, end_tok, BN):
        tk = t0 + t
        valid = tk < end_tok
        page = tl.load(pt_row + tk // P, mask=valid, other=0).to(tl.int64)
        base = page * page_bytes
        row = tk % P
        s = tl.zeros([ROWS, BN], tl.float32)
        for hh in tl.static_range(HP):
            if K_ELEM == 2:
                ka, kb, kcs = load_nvfp4_ab(st8, st32, base, row, valid, h0 + hh, k_data, k_bs, k_gs,
                                            P, D, BLOCK_D, BN, HW)
                sh = tl.dot(qa, tl.trans(ka), input_precision=PREC)
                sh = tl.dot(qb, tl.trans(kb), sh, input_precision=PREC)
            else:
                k, kcs = load_kv_tile(st8, st16k, st32, base, row, valid, h0 + hh, k_data, k_s, k_bs, k_gs,
                                      K_ELEM, K_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM, False)
                sh = tl.dot(qk, tl.trans(k), input_precision=PREC)
            s = tl.where((rh == hh)[:, None], sh * kcs[None, :], s)
        s = s * c_rows[:, None]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc_a = acc_a * alpha[:, None]
        acc_b = acc_b * alpha[:, None]
        if V_ELEM == 2 or V_GRAN == 1 or V_GRAN == 2:
            # one normaliser for all heads' value scales keeps p * scale in fp16's normal range
            vmax = tl.zeros([BN], tl.float32)
            for hh in tl.static_range(HP):
                vmax = tl.maximum(vmax, load_colscale(st32, base, row, valid, h0 + hh, v_s, v_gs, V_ELEM, V_GRAN, P, HW))
            vnorm = tl.max(vmax, axis=0)
            vnorm = tl.where(vnorm > 0, vnorm, 1.0)
            pv = tl.zeros([ROWS, BLOCK_D], tl.float32)
            pv_a = tl.zeros([ROWS, BLOCK_D // 2], tl.float32)
            pv_b = tl.zeros([ROWS, BLOCK_D // 2], tl.float32)
            for hh in tl.static_range(HP):
                sel = (rh == hh)[:, None]
                if V_ELEM == 2:
                    va, vb, vcs = load_nvfp4_ab(st8, st32, base, row, valid, h0 + hh, v_data, v_bs, v_gs,
                                                P, D, BLOCK_D, BN, HW)
                    ph = tl.where(sel, p * (vcs / vnorm)[None, :], 0.0)
                    if HW:
                        ph = ph.to(tl.float16)
                    pv_a = tl.dot(ph, va, pv_a, input_precision=PREC)
                    pv_b = tl.dot(ph, vb, pv_b, input_precision=PREC)
                else:
                    v, vcs = load_kv_tile(st8, st16v, st32, base, row, valid, h0 + hh, v_data, v_s, v_bs, v_gs,
                                          V_ELEM, V_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM, V_FP8_ASM)
                    ph = tl.where(sel, p * (vcs / vnorm)[None, :], 0.0)
                    if HW:
                        ph = ph.to(v.dtype)
                    pv = tl.dot(ph, v, pv, input_precision=PREC)
            if V_ELEM == 2:
                acc_a += pv_a * vnorm
                acc_b += pv_b * vnorm
            else:
                acc += pv * vnorm
        else:
            for hh in tl.static_range(HP):
                v, vcs = load_kv_tile(st8, st16v, st32, base, row, valid, h0 + hh, v_data, v_s, v_bs, v_gs,
                                      V_ELEM, V_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM, V_FP8_ASM)
                ph = tl.where((rh == hh)[:, None], p, 0.0)
                if HW:
                    ph = ph.to(v.dtype)
                acc = tl.dot(ph, v, acc, input_precision=PREC)
        m_i = m_new

    # partial rows: (b, h, split, g) for h = h0 + r // G
    prow = ((b * H + h0 + rh).to(tl.int64) * num_splits + pid_s) * G + (r % G)
    tl.store(part_m_ptr + prow, m_i, mask=rvalid)
    tl.store(part_l_ptr + prow, l_i, mask=rvalid)
    if V_ELEM == 2:
        hmask = rvalid[:, None] & (dperm < D)[None, :]
        tl.store(part_acc_ptr + prow[:, None] * D + dperm[None, :], acc_a, mask=hmask)
        tl.store(part_acc_ptr + prow[:, None] * D + (dperm + 4)[None, :], acc_b, mask=hmask)
    else:
        if V_GRAN == 3:
            acc = acc * tl.load(static_ptr + (layer * 2 + 1) * H + h0 + rh, mask=rvalid, other=1.0)[:, None]
        tl.store(part_acc_ptr + prow[:, None] * D + d[None, :], acc, mask=qmask)
