"""The KV page format: the contract between prefill, transfer and decode.

A *page* holds ``page_size`` consecutive tokens of one sequence for **every layer**, keys and
values, data and scales, in one contiguous byte range. One transfer descriptor can therefore
cover a run of consecutive pages (no per-layer descriptor storms).

Byte layout of one page: three groups of sections, in this order. Every offset is 16-byte
aligned; data sections start on 128 bytes (a cache line) and the page size is a multiple of 128::

    for layer in range(num_layers):             # 1. data, each section on a 128-byte line
        for part in (K, V):                     #    each with its own TensorFormat
            data          [Hkv, P, D]    bf16   (2 B)            element bf16
                          [Hkv, P, D]    uint8  (E4M3 bits)      element fp8
                          [Hkv, P, D/2]  uint8  (2 x E2M1)       element nvfp4, low nibble = even d
    for layer in range(num_layers):             # 2. per-token scales
        for part in (K, V):
            token_scale   [Hkv, P]       fp32                    fp8, granularity token
            block_scale   [Hkv, P, D/16] uint8  (E4M3 bits)      nvfp4
    for layer in range(num_layers):             # 3. per-head scales
        for part in (K, V):
            page_scale    [Hkv]          fp32                    fp8, granularity page
            global_scale  [Hkv]          fp32                    nvfp4 (one per page and head)
    padding (never read) to a multiple of 128 bytes

Why this order: a decode kernel reads each head's slice of a data section as whole 128-byte lines,
and a page or section that starts off a line costs an extra line per slice. Version 1 packed every
(layer, part) at 16 bytes, which left mixed and NVFP4 pages (e.g. 26,144 bytes for fp8-token/nvfp4
at 8 heads, D = 128) and the value data of most layers off the line; on an H100 that cost the mixed
formats 0.3-2% of decode time (docs/benchmarks.md, session 30). Putting the small scale sections
after all the data keeps them packed (a head's per-token scales stay within one line where they
fit). Padding: each data section is rounded up to 128 bytes, each scale section to 16, and the
page to 128 (none at 16-token pages with 8 heads and D = 128; 720 bytes, 0.4% of a page, for NVFP4
at 16 tokens, 5 heads, D = 64 and 30 layers; more at odd page sizes such as 3 tokens).

Element formats and what a stored value means (x = the real value):

- ``bf16``: x itself.
- ``fp8`` (E4M3, finite max 448): x ~= e4m3(q) * s. The scale s is fp32 with granularity
  ``tensor`` (one per layer and K/V), ``head`` (one per layer, K/V and KV head), ``page`` (one per
  page, layer, K/V and head) or ``token`` (one per token, layer, K/V and head). ``tensor`` and
  ``head`` scales are *static*: calibrated once at start-up (or given), they are not stored in the
  page but travel with the format in manifests. ``page`` and ``token`` scales are computed when
  the page is written and travel inside it. s = amax / 448 over the scale's group (1.0 for an
  all-zero group); values beyond +-448 s saturate.
- ``nvfp4``: E2M1 codes (magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign), one E4M3 block
  scale per 16 elements along D and one fp32 global scale per page, layer, K/V and head, in
  decode form: global = amax / (6 * 448); block = e4m3(block_amax / (6 * global));
  x ~= e2m1(code) * block * global. Codes round to nearest, ties to even; saturate at 6.

Only full pages are quantised; the open tail page of a sequence stays bf16 outside the pool.
Any change to this layout must bump ``FORMAT_VERSION``: the hash of every PageFormat changes
with it, and a reader refuses pages whose hash it does not know.
"""
from __future__ import annotations

import enum
import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property

FORMAT_VERSION = 2
# Bounds past any model, so that a malformed description (a peer's handshake) is refused before
# the layout, one entry per layer and section, is built: 10**6 layers took 13 s and 3 GiB.
MAX_LAYERS = 4096
MAX_PAGE_ELEMENTS = 2**30
ALIGN = 16        # every section's offset (the kernels' 16-byte vector loads and bulk copies)
LINE = 128        # data sections' offsets and the page size (whole cache lines)
FP8_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16


class UnknownFormatError(ValueError):
    """A KV format name that kvwire does not accept; the message lists what is accepted."""


class ElementType(enum.Enum):
    BF16 = "bf16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"


class Granularity(enum.Enum):
    """What one fp32 scale covers (see the module docstring)."""

    NONE = "none"
    TENSOR = "tensor"
    HEAD = "head"
    PAGE = "page"
    TOKEN = "token"


