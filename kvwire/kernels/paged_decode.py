"""Paged decode attention over compact pages (bf16, FP8, NVFP4; K and V each in their own format).

Query ``b`` is its sequence's newest token: it attends every key of its ``num_pages[b]`` full
pages (compact, in the pool, decoded in registers) and the ``tail_len[b]`` tokens of its own,
open page (bf16, in the tail pool): the page-causal rule of ``kvwire.attention``.

Two launches (flash-decoding):

1. ``_decode_split_kernel``, grid (splits, batch x KV heads): each program reads a contiguous range
   of one sequence's pages for one KV head *once* for the whole GQA group (the group's query
   heads are the rows of one tensor-core tile, padded to 16), dequantises in registers and keeps an
   fp32 online softmax (max, sum, accumulator) that it writes as a partial result.
   Scales never touch the elements when they need not: fp8 token/page scales and the NVFP4
   global scale multiply the score columns (keys) or the probability columns (values), static
   fp8 scales fold into the softmax constant or the final accumulator; only NVFP4 block scales
   multiply elements, in packed f16x2 right after the packed E2M1 -> E4M3 -> f16 conversion
   (inline PTX on 32-bit words; the head dim is processed in a permuted order, undone for free
   in q and in the output columns). FP8 V is converted in its load layout (inline PTX) so Triton
   does not read it byte by byte from shared memory.
   ``packed=True`` selects ``_decode_split_packed_kernel`` (paged_decode_packed.py: 16/G KV heads per program, no padded
   rows): fewer instructions, but slower on the H200 (docs/benchmarks.md), so not the default.
2. ``_decode_reduce_kernel``, grid (batch x query heads): attends the bf16 tail, merges it with the
   partials (log-sum-exp, many splits per step) and writes the output.

Splits make one long sequence fill the GPU; a single split suffices for large batches. All page
and byte offsets are int64. On CPU tensors without TRITON_INTERPRET=1 the torch reference runs.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kvwire.attention import attend_paged_reference
from kvwire.formats import ElementType, PageFormat
from kvwire.kernels._common import (
    bf16_bits_to_f32, check_storage, elem_code, gran_code, interpreting, num_sms, part_offsets, partials,
    pow2, read_pages_reference, static_arg, use_triton,
)
from kvwire.kernels import cuda_emulator, paged_decode_cuda
from kvwire.kernels.paged_decode_packed import _decode_split_packed_kernel, heads_per_program
from kvwire.kernels.tile_loads import load_kv_tile, load_nvfp4_ab, load_q_operands, nvfp4_perm

LOG2E = 1.4426950408889634


@triton.jit
def _decode_split_kernel(
    q_ptr, sq_b, sq_h, sq_d,
    st8, st16k, st16v, st32, page_table_ptr, spt_b, num_pages_ptr, static_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,
    page_bytes, layer, num_splits, qk_scale,
    k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs,
    H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, P: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, BN: tl.constexpr,
    K_ELEM: tl.constexpr, K_GRAN: tl.constexpr, V_ELEM: tl.constexpr, V_GRAN: tl.constexpr,
    HW: tl.constexpr, NV_ASM: tl.constexpr, K_FP8_ASM: tl.constexpr, V_FP8_ASM: tl.constexpr,
    PREC: tl.constexpr = "tf32",
):
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    n = tl.load(num_pages_ptr + b)
    pps = tl.cdiv(n, num_splits)
    start_tok = tl.minimum(pid_s * pps, n) * P
    end_tok = tl.minimum(pid_s * pps + pps, n) * P

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    dh = tl.arange(0, BLOCK_D // 2)
    dperm = nvfp4_perm(dh, BLOCK_D)            # NVFP4 half tiles: a at dperm, b at dperm + 4
    qmask = (g < G)[:, None] & (d < D)[None, :]
    qrow = q_ptr + b.to(tl.int64) * sq_b + (h * G + g)[:, None].to(tl.int64) * sq_h
    c = qk_scale
    if K_GRAN == 3:
        c = c * tl.load(static_ptr + (layer * 2 + 0) * H + h)
    qk, qa, qb = load_q_operands(qrow, g < G, sq_d, K_ELEM, D, BLOCK_D, HW)

    m_i = tl.full([BLOCK_G], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    acc_a = tl.zeros([BLOCK_G, BLOCK_D // 2], tl.float32)
    acc_b = tl.zeros([BLOCK_G, BLOCK_D // 2], tl.float32)
    t = tl.arange(0, BN)
    pt_row = page_table_ptr + b.to(tl.int64) * spt_b
    for t0 in range(start_tok, end_tok, BN):
        tk = t0 + t
        valid = tk < end_tok
        page = tl.load(pt_row + tk // P, mask=valid, other=0).to(tl.int64)
        base = page * page_bytes
        row = tk % P
        if K_ELEM == 2:
            ka, kb, kcs = load_nvfp4_ab(st8, st32, base, row, valid, h, k_data, k_bs, k_gs, P, D, BLOCK_D, BN, HW)
            s = tl.dot(qa, tl.trans(ka), input_precision=PREC)
            s = tl.dot(qb, tl.trans(kb), s, input_precision=PREC)
        else:
            k, kcs = load_kv_tile(st8, st16k, st32, base, row, valid, h, k_data, k_s, k_bs, k_gs,
                                  K_ELEM, K_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM, K_FP8_ASM)
            s = tl.dot(qk, tl.trans(k), input_precision=PREC)
        s = s * (kcs * c)[None, :]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if V_ELEM == 2:
            va, vb, vcs = load_nvfp4_ab(st8, st32, base, row, valid, h, v_data, v_bs, v_gs, P, D, BLOCK_D, BN, HW)
            vmax = tl.max(vcs, axis=0)
            vmax = tl.where(vmax > 0, vmax, 1.0)
            p = p * (vcs / vmax)[None, :]
            if HW:
                p = p.to(tl.float16)
            acc_a = acc_a * alpha[:, None] + tl.dot(p, va, input_precision=PREC) * vmax
            acc_b = acc_b * alpha[:, None] + tl.dot(p, vb, input_precision=PREC) * vmax
        else:
            v, vcs = load_kv_tile(st8, st16v, st32, base, row, valid, h, v_data, v_s, v_bs, v_gs,
                                  V_ELEM, V_GRAN, P, D, BLOCK_D, BN, HW, NV_ASM, V_FP8_ASM)
            if V_GRAN == 1 or V_GRAN == 2:
                vmax = tl.max(vcs, axis=0)
                vmax = tl.where(vmax > 0, vmax, 1.0)
                p = p * (vcs / vmax)[None, :]
                if HW:
                    pv = tl.dot(p.to(v.dtype), v, input_precision=PREC)
                else:
                    pv = tl.dot(p, v, input_precision=PREC)
                acc = acc * alpha[:, None] + pv * vmax
            else:
                if HW:
                    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PREC)
                else:
                    acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PREC)
        m_i = m_new

    prow = (pid_bh.to(tl.int64) * num_splits + pid_s) * G
    tl.store(part_m_ptr + prow + g, m_i, mask=g < G)
    tl.store(part_l_ptr + prow + g, l_i, mask=g < G)
    if V_ELEM == 2:
        hmask = (g < G)[:, None] & (dperm < D)[None, :]
        tl.store(part_acc_ptr + (prow + g)[:, None] * D + dperm[None, :], acc_a, mask=hmask)
        tl.store(part_acc_ptr + (prow + g)[:, None] * D + (dperm + 4)[None, :], acc_b, mask=hmask)
    else:
        if V_GRAN == 3:
            acc = acc * tl.load(static_ptr + (layer * 2 + 1) * H + h)
        tl.store(part_acc_ptr + (prow + g)[:, None] * D + d[None, :], acc, mask=qmask)


@triton.jit
def _decode_reduce_kernel(
    q_ptr, sq_b, sq_h, sq_d,
    tail_ptr, st_slot, st_layer, st_part, st_h, st_p, st_d,
    tail_slot_ptr, tail_len_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,
    out_ptr, so_b, so_h, so_d,
    layer, num_splits, qk_scale,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, BLOCK_P: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, SB: tl.constexpr, PDL: tl.constexpr = False,
):
    """One program per (sequence, query head): attend the bf16 tail, merge the split partials
    (SB at a time, log-sum-exp) and write the output row.

    PDL: launched as a programmatic dependent of the split kernel (which lets it start while the
    split kernel's last blocks run): q and the tail, written before the split kernel started, are
    read first; the partials only after ``gdc_wait``."""
    pid = tl.program_id(0)
    hq = H * G
    b = pid // hq
    qh = pid % hq
    h = qh // G
    g = qh % G
    d = tl.arange(0, BLOCK_D)
    j = tl.arange(0, BLOCK_P)
    dmask = d < D
    q = tl.load(q_ptr + b.to(tl.int64) * sq_b + qh.to(tl.int64) * sq_h + d.to(tl.int64) * sq_d,
                mask=dmask, other=0.0).to(tl.float32)

    # the open tail page (bf16), positions num_pages * P .. + tail_len - 1, all visible
    slot = tl.load(tail_slot_ptr + b).to(tl.int64)
    tlen = tl.load(tail_len_ptr + b)
    tb = tail_ptr + slot * st_slot + layer * st_layer + h.to(tl.int64) * st_h
    tmask = (j < tlen)[:, None] & dmask[None, :]
    toffs = j[:, None].to(tl.int64) * st_p + d[None, :].to(tl.int64) * st_d
    k = bf16_bits_to_f32(tl.load(tb + toffs, mask=tmask, other=0))
    v = bf16_bits_to_f32(tl.load(tb + st_part + toffs, mask=tmask, other=0))
    s = tl.sum(k * q[None, :], axis=1) * qk_scale
    s = tl.where(j < tlen, s, float("-inf"))
    m_i = tl.max(s, axis=0)
    p = tl.math.exp2(s - m_i)
    l_i = tl.sum(p, axis=0)
    acc = tl.sum(p[:, None] * v, axis=0)

    if PDL:
        gdc_wait()
    sp = tl.arange(0, SB)
    row0 = ((b * H + h).to(tl.int64) * num_splits) * G + g
    for s0 in range(0, num_splits, SB):
        smask = (s0 + sp) < num_splits
        prow = row0 + (s0 + sp).to(tl.int64) * G
        ms = tl.load(part_m_ptr + prow, mask=smask, other=-1.0e30)
        ls = tl.load(part_l_ptr + prow, mask=smask, other=0.0)
        accs = tl.load(part_acc_ptr + prow[:, None] * D + d[None, :], mask=smask[:, None] & dmask[None, :], other=0.0)
        m_new = tl.maximum(m_i, tl.max(ms, axis=0))
        a1 = tl.math.exp2(m_i - m_new)
        w = tl.math.exp2(ms - m_new)
        acc = acc * a1 + tl.sum(w[:, None] * accs, axis=0)
        l_i = l_i * a1 + tl.sum(w * ls, axis=0)
        m_i = m_new
    out = acc / l_i
    tl.store(out_ptr + b.to(tl.int64) * so_b + qh.to(tl.int64) * so_h + d.to(tl.int64) * so_d,
             out.to(out_ptr.dtype.element_ty), mask=dmask)



def default_config(page_format: PageFormat, batch: int, max_pages: int, device: torch.device,
                   num_q_heads: int | None = None, packed: bool = False) -> dict:
    """Split count and tile shape: enough programs to fill the GPU a few times over."""
    f = page_format
    kv_elem = {f.kv.key.element, f.kv.value.element}
    if interpreting() or device.type != "cuda":
        return {"num_splits": min(2, max(1, max_pages)), "block_n": max(16, min(128, pow2(f.page_size) * 4)),
                "num_warps": 4, "num_stages": 1}
    g = (num_q_heads or 4 * f.num_kv_heads) // f.num_kv_heads
    hp = heads_per_program(f.num_kv_heads, g) if packed else 1
    sms = num_sms(device)
    programs = batch * (f.num_kv_heads // hp)
    # H200 sweep (scripts/gpu/sweep.sh, 32x32k): one KV head per program with 128-token tiles beat
    # the packed variant for every format despite its lower instruction count.
    block_n = 128 if hp == 1 else (32 if kv_elem == {ElementType.BF16} else 64)
    target = 4 * sms
    min_pages = max(1, 1024 // f.page_size)      # 1x32k sweep: ~1k-token splits beat shorter ones
    splits = max(1, min(triton.cdiv(target, programs), triton.cdiv(max_pages, min_pages)))
    return {"num_splits": splits, "block_n": block_n, "num_warps": 4, "num_stages": 3}


def paged_decode_attention(q: torch.Tensor, storage: torch.Tensor, page_format: PageFormat, layer: int,
                           page_table: torch.Tensor, num_pages: torch.Tensor, tail: torch.Tensor,
                           tail_slot: torch.Tensor, tail_len: torch.Tensor,
                           static_scales: torch.Tensor | None = None, out: torch.Tensor | None = None,
                           *, num_splits: int | None = None, block_n: int | None = None,
                           num_warps: int | None = None, num_stages: int | None = None,
                           nvfp4_asm: bool = True, k_fp8_asm: bool = False, v_fp8_asm: bool = True,
                           packed: bool = False, backend: str = "auto", _hw: bool | None = None) -> torch.Tensor:
    """Decode attention of ``q`` [B, Hq, D] over each sequence's pages plus its bf16 tail.

    page_table: int32 [B, max_pages] (row b's first ``num_pages[b]`` entries are used);
    tail: bf16 ``TailPool.data`` [slots, layers, 2, H, P, D]; tail_slot, tail_len: int32 [B]
    (tail_len in 1..P); static_scales: fp32 [layers, 2, H] for fp8 tensor/head formats.
    Returns ``out`` (or a new tensor) [B, Hq, D] in q's dtype. Keyword-only arguments tune the
    launch (defaults from ``default_config``). CPU tensors without TRITON_INTERPRET=1 take the
    torch reference path. ``backend``: "auto" runs the CUDA split kernel (paged_decode_cuda.py)
    where it applies and NVRTC loads, else Triton; "triton" and "cuda" force one ("cuda" raises
    where it does not apply).
    """
    if backend not in ("auto", "triton", "cuda"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'cuda', got {backend!r}")
    f = page_format
    check_storage(storage, f)
    bsz, hq, d = q.shape
    h = f.num_kv_heads
    if d != f.head_dim or hq % h:
        raise ValueError(f"q must be [B, k*{h}, {f.head_dim}], got {tuple(q.shape)}")
    if page_table.dim() != 2 or page_table.shape[0] != bsz:
        raise ValueError(f"page_table must be [{bsz}, max_pages], got {tuple(page_table.shape)}")
    if tuple(tail.shape[1:]) != (f.num_layers, 2, h, f.page_size, d):
        raise ValueError(f"tail must be [slots, {f.num_layers}, 2, {h}, {f.page_size}, {d}], got {tuple(tail.shape)}")
    if out is None:
        out = torch.empty_like(q)
    if bsz == 0:
        return out
    if not use_triton(storage):
        if backend == "cuda":      # no silent fallback: select raises its "does not cover" error
            paged_decode_cuda.select(backend, f, hq, q, eligible=False)
        out.copy_(paged_decode_reference(q, storage, f, layer, page_table, num_pages, tail, tail_slot,
                                         tail_len, static_scales))
        return out
    hw = (not interpreting()) if _hw is None else _hw
    dev = storage.device
    # the CUDA kernel on the GPU; on the CPU (interpreter) in the warp emulator, when asked for by name
    emulate = backend == "cuda" and cuda_emulator.emulated(dev)
    cuda_kernel = paged_decode_cuda.select(backend, f, hq, q, (hw or emulate) and not packed)
    cfg = default_config(f, bsz, page_table.shape[1], dev, hq, packed)
    splits = num_splits or cfg["num_splits"]
    if cuda_kernel is not None and not num_splits:
        splits = paged_decode_cuda.default_splits(cuda_kernel.regular, bsz, f.num_kv_heads, page_table.shape[1], dev)
    bn = block_n or cfg["block_n"]
    nw = num_warps or cfg["num_warps"]
    ns = num_stages or cfg["num_stages"]
    g = hq // h
    block_g = max(16, pow2(g))
    block_d = _block_d(f)
    static = static_arg(f, static_scales, dev)
    kf, vf = f.kv.key, f.kv.value
    kd = part_offsets(f, layer, 0)
    vd = part_offsets(f, layer, 1)
    st32 = storage.view(torch.float32)
    st16 = storage.view(torch.bfloat16) if hw else storage.view(torch.int16)
    part_acc = partials((bsz * h * splits * g, d), dev, hw)
    part_m = partials((bsz * h * splits * g,), dev, hw)
    part_l = partials((bsz * h * splits * g,), dev, hw)
    qk_scale = LOG2E / math.sqrt(d)
    hp = heads_per_program(h, g) if packed else 1
    if cuda_kernel is not None:
        paged_decode_cuda.split_partials(cuda_kernel, q, storage, f, layer, page_table, num_pages, static, part_acc,
                                         part_m, part_l, splits, qk_scale, (kd, vd))
    elif hp > 1:
        _decode_split_packed_kernel[(splits, bsz * (h // hp))](
            q, *q.stride(), storage, st16, st16, st32, page_table, page_table.stride(0), num_pages, static,
            part_acc, part_m, part_l, f.page_bytes, layer, splits, qk_scale, *kd, *vd,
            H=h, G=g, HP=hp, ROWS=max(16, pow2(hp * g)), P=f.page_size, D=d, BLOCK_D=block_d, BN=bn,
            K_ELEM=elem_code(kf), K_GRAN=gran_code(kf), V_ELEM=elem_code(vf), V_GRAN=gran_code(vf),
            HW=hw, NV_ASM=nvfp4_asm, V_FP8_ASM=v_fp8_asm, PREC="tf32" if hw else "ieee",
            num_warps=nw, num_stages=ns,
        )
    else:
        _decode_split_kernel[(splits, bsz * h)](
            q, *q.stride(), storage, st16, st16, st32, page_table, page_table.stride(0), num_pages, static,
            part_acc, part_m, part_l, f.page_bytes, layer, splits, qk_scale, *kd, *vd,
            H=h, G=g, BLOCK_G=block_g, P=f.page_size, D=d, BLOCK_D=block_d, BN=bn,
            K_ELEM=elem_code(kf), K_GRAN=gran_code(kf), V_ELEM=elem_code(vf), V_GRAN=gran_code(vf),
            HW=hw, PREC="tf32" if hw else "ieee", NV_ASM=nvfp4_asm, K_FP8_ASM=k_fp8_asm, V_FP8_ASM=v_fp8_asm,
            num_warps=nw, num_stages=ns,
        )
    pdl = cuda_kernel is not None and paged_decode_cuda.dependent_launch(dev)
    return reduce_splits(q, f, layer, tail, tail_slot, tail_len, (part_acc, part_m, part_l), splits, out, pdl)


def _block_d(page_format: PageFormat) -> int:
    """The head-dim tile of both launches: head_dim rounded up to a power of two, at least 32 with
    NVFP4 (its half tiles are BLOCK_D/2 wide, and tl.dot needs K >= 16)."""
    f = page_format
    block_d = pow2(f.head_dim)
    if ElementType.NVFP4 in (f.kv.key.element, f.kv.value.element):
        block_d = max(block_d, 32)
    return block_d


def reduce_splits(q: torch.Tensor, page_format: PageFormat, layer: int, tail: torch.Tensor,
                  tail_slot: torch.Tensor, tail_len: torch.Tensor,
                  parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor], splits: int, out: torch.Tensor,
                  pdl: bool, *, num_warps: int = 2, splits_per_iter: int = 64) -> torch.Tensor:
    """Launch ``_decode_reduce_kernel``: the bf16 tail attended and merged with the split partials
    (acc, m, l) into ``out``. ``pdl``: launched as a programmatic dependent of the CUDA split kernel
    just launched. The keyword arguments tune the launch (scripts/gpu/reduce_parts.py times them):
    2 warps per program beat 4 and 8 at 32x32k on an H100, and are within the spread of 4 on an
    H200 (docs/benchmarks.md, 2026-12-05)."""
    f = page_format
    bsz, hq, d = q.shape
    block_d = _block_d(f)
    tail16 = tail.view(torch.int16)
    part_acc, part_m, part_l = parts
    _decode_reduce_kernel[(bsz * hq,)](
        q, *q.stride(), tail16, *tail16.stride(), tail_slot, tail_len, part_acc, part_m, part_l,
        out, *out.stride(), layer, splits, LOG2E / math.sqrt(d),
        H=f.num_kv_heads, G=hq // f.num_kv_heads, P=f.page_size, BLOCK_P=pow2(f.page_size), D=d,
        BLOCK_D=block_d, SB=min(splits_per_iter, pow2(splits)), PDL=pdl, num_warps=num_warps,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out


# ---- torch reference -----------------------------------------------------------------------------

def paged_decode_reference(q: torch.Tensor, storage: torch.Tensor, page_format: PageFormat, layer: int,
                           page_table: torch.Tensor, num_pages: torch.Tensor, tail: torch.Tensor,
                           tail_slot: torch.Tensor, tail_len: torch.Tensor,
                           static_scales: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract, built from ``kvwire.quant.dequantize_pages`` + ``attend_paged_reference``."""
    f = page_format
    p = f.page_size
    res = torch.empty_like(q) if out is None else out
    for b in range(q.shape[0]):
        n = int(num_pages[b])
        tl_ = int(tail_len[b])
        slot = int(tail_slot[b])
        pages = page_table[b, :n]
        kp = read_pages_reference(storage, f, layer, 0, pages, static_scales)
        vp = read_pages_reference(storage, f, layer, 1, pages, static_scales)
        k_open = tail[slot, layer, 0, :, :tl_].transpose(0, 1)
        v_open = tail[slot, layer, 1, :, :tl_].transpose(0, 1)
        pos = torch.tensor([n * p + tl_ - 1], device=q.device)
        res[b] = attend_paged_reference(q[b:b + 1], pos, kp.to(q.device), vp.to(q.device),
                                        k_open.to(q.device), v_open.to(q.device), n * p, p)[0]
    return res


# ---- benchmark -----------------------------------------------------------------------------------

def kv_bytes_read(page_format: PageFormat, total_pages: int, tail_tokens: int) -> int:
    """Compact bytes one layer's decode reads: K and V sections of every page plus the bf16 tail."""
    from kvwire.kernels.quantize import written_bytes
    f = page_format
    return (written_bytes(f, 0, total_pages) + written_bytes(f, 1, total_pages)
            + tail_tokens * 2 * f.num_kv_heads * f.head_dim * 2)


def benchmark(page_format: PageFormat, batch: int, context: int, num_q_heads: int = 32,
              device: str = "cuda", **launch) -> dict:
    """Median time of one layer's decode at ``batch`` x ``context`` (pages filled with random data)."""
    from kvwire.bench.attention import build_problem, time_fn  # noqa: PLC0415
    prob = build_problem(page_format, batch, context, num_q_heads, device)
    ms = time_fn(lambda: paged_decode_attention(*prob.args, out=prob.out, **launch))
    nbytes = kv_bytes_read(page_format, prob.total_pages, prob.tail_tokens)
    return {"format": page_format.name, "batch": batch, "context": context, "ms": ms, "bytes": nbytes,
            "tb_per_s": nbytes / ms / 1e9}
