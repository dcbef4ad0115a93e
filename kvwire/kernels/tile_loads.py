"""Page tiles inside the Triton kernels: reads of a page section into a dot-ready tile.

Each loader takes BN tokens (their pages' byte offsets ``base``, rows in the page, a validity mask)
and returns the [BN, D] tile of one part (keys or values) of one KV head, plus, where the format
has one, a per-token column scale: ``load_kv_tile`` for every format; the NVFP4 variants for the
decode kernels' packed order (``load_nvfp4_ab``) and for a per-token factor folded into the block
scales (``load_nvfp4_tile_folded``); ``load_fp8_codes`` for E4M3 bytes as stored. The byte layout
they read is the format contract of kvwire/formats.py; ``HW`` picks the GPU path (hardware
conversions, inline PTX) or the interpreter's (integer decoding), as in ``_common``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kvwire.kernels._common import bf16_bits_to_f32, e2m1_value, e4m3_decode


# E2M1 codes in the 32-bit word $4 (8 codes, low nibble first) -> E4M3 bytes of value * 2^-6, placed by
# bit operations on whole words (4 codes per instruction): ``lo`` from the low nibbles, ``hi`` from the
# high ones. Both NVFP4 unpackers below start with it; they differ in the order they hand values out.
_E2M1_TO_E4M3_PTX = """
        and.b32 lo, $4, 0x07070707;
        shl.b32 lo, lo, 2;
        and.b32 t, $4, 0x08080808;
        shl.b32 t, t, 4;
        or.b32 lo, lo, t;
        and.b32 hi, $4, 0x70707070;
        shr.b32 hi, hi, 2;
        and.b32 t, $4, 0x80808080;
        or.b32 hi, hi, t;
