"""Shared pieces of the Triton kernels: page-section views, torch readers and in-kernel codecs.

The kernels address the page pool as raw bytes: ``storage`` is ``uint8 [num_pages, page_bytes]``
and a (layer, part, section) lives at ``page * page_bytes + PageFormat.section(...).offset``.
Every byte offset is computed in int64, so pools past 2**31 bytes and page tables past 65,536
pages are fine.

Two code paths share each kernel, chosen by the constexpr ``HW``:

- ``HW=True`` (a GPU): hardware conversions (fp32 -> E4M3 ``cvt.rn.satfinite``, E4M3 -> fp16),
  fp16/bf16 tensor-core dots with fp32 accumulation, packed 32-bit NVFP4 unpacking in inline PTX.
- ``HW=False`` (the Triton interpreter, ``TRITON_INTERPRET=1``): integer bit operations for the
  fp32 -> E4M3 encoding (the interpreter's cast rounds wrongly and does not saturate) and fp32
  dots (its bf16 dot is wrong). The GPU tests run this path on the GPU too, so both are checked
  against the same torch reference.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kvwire.formats import ElementType, Granularity, PageFormat, TensorFormat
from kvwire.quant import dequantize_pages

_DTYPES = {"bfloat16": torch.bfloat16, "uint8": torch.uint8, "float32": torch.float32}

# constexpr codes for element types and scale granularities
ELEM_BF16, ELEM_FP8, ELEM_NVFP4 = 0, 1, 2
GRAN_NONE, GRAN_TOKEN, GRAN_PAGE, GRAN_STATIC = 0, 1, 2, 3


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _patch_interpreter_index() -> None:
    """Make ``range(runtime_value)`` work in Triton 3.6's interpreter under numpy >= 2.

    The interpreter holds every scalar as a 1-element array and converts it for ``range`` with
    ``int(array)``, which numpy 2 refuses for arrays of one dimension; so any loop bound that is a
    kernel argument or a loaded value fails. Only the interpreter is touched, and only ``__index__``.
    """
    try:
        from triton.runtime import interpreter as _interp
    except ImportError:  # pragma: no cover
        return
    orig = getattr(_interp, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_kvwire_patched", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._kvwire_patched = True
    _interp._patch_lang_tensor = patched


if interpreting():
    _patch_interpreter_index()


def use_triton(t: torch.Tensor) -> bool:
    """Run the Triton kernel for tensors on ``t``'s device (else the torch reference path)."""
    return t.is_cuda or interpreting()


def elem_code(fmt: TensorFormat) -> int:
    return {ElementType.BF16: ELEM_BF16, ElementType.FP8: ELEM_FP8, ElementType.NVFP4: ELEM_NVFP4}[fmt.element]


def gran_code(fmt: TensorFormat) -> int:
    if fmt.element is not ElementType.FP8:
        return GRAN_NONE
    return {Granularity.TOKEN: GRAN_TOKEN, Granularity.PAGE: GRAN_PAGE,
            Granularity.TENSOR: GRAN_STATIC, Granularity.HEAD: GRAN_STATIC}[fmt.granularity]


def part_offsets(page_format: PageFormat, layer: int, part: int) -> tuple[int, int, int, int]:
    """Byte offsets in a page of (data, token/page scale, nvfp4 block scale, nvfp4 global scale); 0 if absent."""
    fmt = page_format.part_format(part)
    data = page_format.section(layer, part, "data").offset
    scale = bscale = gscale = 0
    if fmt.element is ElementType.FP8 and fmt.granularity is Granularity.TOKEN:
        scale = page_format.section(layer, part, "token_scale").offset
    elif fmt.element is ElementType.FP8 and fmt.granularity is Granularity.PAGE:
        scale = page_format.section(layer, part, "page_scale").offset
    elif fmt.element is ElementType.NVFP4:
        bscale = page_format.section(layer, part, "block_scale").offset
        gscale = page_format.section(layer, part, "global_scale").offset
    return data, scale, bscale, gscale


def check_storage(storage: torch.Tensor, page_format: PageFormat) -> None:
    if storage.dtype != torch.uint8 or storage.dim() != 2 or storage.shape[1] != page_format.page_bytes:
        raise ValueError(f"storage must be uint8 [num_pages, {page_format.page_bytes}] for format "
                         f"{page_format.name}, got {storage.dtype} {tuple(storage.shape)}")
    if not storage.is_contiguous():
        raise ValueError("storage must be contiguous")


