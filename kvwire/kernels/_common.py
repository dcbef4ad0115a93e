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


def _part_sections(page_format: PageFormat, part: int) -> tuple[str | None, str | None, str | None, str | None]:
    """Names of (data, token/page scale, nvfp4 block scale, nvfp4 global scale) for ``part``; None if absent."""
    fmt = page_format.part_format(part)
    if fmt.element is ElementType.FP8 and fmt.granularity is Granularity.TOKEN:
        return "data", "token_scale", None, None
    if fmt.element is ElementType.FP8 and fmt.granularity is Granularity.PAGE:
        return "data", "page_scale", None, None
    if fmt.element is ElementType.NVFP4:
        return "data", None, "block_scale", "global_scale"
    return "data", None, None, None


def part_offsets(page_format: PageFormat, layer: int, part: int) -> tuple[int, int, int, int]:
    """Byte offsets in a page of (data, token/page scale, nvfp4 block scale, nvfp4 global scale); 0 if absent."""
    return tuple(page_format.section(layer, part, n).offset if n else 0 for n in _part_sections(page_format, part))


def part_layer_strides(page_format: PageFormat, part: int) -> tuple[int, int, int, int]:
    """``PageFormat.layer_stride`` of each of part_offsets' sections; 0 where absent."""
    return tuple(page_format.layer_stride(part, n) if n else 0 for n in _part_sections(page_format, part))


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
def rounded(x, dt: tl.constexpr):
    """fp32 ``x`` rounded to ``dt`` (bf16: to nearest even; fp32: as is), still in fp32. A cast
    pair would say the same, but the compiler folds it away (kvwire.kernels.model_ops)."""
    if dt == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        return tl.where(x == x, r, x)           # NaN stays NaN
    else:
        return x


@triton.jit
def bf16_bits_to_f32(x16):
    """int16 bf16 bit patterns -> fp32 (exact)."""
    return (x16.to(tl.int32) << 16).to(tl.float32, bitcast=True)


_SM_COUNT: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached: split heuristics ask on every call)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def partials(shape: tuple[int, ...], device: torch.device, hw: bool) -> torch.Tensor:
    """An fp32 buffer for split partials: uninitialised on the GPU; NaN in CPU test runs
    (interpreter, emulator), so that a split which writes none fails instead of reading leftovers."""
    if hw:
        return torch.empty(shape, dtype=torch.float32, device=device)
    return torch.full(shape, float("nan"), dtype=torch.float32, device=device)


def pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))
