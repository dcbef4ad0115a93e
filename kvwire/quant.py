"""Reference quantisers for the page formats (torch; also the CPU execution path).

Everything here is exact and deterministic: these functions *define* the bytes of a page (see
``kvwire.formats`` for the contract); the Triton kernels are tested bit-for-bit against them.

The public API for one tensor::

    enc = encode(x, "fp8-token")        # x: [tokens, kv_heads, head_dim], float or bf16
    y = decode(enc)                     # float32, same shape
    enc.nbytes                          # compact bytes (data + scales)

``encode`` treats the tokens given as one page, so ``page`` granularity and the NVFP4 global
scale cover all of them. Static granularities (``tensor``, ``head``) need ``static_scale``
(shape [kv_heads]); ``calibrate_static_scale`` makes one from sample data.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvwire.formats import (
    E2M1_MAX, FP8_MAX, NVFP4_BLOCK, ElementType, Granularity, TensorFormat, _parse_part,
)

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                            -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
_E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


class NonFiniteInputError(ValueError):
    """K/V values contained NaN or inf: quantising them would store silent garbage."""


def non_finite_error(bad: int) -> NonFiniteInputError:
    return NonFiniteInputError(f"cannot quantise K/V with {bad} non-finite value(s) (NaN or inf)")


def check_finite(x: torch.Tensor) -> None:
    if not bool(torch.isfinite(x).all()):
        raise non_finite_error(int((~torch.isfinite(x)).sum()))


class NonFiniteCount:
    """A count of non-finite K/V values on the device, shared by many page writes and checked once.

    ``kvwire.kernels.quantize.write_pages(..., nonfinite=count)`` adds its kernel's count here
    instead of reading it back: a read is a host sync, and one per layer and K/V stalls the CPU's
    launch queue through a whole forward. The model runner checks once, after the forward, before
    anything is committed (``raise_if_any``: one sync, then ``NonFiniteInputError``).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.tensor = torch.zeros(1, dtype=torch.int32, device=device)

    def raise_if_any(self) -> None:
        """Raise ``NonFiniteInputError`` if any write counted a NaN or inf (and reset the count)."""
        bad = int(self.tensor.item())
        if bad:
            self.tensor.zero_()
            raise non_finite_error(bad)


# ---- element codecs ---------------------------------------------------------------------------

def fp8_encode(y: torch.Tensor) -> torch.Tensor:
    """float32 (already divided by its scale) -> E4M3 bits as uint8; saturates at +-448, RNE."""
    return y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def fp8_decode(bits: torch.Tensor) -> torch.Tensor:
    return bits.view(torch.float8_e4m3fn).to(torch.float32)


def e2m1_encode(y: torch.Tensor) -> torch.Tensor:
    """float32 -> E2M1 codes (uint8 in 0..15): nearest magnitude, ties to even, saturate at 6.

    The sign bit is kept for negative zero and for negatives that round to zero.
    """
    mag = y.abs().clamp(max=E2M1_MAX)
    mids = _E2M1_MIDPOINTS.to(y.device)
    idx = torch.bucketize(mag, mids, right=False)
    # bucketize sends a tie to the lower code; ties go to the even code instead.
    tie = (idx < len(mids)) & (mag == mids[idx.clamp(max=len(mids) - 1)]) & (idx % 2 == 1)
    idx = idx + tie.to(idx.dtype)
    sign = torch.signbit(y).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    return E2M1_VALUES.to(codes.device)[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] codes -> [..., D/2] bytes, element 2i in the low nibble, 2i+1 in the high one."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    out = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def scale_from_amax(amax: torch.Tensor, limit: float) -> torch.Tensor:
    """``amax / limit``, or 1 where that is 0: an all-zero group, and one whose amax is so small
    (below about 3e-43) that the quotient underflows; a zero scale would store 0/0 = NaN codes.
    With scale 1 such values encode as 0. The kernels apply the same rule to the same quotient."""
    # Divide by a tensor, not a Python float: CUDA turns ``tensor / scalar`` into a multiply by the
    # reciprocal, which rounds differently and would make a page's bytes depend on the device.
    q = amax / torch.full_like(amax, limit)
    return torch.where(q > 0, q, torch.ones_like(q))


# ---- page-batch quantisers: x is [n_pages, P, H, D]; sections are [n_pages, *section shape] ----