def static_scale_for(page_format: PageFormat, static_scales: torch.Tensor | None, layer: int,
                     part: int) -> torch.Tensor | None:
    """The [H] static fp8 scale of (layer, part) when its format needs one, else None."""
    if not page_format.part_format(part).has_static_scales:
        return None
    if static_scales is None:
        raise ValueError(f"format {page_format.name} needs static scales [layers, 2, kv_heads]")
    f = page_format
    if tuple(static_scales.shape) != (f.num_layers, 2, f.num_kv_heads):
        raise ValueError(f"static scales must be [{f.num_layers}, 2, {f.num_kv_heads}], "
                         f"got {tuple(static_scales.shape)}")
    return static_scales[layer, part]


def static_arg(page_format: PageFormat, static_scales: torch.Tensor | None, device) -> torch.Tensor:
    """The [L, 2, H] fp32 static scales for a kernel (a dummy when the format has none).

    The kernels read it only for static (tensor/head) granularities, so the dummy is left
    uninitialised: filling it would cost a kernel launch on every decode step."""
    needs = page_format.kv.key.has_static_scales or page_format.kv.value.has_static_scales
    if not needs:
        return torch.empty(1, dtype=torch.float32, device=device)
    for part in (0, 1):
        static_scale_for(page_format, static_scales, 0, part)
    return static_scales.to(device=device, dtype=torch.float32).contiguous()


# ---- torch readers (reference / CPU path) --------------------------------------------------------

def section_view(storage: torch.Tensor, page_format: PageFormat, layer: int, part: int, name: str) -> torch.Tensor:
    """Typed view ``[num_pages, *shape]`` of one section of every page (as PagePool.section)."""
    sec = page_format.section(layer, part, name)
    raw = storage[:, sec.offset:sec.offset + sec.nbytes]
    return raw.view(_DTYPES[sec.dtype]).view(storage.shape[0], *sec.shape)


def read_pages_reference(storage: torch.Tensor, page_format: PageFormat, layer: int, part: int,
                         page_ids: torch.Tensor, static_scales: torch.Tensor | None = None) -> torch.Tensor:
    """Pages as stored, decoded to float32 ``[n * P, H, D]`` by ``kvwire.quant.dequantize_pages``."""
    f = page_format
    fmt = f.part_format(part)
    idx = page_ids.to(device=storage.device, dtype=torch.long)
    if idx.numel() == 0:
        return torch.empty((0, f.num_kv_heads, f.head_dim), dtype=torch.float32, device=storage.device)
    sections = {name: section_view(storage, f, layer, part, name)[idx]
                for name, _, _ in fmt.sections(f.page_size, f.num_kv_heads, f.head_dim)}
    x = dequantize_pages(sections, fmt, static_scale_for(f, static_scales, layer, part))
    return x.reshape(-1, f.num_kv_heads, f.head_dim)


def store_sections(storage: torch.Tensor, page_format: PageFormat, layer: int, part: int,
                   page_ids: torch.Tensor, sections: dict[str, torch.Tensor]) -> None:
    """Store ``quantize_pages`` output into the pages' bytes (as KVCache.write_pages does)."""
    idx = page_ids.to(device=storage.device, dtype=torch.long)
    for name, t in sections.items():
        section_view(storage, page_format, layer, part, name)[idx] = t


# ---- in-kernel codecs ----------------------------------------------------------------------------