@dataclass(frozen=True)
class TensorFormat:
    """The format of one of K or V: element type plus scale granularity."""

    element: ElementType
    granularity: Granularity = Granularity.NONE

    def __post_init__(self) -> None:
        allowed = {
            ElementType.BF16: {Granularity.NONE},
            ElementType.FP8: {Granularity.TENSOR, Granularity.HEAD, Granularity.PAGE, Granularity.TOKEN},
            ElementType.NVFP4: {Granularity.PAGE},
        }[self.element]
        if self.granularity not in allowed:
            raise ValueError(f"{self.element.value} does not take granularity {self.granularity.value}")

    @property
    def name(self) -> str:
        if self.element is ElementType.FP8:
            return f"fp8-{self.granularity.value}"
        return self.element.value

    @property
    def has_static_scales(self) -> bool:
        """True when scales are calibrated once and travel with the format, not in pages."""
        return self.granularity in (Granularity.TENSOR, Granularity.HEAD)

    @property
    def bits(self) -> float:
        return {ElementType.BF16: 16, ElementType.FP8: 8, ElementType.NVFP4: 4}[self.element]

    def sections(self, page_size: int, heads: int, head_dim: int) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, storage dtype name) of each section this part stores in a page."""
        p, h, d = page_size, heads, head_dim
        if self.element is ElementType.BF16:
            return [("data", (h, p, d), "bfloat16")]
        if self.element is ElementType.FP8:
            out = [("data", (h, p, d), "uint8")]
            if self.granularity is Granularity.TOKEN:
                out.append(("token_scale", (h, p), "float32"))
            elif self.granularity is Granularity.PAGE:
                out.append(("page_scale", (h,), "float32"))
            return out
        return [
            ("data", (h, p, d // 2), "uint8"),
            ("block_scale", (h, p, d // NVFP4_BLOCK), "uint8"),
            ("global_scale", (h,), "float32"),
        ]


def _parse_part(name: str) -> TensorFormat:
    if name == "bf16":
        return TensorFormat(ElementType.BF16)
    if name == "nvfp4":
        return TensorFormat(ElementType.NVFP4, Granularity.PAGE)
    if name.startswith("fp8-"):
        try:
            gran = Granularity(name[4:])
        except ValueError:
            gran = None
        if gran is not None and gran is not Granularity.NONE:
            return TensorFormat(ElementType.FP8, gran)
    raise UnknownFormatError(name)


@dataclass(frozen=True)
class KVFormat:
    """Formats of keys and values. Named ``X`` when both are X, else ``KEYS/VALUES``.

    Key error moves attention scores before the softmax (it can change which span wins); value
    error only blurs the weighted sum, so FP8 keys with NVFP4 values is a natural mixed choice.
    """

    key: TensorFormat
    value: TensorFormat

    @property
    def name(self) -> str:
        if self.key == self.value:
            return self.key.name
        return f"{self.key.name}/{self.value.name}"

    @classmethod
    def parse(cls, name: str) -> "KVFormat":
        parts = name.strip().split("/")
        try:
            if len(parts) == 1:
                fmt = _parse_part(parts[0])
                return cls(fmt, fmt)
            if len(parts) == 2:
                return cls(_parse_part(parts[0]), _parse_part(parts[1]))
        except UnknownFormatError:
            pass
        raise UnknownFormatError(
            f"unknown KV format {name!r}; use one of {', '.join(PART_NAMES)} for keys and values, "
            f"or KEYS/VALUES for different ones (e.g. fp8-token/nvfp4); `kvwire formats` lists them"
        )


PART_NAMES = ("bf16", "fp8-tensor", "fp8-head", "fp8-page", "fp8-token", "nvfp4")
# The mixed formats worth listing by default; any KEYS/VALUES pair of PART_NAMES is accepted.
LISTED_MIXED = (
    "fp8-tensor/nvfp4", "fp8-head/nvfp4", "fp8-page/nvfp4", "fp8-token/nvfp4",
    "nvfp4/fp8-token", "bf16/fp8-token", "bf16/nvfp4",
)


def listed_formats(include_all_pairs: bool = False) -> list[KVFormat]:
    """Formats `kvwire formats` shows: uniform ones, then mixed (every pair when asked)."""
    names = list(PART_NAMES)
    if include_all_pairs:
        names += [f"{k}/{v}" for k in PART_NAMES for v in PART_NAMES if k != v]
    else:
        names += list(LISTED_MIXED)
    return [KVFormat.parse(n) for n in names]


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _check_version(version: int) -> None:
    if version != FORMAT_VERSION:
        raise ValueError(f"page format version {version} is not readable here: this kvwire lays pages out as "
                         f"version {FORMAT_VERSION}, so prefill and decode workers must run the same kvwire release")


# The layout's section groups (module docstring): data, per-token scales, per-head scales.
_SECTION_GROUP = {"data": 0, "token_scale": 1, "block_scale": 1, "page_scale": 2, "global_scale": 2}


@dataclass(frozen=True)
class Section:
    """One contiguous byte range of a page: where a (layer, K/V, section) lives."""

    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class PageFormat:
    """A self-describing page spec: the format plus the model shape it is laid out for."""

    kv: KVFormat
    page_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.num_layers < 1 or self.num_kv_heads < 1 or self.head_dim < 1:
            raise ValueError("page_size, num_layers, num_kv_heads and head_dim must be positive")
        elements = self.page_size * self.num_layers * self.num_kv_heads * self.head_dim
        if self.num_layers > MAX_LAYERS or elements > MAX_PAGE_ELEMENTS:
            raise ValueError(f"a page of {self.num_layers} layers x {self.num_kv_heads} heads x {self.page_size} "
                             f"tokens x {self.head_dim} is past any model (at most {MAX_LAYERS} layers and "
                             f"{MAX_PAGE_ELEMENTS} elements per K or V)")
        uses_nvfp4 = ElementType.NVFP4 in (self.kv.key.element, self.kv.value.element)
        if uses_nvfp4 and self.head_dim % NVFP4_BLOCK:
            raise ValueError(f"nvfp4 needs head_dim divisible by {NVFP4_BLOCK}, got {self.head_dim}")
        _check_version(self.version)

    @property
    def name(self) -> str:
        return self.kv.name

    @cached_property
    def _layout(self) -> tuple[dict[tuple[int, int, str], Section], int]:
        itemsize = {"bfloat16": 2, "uint8": 1, "float32": 4}
        entries = [(layer, part, name, shape, dtype) for layer in range(self.num_layers)
                   for part, fmt in enumerate((self.kv.key, self.kv.value))
                   for name, shape, dtype in fmt.sections(self.page_size, self.num_kv_heads, self.head_dim)]
        sections: dict[tuple[int, int, str], Section] = {}
        offset = 0
        for layer, part, name, shape, dtype in sorted(entries, key=lambda e: _SECTION_GROUP[e[2]]):  # stable
            if name == "data":
                offset = _align(offset, LINE)
            nbytes = itemsize[dtype] * math.prod(shape)
            sections[(layer, part, name)] = Section(offset, nbytes, shape, dtype)
            offset = _align(offset + nbytes, ALIGN)
        return sections, _align(offset, LINE)

    def section(self, layer: int, part: int, name: str) -> Section:
        """Byte range of ``name`` ("data", "token_scale", ...) for ``layer`` and part 0=K, 1=V."""
        try:
            return self._layout[0][(layer, part, name)]
        except KeyError:
            raise KeyError(f"page format {self.name} has no section {name!r} for layer {layer} part {part}") from None

    def layer_stride(self, part: int, name: str) -> int:
        """Bytes from layer l's ``name`` section of ``part`` to layer l + 1's, the same for every l
        (each section group repeats per layer); 0 for a one-layer format."""
        first = self.section(0, part, name).offset
        return self.section(1, part, name).offset - first if self.num_layers > 1 else 0

    def part_format(self, part: int) -> TensorFormat:
        return (self.kv.key, self.kv.value)[part]

    @property
    def page_bytes(self) -> int:
        return self._layout[1]

    @property
    def bytes_per_token(self) -> float:
        """Stored bytes per token over all layers, K and V, scales included."""
        return self.page_bytes / self.page_size

    @property
    def bf16_bytes_per_token(self) -> int:
        return 2 * 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def ratio_to_bf16(self) -> float:
        return self.bytes_per_token / self.bf16_bytes_per_token

    def to_dict(self) -> dict:
        """Canonical, msgpack/json-friendly description (what the hash covers)."""
        return {
            "version": self.version,
            "key": [self.kv.key.element.value, self.kv.key.granularity.value],
            "value": [self.kv.value.element.value, self.kv.value.granularity.value],
            "page_size": self.page_size,
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "nvfp4_block": NVFP4_BLOCK,
            "align": ALIGN,
            "line": LINE,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "PageFormat":
        if isinstance(d, dict) and isinstance(d.get("version"), int):
            _check_version(d["version"])        # before the catch-all below, which would call it malformed
        try:
            key = TensorFormat(ElementType(d["key"][0]), Granularity(d["key"][1]))
            value = TensorFormat(ElementType(d["value"][0]), Granularity(d["value"][1]))
            dims = [d[k] for k in ("page_size", "num_layers", "num_kv_heads", "head_dim", "version")]
            if not all(type(v) is int for v in dims):
                raise TypeError(f"page_size, num_layers, num_kv_heads, head_dim and version must be integers: {dims}")
            return cls(KVFormat(key, value), *dims)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed page format description: {exc}") from exc

    @cached_property
    def hash(self) -> str:
        """Stable 16-hex-digit hash of the canonical description; goes into every manifest."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