"""


def _unpack_ptx(regs: str, arrange: str, halves: tuple[str, str, str, str], scales: tuple[str, str]) -> str:
    """An unpacker's PTX: the placement, ``arrange`` (moves ``lo``/``hi`` into the 16-bit ``halves``),
    then each half converted E4M3x2 -> f16x2 into $0..$3 and multiplied by its scale register:
    ``scales[0]`` for $0 and $2, ``scales[1]`` for $1 and $3."""
    convert = "".join(f"        cvt.rn.f16x2.e4m3x2 ${i}, {h};\n" for i, h in enumerate(halves))
    scale = "".join(f"        mul.rn.f16x2 ${i}, ${i}, {scales[i % 2]};\n" for i in range(4))
    head = f"{{\n        .reg .b32 {regs};\n        .reg .b16 {', '.join(halves)};"
    return f"{head}{_E2M1_TO_E4M3_PTX}{arrange}{convert}{scale}}}"


# -> (even d, odd d): the low nibbles' pairs, then the high nibbles', times block scales $5 / $6
_UNPACK_EVEN_ODD_PTX = tl.constexpr(_unpack_ptx(
    "lo, hi, t", "        mov.b32 {l0, l1}, lo;\n        mov.b32 {h0, h1}, hi;\n",
    ("l0", "l1", "h0", "h1"), ("$5", "$6")))
# -> natural order (d0..d3, d4..d7): two byte permutes interleave lo and hi; one block scale ($5)
_UNPACK_NATURAL_PTX = tl.constexpr(_unpack_ptx(
    "lo, hi, t, a, b",
    "        prmt.b32 a, lo, hi, 0x5140;\n        prmt.b32 b, lo, hi, 0x7362;\n"
    "        mov.b32 {a0, a1}, a;\n        mov.b32 {b0, b1}, b;\n",
    ("a0", "a1", "b0", "b1"), ("$5", "$5")))


@triton.jit
def _nvfp4_unpack_asm(packed, scale):
    """4 bytes (8 E2M1 codes) x fp16 block scales -> (even-d, odd-d) fp16 values, each times 2**-6:
    ``_E2M1_TO_E4M3_PTX``, the hardware pair conversion E4M3x2 -> f16x2 and an f16x2 multiply."""
    return tl.inline_asm_elementwise(
        asm=_UNPACK_EVEN_ODD_PTX,
        constraints="=r,=r,=r,=r,r,r,r",
        args=[packed, scale],
        dtype=(tl.float16, tl.float16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _fp8_to_f16_asm(u8):
    """E4M3 bytes -> fp16 by the hardware pair conversion, as an opaque op (keeps the conversion
    in the load layout instead of being hoisted into byte-wise shared-memory reads)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b16 a, b;
        mov.b32 {a, b}, $2;
        cvt.rn.f16x2.e4m3x2 $0, a;
        cvt.rn.f16x2.e4m3x2 $1, b;
        }
        """,
        constraints="=r,=r,r",
        args=[u8],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )


@triton.jit
def load_kv_tile(st8, st16, st32, base, row, valid, h, data_off, s_off, bs_off, gs_off,
                 ELEM: tl.constexpr, GRAN: tl.constexpr, P: tl.constexpr, D: tl.constexpr,
                 BLOCK_D: tl.constexpr, BN: tl.constexpr, HW: tl.constexpr, NV_ASM: tl.constexpr,
                 FP8_ASM: tl.constexpr = False):
    """One part's tile ``[BN, BLOCK_D]`` for BN tokens, plus a per-token column scale ``[BN]``.

    base: int64 [BN] byte offset of each token's page; row: [BN] token index in its page;
    valid: [BN] mask (invalid tokens read as 0 with column scale 0). The tile is in the dot's
    dtype (bf16 for bf16 pages, fp16 for fp8/nvfp4 on the GPU; fp32 in the interpreter); the real
    value is ``tile * colscale`` (times the static scale for fp8 tensor/head granularity).
    """
    hp = (h * P + row).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    if BLOCK_D == D:
        m = valid[:, None]                      # no head-dim mask: keeps loads vectorised
    else:
        m = valid[:, None] & (d[None, :] < D)
    if ELEM == 0:
        offs = (base + data_off) // 2 + hp * D
        raw = tl.load(st16 + (offs[:, None] + d[None, :]), mask=m, other=0)
        if HW:
            tile = raw
        else:
            tile = bf16_bits_to_f32(raw)
        cs = tl.where(valid, 1.0, 0.0)
    elif ELEM == 1:
        offs = base + data_off + hp * D
        u8 = tl.load(st8 + (offs[:, None] + d[None, :]), mask=m, other=0)
        if HW:
            if FP8_ASM:
                tile = _fp8_to_f16_asm(u8)
            else:
                tile = u8.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        else:
            tile = u8.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        if GRAN == 1:
            cs = tl.load(st32 + ((base + s_off) // 4 + hp), mask=valid, other=0.0)
        elif GRAN == 2:
            cs = tl.load(st32 + ((base + s_off) // 4 + h), mask=valid, other=0.0)
        else:
            cs = tl.where(valid, 1.0, 0.0)
    else:
        u8, bs = _nvfp4_codes(st8, base, hp, valid, data_off, bs_off, D, BLOCK_D, BN)
        glob = tl.load(st32 + ((base + gs_off) // 4 + h), mask=valid, other=0.0)
        if HW:
            tile = _nvfp4_hw_tile(u8, bs.to(tl.float8e4nv, bitcast=True).to(tl.float16), BLOCK_D, BN, NV_ASM)
            cs = glob * 64.0
        else:
            bsf = e4m3_decode(bs.to(tl.int32))
            c = u8.to(tl.int32)
            lo = e2m1_value(c & 15) * bsf[:, :, None]
            hi = e2m1_value(c >> 4) * bsf[:, :, None]
            tile = tl.reshape(tl.join(lo, hi), [BN, BLOCK_D])
            cs = glob
    return tile, cs


@triton.jit
def _nvfp4_codes(st8, base, hp, valid, data_off, bs_off, D: tl.constexpr, BLOCK_D: tl.constexpr, BN: tl.constexpr):
    """NVFP4 codes [BN, D/16, 8] (two per byte) and E4M3 block-scale bytes [BN, D/16] of BN tokens."""
    NB: tl.constexpr = D // 16
    BLOCK_NB: tl.constexpr = BLOCK_D // 16
    j = tl.arange(0, BLOCK_NB)
    dh = tl.arange(0, BLOCK_D // 2)
    offs = base + data_off + hp * (D // 2)
    m2d = valid[:, None] & (dh < D // 2)[None, :]
    u8 = tl.load(st8 + (offs[:, None] + dh[None, :]), mask=m2d, other=0)
    u8 = tl.reshape(u8, [BN, BLOCK_NB, 8])
    m2 = valid[:, None] & (j < NB)[None, :]
    bs = tl.load(st8 + ((base + bs_off + hp * NB)[:, None] + j[None, :]), mask=m2, other=0)
    return u8, bs


@triton.jit
def _nvfp4_hw_tile(u8, bsf, BLOCK_D: tl.constexpr, BN: tl.constexpr, NV_ASM: tl.constexpr):
    """Codes [BN, D/16, 8] x fp16 block scales [BN, D/16] -> fp16 tile [BN, BLOCK_D] of value * 2^-6 (GPU)."""
    if NV_ASM:
        lo, hi = _nvfp4_unpack_asm(u8, bsf[:, :, None])
    else:
        e_lo = ((u8 & 7) << 2) | ((u8 & 8) << 4)
        e_hi = ((u8 >> 2) & 0x1C) | (u8 & 0x80)
        lo = e_lo.to(tl.float8e4nv, bitcast=True).to(tl.float16) * bsf[:, :, None]
        hi = e_hi.to(tl.float8e4nv, bitcast=True).to(tl.float16) * bsf[:, :, None]
    return tl.reshape(tl.join(lo, hi), [BN, BLOCK_D])


@triton.jit
def load_fp8_codes(st8, base, row, valid, h, data_off, P: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """E4M3 elements [BN, BLOCK_D] of BN tokens' rows (0 for invalid tokens), as stored, in the
    element type of ``st8`` (a float8e4nv view keeps them loadable straight into a dot operand)."""
    hp = (h * P + row).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    m = valid[:, None] & (d < D)[None, :] if BLOCK_D != D else valid[:, None]
    return tl.load(st8 + ((base + data_off + hp * D)[:, None] + d[None, :]), mask=m)


@triton.jit
def load_nvfp4_tile_folded(st8, base, row, valid, h, data_off, bs_off, fold, P: tl.constexpr, D: tl.constexpr,
                           BLOCK_D: tl.constexpr, BN: tl.constexpr, NV_ASM: tl.constexpr):
    """NVFP4 tile [BN, BLOCK_D] in fp16 (GPU only) whose token t holds its codes x block scales x
    ``fold[t]`` x 2^-6: a per-token factor (the global scale over a reference) applied to the
    [BN, D/16] block scales instead of the [BN, D] tile, 1/16 of the multiplies. The caller keeps
    bs x fold in fp16 range (block scales are <= 448)."""
    hp = (h * P + row).to(tl.int64)
    u8, bs = _nvfp4_codes(st8, base, hp, valid, data_off, bs_off, D, BLOCK_D, BN)
    bsf = (bs.to(tl.float8e4nv, bitcast=True).to(tl.float32) * fold[:, None]).to(tl.float16)
    return _nvfp4_hw_tile(u8, bsf, BLOCK_D, BN, NV_ASM)


@triton.jit
def _nvfp4_unpack_ab_asm(packed, scale):
    """4 bytes = E2M1 codes of d0..d7 (low nibble first), times an fp16 block scale ->
    a = (d0, d1, d2, d3), b = (d4, d5, d6, d7) as fp16, each times 2**-6 (``_UNPACK_NATURAL_PTX``).

    Not elementwise in Triton's sense: it relies on each pack of 4 being 4 consecutive bytes
    starting at a multiple of 4 (true for the blocked layouts these loads get; the GPU tests
    check it).
    """
    return tl.inline_asm_elementwise(
        asm=_UNPACK_NATURAL_PTX,
        constraints="=r,=r,=r,=r,r,r,r",
        args=[packed, scale],
        dtype=(tl.float16, tl.float16),
        is_pure=False,
        pack=4,
    )


@triton.jit
def nvfp4_perm(k, BLOCK_D: tl.constexpr):
    """Column k of the a/b half tiles -> head-dim index: a holds d = 8*(k//4) + k%4, b the same + 4."""
    return 8 * (k // 4) + k % 4


@triton.jit
def load_q_operands(qrow, rows_valid, sq_d, K_ELEM: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    HW: tl.constexpr):
    """q of the rows at pointers ``qrow`` [R, 1] (rows past ``rows_valid`` read 0) as the score
    dot's operand: ``(qk, qa, qb)``. NVFP4 keys take the half tiles ``qa``/``qb`` in the permuted
    head-dim order of ``load_nvfp4_ab`` (``qk`` is ``qa``); other keys take ``qk`` [R, BLOCK_D] in
    the dot's dtype (bf16 for bf16 keys, fp16 for FP8, fp32 in the interpreter; ``qa``/``qb`` are
    ``qk``)."""
    if K_ELEM == 2:
        dperm = nvfp4_perm(tl.arange(0, BLOCK_D // 2), BLOCK_D)
        hmask = rows_valid[:, None] & (dperm < D)[None, :]
        qa = tl.load(qrow + dperm[None, :].to(tl.int64) * sq_d, mask=hmask, other=0.0).to(tl.float32)
        qb = tl.load(qrow + (dperm + 4)[None, :].to(tl.int64) * sq_d, mask=hmask, other=0.0).to(tl.float32)
        if HW:
            qa = qa.to(tl.float16)
            qb = qb.to(tl.float16)
        return qa, qa, qb
    else:
        d = tl.arange(0, BLOCK_D)
        q = tl.load(qrow + d[None, :].to(tl.int64) * sq_d, mask=rows_valid[:, None] & (d < D)[None, :],
                    other=0.0).to(tl.float32)
        if HW:
            if K_ELEM == 0:
                q = q.to(tl.bfloat16)
            else:
                q = q.to(tl.float16)
        return q, q, q


@triton.jit
def load_nvfp4_ab(st8, st32, base, row, valid, h, data_off, bs_off, gs_off,
                  P: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BN: tl.constexpr, HW: tl.constexpr):
    """NVFP4 tile as two half tiles ``a``, ``b`` [BN, BLOCK_D/2] in permuted head-dim order
    (see ``nvfp4_perm``), plus the per-token column scale. Values are ``a * colscale``."""
    hp = (h * P + row).to(tl.int64)
    NB: tl.constexpr = D // 16
    BLOCK_NB: tl.constexpr = BLOCK_D // 16
    j = tl.arange(0, BLOCK_NB)
    dh = tl.arange(0, BLOCK_D // 2)
    offs = base + data_off + hp * (D // 2)
    if BLOCK_D == D:
        m2d = valid[:, None]
        m2 = valid[:, None]
    else:
        m2d = valid[:, None] & (dh < D // 2)[None, :]
        m2 = valid[:, None] & (j < NB)[None, :]
    u8 = tl.load(st8 + (offs[:, None] + dh[None, :]), mask=m2d, other=0)
    bs = tl.load(st8 + ((base + bs_off + hp * NB)[:, None] + j[None, :]), mask=m2, other=0)
    glob = tl.load(st32 + ((base + gs_off) // 4 + h), mask=valid, other=0.0)
    if HW:
        bsf = bs.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        bsb = tl.reshape(tl.broadcast_to(bsf[:, :, None], [BN, BLOCK_NB, 8]), [BN, BLOCK_D // 2])
        a, b = _nvfp4_unpack_ab_asm(u8, bsb)
        cs = glob * 64.0
    else:
        bsf = e4m3_decode(bs.to(tl.int32))
        c = u8.to(tl.int32)
        lo = e2m1_value(c & 15)
        hi = e2m1_value(c >> 4)
        nat = tl.reshape(tl.join(lo, hi), [BN, BLOCK_NB, 16]) * bsf[:, :, None]     # natural order
        nat = tl.permute(tl.reshape(nat, [BN, BLOCK_D // 8, 2, 4]), [0, 1, 3, 2])   # [.., 4, 2]
        a, b = tl.split(nat)
        a = tl.reshape(a, [BN, BLOCK_D // 2])
        b = tl.reshape(b, [BN, BLOCK_D // 2])
        cs = glob
    return a, b, cs


@triton.jit
def load_colscale(st32, base, row, valid, h, s_off, gs_off, ELEM: tl.constexpr, GRAN: tl.constexpr,
                  P: tl.constexpr, HW: tl.constexpr):
    """The per-token column scale ``load_kv_tile`` / ``load_nvfp4_ab`` return, on its own."""
    if ELEM == 2:
        cs = tl.load(st32 + ((base + gs_off) // 4 + h), mask=valid, other=0.0)
        if HW:
            cs = cs * 64.0
    elif ELEM == 1 and GRAN == 1:
        cs = tl.load(st32 + ((base + s_off) // 4 + (h * P + row).to(tl.int64)), mask=valid, other=0.0)
    elif ELEM == 1 and GRAN == 2:
        cs = tl.load(st32 + ((base + s_off) // 4 + h), mask=valid, other=0.0)
    else:
        cs = tl.where(valid, 1.0, 0.0)
    return cs