@triton.jit
def e4m3_encode(y, HW: tl.constexpr):
    """fp32 already clamped to [-448, 448] -> E4M3 bits (int32 0..255), round to nearest even."""
    if HW:
        return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
    else:
        bits = y.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        a = tl.abs(y)
        abits = a.to(tl.int32, bitcast=True)
        # normal range (a >= 2**-6): round the fp32 mantissa to 3 bits (ties to even), rebias 127 -> 7
        normal = ((abits + 0x7FFFF + ((abits >> 20) & 1)) >> 20) - 960
        # subnormal range: multiples of 2**-9, rounded to nearest even by the 2**23 trick
        sub = (a * 512.0 + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
        code = tl.where(a < 0.015625, sub, normal)
        return code | sign


@triton.jit
def e4m3_decode(b):
    """E4M3 bits (int32 0..255, never NaN) -> fp32, exactly."""
    s = (b & 0x80) << 24
    e = (b >> 3) & 15
    m = b & 7
    normal = (s | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = ((m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True) | s).to(tl.float32, bitcast=True)
    return tl.where(e == 0, sub, normal)


@triton.jit
def e2m1_value(c):
    """E2M1 codes (int32 0..15) -> fp32 values."""
    mag = c & 7
    e = mag >> 1
    mb = mag & 1
    v = tl.where(e == 0, mb.to(tl.float32) * 0.5, ((2 + mb) << e).to(tl.float32) * 0.25)
    return tl.where((c & 8) != 0, -v, v)


@triton.jit
def bf16_bits_to_f32(x16):
    """int16 bf16 bit patterns -> fp32 (exact)."""
    return (x16.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _nvfp4_unpack_asm(packed, scale):
    """4 bytes (8 E2M1 codes) x fp16 block scales -> (even-d, odd-d) fp16 values, each times 2**-6.

    Codes are placed into E4M3 bit fields on whole 32-bit words (4 codes per op), converted by
    the hardware pair conversion E4M3x2 -> f16x2 and multiplied by the scales in f16x2.
    """
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 lo, hi, t;
        .reg .b16 l0, l1, h0, h1;
        and.b32 lo, $4, 0x07070707;
        shl.b32 lo, lo, 2;
        and.b32 t, $4, 0x08080808;
        shl.b32 t, t, 4;
        or.b32 lo, lo, t;
        and.b32 hi, $4, 0x70707070;
        shr.b32 hi, hi, 2;
        and.b32 t, $4, 0x80808080;
        or.b32 hi, hi, t;
        mov.b32 {l0, l1}, lo;
        mov.b32 {h0, h1}, hi;
        cvt.rn.f16x2.e4m3x2 $0, l0;
        cvt.rn.f16x2.e4m3x2 $1, l1;
        cvt.rn.f16x2.e4m3x2 $2, h0;
        cvt.rn.f16x2.e4m3x2 $3, h1;
        mul.rn.f16x2 $0, $0, $5;
        mul.rn.f16x2 $1, $1, $6;
        mul.rn.f16x2 $2, $2, $5;
        mul.rn.f16x2 $3, $3, $6;
        }
        """,
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
    a = (d0, d1, d2, d3), b = (d4, d5, d6, d7) as fp16, each times 2**-6.

    Not elementwise in Triton's sense: it relies on each pack of 4 being 4 consecutive bytes
    starting at a multiple of 4 (true for the blocked layouts these loads get; the GPU tests
    check it). Codes go to E4M3 bit fields on whole words, two byte permutes restore the
    natural order, the hardware converts E4M3x2 -> f16x2 and an f16x2 multiply scales.
    """
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 lo, hi, t, a, b;
        .reg .b16 a0, a1, b0, b1;
        shl.b32 lo, $4, 2;
        and.b32 lo, lo, 0x1C1C1C1C;
        shl.b32 t, $4, 4;
        and.b32 t, t, 0x80808080;
        or.b32 lo, lo, t;
        shr.b32 hi, $4, 2;
        and.b32 hi, hi, 0x1C1C1C1C;
        and.b32 t, $4, 0x80808080;
        or.b32 hi, hi, t;
        prmt.b32 a, lo, hi, 0x5140;
        prmt.b32 b, lo, hi, 0x7362;
        mov.b32 {a0, a1}, a;
        mov.b32 {b0, b1}, b;
        cvt.rn.f16x2.e4m3x2 $0, a0;
        cvt.rn.f16x2.e4m3x2 $1, a1;
        cvt.rn.f16x2.e4m3x2 $2, b0;
        cvt.rn.f16x2.e4m3x2 $3, b1;
        mul.rn.f16x2 $0, $0, $5;
        mul.rn.f16x2 $1, $1, $5;
        mul.rn.f16x2 $2, $2, $5;
        mul.rn.f16x2 $3, $3, $5;
        }
        """,
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


_SM_COUNT: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached: split heuristics ask on every call)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))