def quantize_pages(x: torch.Tensor, fmt: TensorFormat,
                   static_scale: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Quantise ``n`` full pages of one layer's K or V into the sections of ``fmt``.

    Returns tensors shaped like ``TensorFormat.sections`` with a leading page dimension, in the
    storage dtype of each section (uint8 bits for E4M3/E2M1).
    """
    if x.dim() != 4:
        raise ValueError(f"expected [pages, page_size, heads, head_dim], got shape {tuple(x.shape)}")
    x = x.to(torch.float32)
    check_finite(x)
    xh = x.permute(0, 2, 1, 3)  # [n, H, P, D]: the stored order
    if fmt.element is ElementType.BF16:
        return {"data": xh.to(torch.bfloat16).contiguous()}
    if fmt.element is ElementType.FP8:
        return _quantize_fp8(xh, fmt.granularity, static_scale)
    return _quantize_nvfp4(xh)


def _quantize_fp8(xh: torch.Tensor, gran: Granularity,
                  static_scale: torch.Tensor | None) -> dict[str, torch.Tensor]:
    h = xh.shape[1]
    if gran is Granularity.TOKEN:
        scale = scale_from_amax(xh.abs().amax(dim=-1), FP8_MAX)          # [n, H, P]
        return {"data": fp8_encode(xh / scale[..., None]), "token_scale": scale}
    if gran is Granularity.PAGE:
        scale = scale_from_amax(xh.abs().amax(dim=(-2, -1)), FP8_MAX)    # [n, H]
        return {"data": fp8_encode(xh / scale[..., None, None]), "page_scale": scale}
    if static_scale is None or static_scale.shape != (h,):
        raise ValueError(f"fp8-{gran.value} needs a static scale of shape [{h}]")
    s = static_scale.to(device=xh.device, dtype=torch.float32)
    return {"data": fp8_encode(xh / s[None, :, None, None])}


def _quantize_nvfp4(xh: torch.Tensor) -> dict[str, torch.Tensor]:
    n, h, p, d = xh.shape
    glob = scale_from_amax(xh.abs().amax(dim=(-2, -1)), E2M1_MAX * FP8_MAX)       # [n, H]
    blocks = xh.reshape(n, h, p, d // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = blocks.abs().amax(dim=-1)                                           # [n, H, P, D/16]
    block_bits = fp8_encode(block_amax / (E2M1_MAX * glob[..., None, None]))
    scale = fp8_decode(block_bits) * glob[..., None, None]                           # block * global
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = torch.where(scale[..., None] > 0, blocks / safe[..., None], blocks * 0)
    codes = e2m1_encode(y).reshape(n, h, p, d)
    return {"data": pack_nibbles(codes), "block_scale": block_bits, "global_scale": glob}


def dequantize_pages(sections: dict[str, torch.Tensor], fmt: TensorFormat,
                     static_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of ``quantize_pages``: sections -> float32 [n_pages, P, H, D]."""
    data = sections["data"]
    if fmt.element is ElementType.BF16:
        xh = data.to(torch.float32)
    elif fmt.element is ElementType.FP8:
        vals = fp8_decode(data)
        if fmt.granularity is Granularity.TOKEN:
            xh = vals * sections["token_scale"][..., None]
        elif fmt.granularity is Granularity.PAGE:
            xh = vals * sections["page_scale"][..., None, None]
        else:
            if static_scale is None:
                raise ValueError(f"{fmt.name} needs its static scale to decode")
            xh = vals * static_scale.to(device=vals.device, dtype=torch.float32)[None, :, None, None]
    else:
        codes = unpack_nibbles(data)
        n, h, p, d = codes.shape
        scale = fp8_decode(sections["block_scale"]) * sections["global_scale"][..., None, None]
        vals = e2m1_decode(codes).reshape(n, h, p, d // NVFP4_BLOCK, NVFP4_BLOCK)
        xh = (vals * scale[..., None]).reshape(n, h, p, d)
    return xh.permute(0, 2, 1, 3).contiguous()


def calibrate_static_scale(samples: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """Static fp8 scale [H] from sample K or V values [tokens, H, D]: amax / 448.

    ``tensor`` gives every head the same scale; ``head`` one each.
    """
    check_finite(samples.float())
    if granularity is Granularity.HEAD:
        amax = samples.float().abs().amax(dim=(0, 2))
    elif granularity is Granularity.TENSOR:
        amax = samples.float().abs().amax().expand(samples.shape[1]).clone()
    else:
        raise ValueError(f"granularity {granularity.value} has no static scale")
    return scale_from_amax(amax, FP8_MAX)


# ---- the one-tensor API -----------------------------------------------------------------------

@dataclass(frozen=True)
class Encoded:
    """A [tokens, kv_heads, head_dim] tensor in a format's compact form (one page of ``tokens``)."""

    format: TensorFormat
    shape: tuple[int, int, int]
    sections: dict[str, torch.Tensor]
    static_scale: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Compact bytes, page-resident scales included (static scales travel separately)."""
        return sum(t.numel() * t.element_size() for t in self.sections.values())


def _as_format(fmt: str | TensorFormat) -> TensorFormat:
    return fmt if isinstance(fmt, TensorFormat) else _parse_part(fmt)


def encode(x: torch.Tensor, fmt: str | TensorFormat, static_scale: torch.Tensor | None = None) -> Encoded:
    """Encode [tokens, kv_heads, head_dim] into ``fmt`` (a name like "fp8-token" or a TensorFormat)."""
    fmt = _as_format(fmt)
    if x.dim() != 3:
        raise ValueError(f"expected [tokens, kv_heads, head_dim], got shape {tuple(x.shape)}")
    if fmt.element is ElementType.NVFP4 and x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"nvfp4 needs head_dim divisible by {NVFP4_BLOCK}, got {x.shape[-1]}")
    sections = {k: v[0] for k, v in quantize_pages(x[None], fmt, static_scale).items()}
    return Encoded(fmt, tuple(x.shape), sections, static_scale)


def decode(enc: Encoded) -> torch.Tensor:
    """Decode an ``Encoded`` back to float32 [tokens, kv_heads, head_dim]."""
    sections = {k: v[None] for k, v in enc.sections.items()}
    return dequantize_pages(sections, enc.format, enc.static_scale)[0]
