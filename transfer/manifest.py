"""The manifest: what a prefill worker hands back for one request, and what decode admits.

It names the full pages on the sender's pool (to be pushed or pulled), carries the open tail page
inline in bf16 (it is never quantised before it fills), the static scales a tensor/head-scaled
format needs, the first sampled token and the sender's agent name. Everything in it is checked
when it is built *and* when it is decoded, before any transfer could be issued on its word: a page
id outside the sender's pool, a byte count that does not add up or a format this side cannot read
is a ``ManifestError`` that says what is wrong and what was expected.

Wire form: a msgpack map with an explicit ``version``; the page format travels as its canonical
``to_dict`` plus its hash, and the hash is recomputed on decode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from kvwire.formats import PageFormat
from transfer._codec import check_keys, check_version, describe, format_from_wire, pack, take, unpack

MANIFEST_VERSION = 1
_WHAT = "manifest"
_FIELDS = {"version", "request_id", "page_format", "format_hash", "static_scales", "num_tokens",
           "page_ids", "tail", "tail_len", "first_token", "sender", "sender_num_pages"}


class ManifestError(ValueError):
    """A manifest that must not be acted on; the message says what is wrong and what was expected."""


def _needs_static_scales(fmt: PageFormat) -> bool:
    return fmt.kv.key.has_static_scales or fmt.kv.value.has_static_scales


def tail_bytes(fmt: PageFormat, tail_len: int) -> int:
    """Bytes of a bf16 tail ``[layers, 2, kv_heads, tail_len, head_dim]``."""
    return fmt.num_layers * 2 * fmt.num_kv_heads * tail_len * fmt.head_dim * 2


def static_scales_bytes(fmt: PageFormat) -> int:
    """Bytes of fp32 static scales ``[layers, 2, kv_heads]``."""
    return fmt.num_layers * 2 * fmt.num_kv_heads * 4


def _to_bytes(t: torch.Tensor, dtype: torch.dtype) -> bytes:
    return t.detach().to(device="cpu", dtype=dtype).contiguous().view(torch.uint8).numpy().tobytes()


@dataclass(frozen=True, kw_only=True)
class Manifest:
    request_id: str
    page_format: PageFormat
    num_tokens: int                  # tokens whose K/V exists: len(page_ids) * page_size + tail_len
    page_ids: tuple[int, ...]        # full pages on the sender's pool, in sequence order
    tail: bytes                      # bf16 [layers, 2, kv_heads, tail_len, head_dim]
    tail_len: int                    # 0..page_size (a just-filled tail may still be bf16)
    first_token: int
    sender: str                      # the sender's transfer agent name
    sender_num_pages: int            # size of the sender's pool, for bounds checks
    static_scales: bytes | None = None   # fp32 [layers, 2, kv_heads]; only tensor/head formats
    version: int = MANIFEST_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "page_ids", tuple(self.page_ids))
        self._validate()

    @property
    def format_hash(self) -> str:
        return self.page_format.hash

    @property
    def num_pages(self) -> int:
        return len(self.page_ids)

    def _validate(self) -> None:
        fmt = self.page_format
        if self.version != MANIFEST_VERSION:
            raise ManifestError(f"manifest version {self.version} is not supported (expected {MANIFEST_VERSION})")
        if not isinstance(fmt, PageFormat):
            raise ManifestError(f"page_format must be a PageFormat, got {type(fmt).__name__}")
        for name in ("request_id", "sender"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ManifestError(f"{name} must be a non-empty string, got {value!r}")
        for name in ("num_tokens", "tail_len", "first_token", "sender_num_pages"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ManifestError(f"{name} must be a non-negative integer, got {value!r}")
        if self.sender_num_pages < 1:
            raise ManifestError("sender_num_pages must be at least 1")
        self._validate_pages()
        if not 0 <= self.tail_len <= fmt.page_size:
            raise ManifestError(f"tail_len {self.tail_len} is outside [0, page_size={fmt.page_size}]")
        expected_tokens = len(self.page_ids) * fmt.page_size + self.tail_len
        if self.num_tokens != expected_tokens:
            raise ManifestError(
                f"num_tokens {self.num_tokens} does not match {len(self.page_ids)} full pages x "
                f"{fmt.page_size} tokens + tail_len {self.tail_len} = {expected_tokens}")
        if self.num_tokens == 0:
            raise ManifestError("a manifest must describe at least one token")
        if not isinstance(self.tail, bytes) or len(self.tail) != tail_bytes(fmt, self.tail_len):
            got = len(self.tail) if isinstance(self.tail, bytes) else type(self.tail).__name__
            raise ManifestError(
                f"tail must be {tail_bytes(fmt, self.tail_len)} bytes of bf16 [layers={fmt.num_layers}, 2, "
                f"kv_heads={fmt.num_kv_heads}, tail_len={self.tail_len}, head_dim={fmt.head_dim}], got {got}")
        self._validate_scales()

    def _validate_pages(self) -> None:
        seen: set[int] = set()
        for page in self.page_ids:
            if type(page) is not int:
                raise ManifestError(f"page ids must be integers, got {type(page).__name__} {page!r}")
            if not 0 <= page < self.sender_num_pages:
                raise ManifestError(f"page id {page} is outside the sender's pool [0, {self.sender_num_pages})")
            if page in seen:
                raise ManifestError(f"page id {page} appears more than once in page_ids")
            seen.add(page)

    def _validate_scales(self) -> None:
        fmt = self.page_format
        if not _needs_static_scales(fmt):
            if self.static_scales is not None:
                raise ManifestError(f"format {fmt.name} keeps its scales in the pages, but the manifest "
                                    f"carries {len(self.static_scales)} bytes of static scales")
            return
        want = static_scales_bytes(fmt)
        if not isinstance(self.static_scales, bytes) or len(self.static_scales) != want:
            got = "none" if self.static_scales is None else f"{len(self.static_scales)} bytes"
            raise ManifestError(f"format {fmt.name} needs static scales: fp32 [layers={fmt.num_layers}, 2, "
                                f"kv_heads={fmt.num_kv_heads}] = {want} bytes, got {got}")
        scales = self.static_scales_tensor()
        for part, part_fmt in enumerate((fmt.kv.key, fmt.kv.value)):
            values = scales[:, part].flatten().tolist()
            if not all(math.isfinite(v) for v in values):
                raise ManifestError(f"static scales of {'KV'[part]} hold non-finite values")
            if part_fmt.has_static_scales and not all(v > 0 for v in values):
                raise ManifestError(f"static scales of {'KV'[part]} must be positive, got min {min(values)}")

    # ---- tensors ----
    def tail_tensor(self) -> torch.Tensor:
        """The tail as bf16 ``[layers, 2, kv_heads, tail_len, head_dim]`` (a copy, CPU)."""
        f = self.page_format
        shape = (f.num_layers, 2, f.num_kv_heads, self.tail_len, f.head_dim)
        if not self.tail:  # frombuffer refuses an empty buffer
            return torch.empty(shape, dtype=torch.bfloat16)
        return torch.frombuffer(bytearray(self.tail), dtype=torch.bfloat16).reshape(shape)

    def static_scales_tensor(self) -> torch.Tensor | None:
        """Static scales as fp32 ``[layers, 2, kv_heads]`` (a copy, CPU), or None."""
        if self.static_scales is None:
            return None
        f = self.page_format
        return torch.frombuffer(bytearray(self.static_scales), dtype=torch.float32).reshape(
            f.num_layers, 2, f.num_kv_heads)

    @classmethod
    def from_tensors(cls, *, request_id: str, page_format: PageFormat, page_ids: Sequence[int],
                     tail: torch.Tensor, first_token: int, sender: str, sender_num_pages: int,
                     static_scales: torch.Tensor | None = None) -> "Manifest":
        """Build from a bf16 tail ``[layers, 2, kv_heads, tail_len, head_dim]`` and fp32 scales."""
        f = page_format
        head = (f.num_layers, 2, f.num_kv_heads)
        if tail.dim() != 5 or tuple(tail.shape[:3]) != head or tail.shape[4] != f.head_dim:
            raise ManifestError(f"tail must be [layers={f.num_layers}, 2, kv_heads={f.num_kv_heads}, tail_len, "
                                f"head_dim={f.head_dim}], got {tuple(tail.shape)}")
        tail_len = int(tail.shape[3])
        return cls(request_id=request_id, page_format=f, num_tokens=len(page_ids) * f.page_size + tail_len,
                   page_ids=tuple(int(p) for p in page_ids), tail=_to_bytes(tail, torch.bfloat16),
                   tail_len=tail_len, first_token=first_token, sender=sender, sender_num_pages=sender_num_pages,
                   static_scales=None if static_scales is None else _to_bytes(static_scales, torch.float32))

    # ---- wire ----
    def encode(self) -> bytes:
        return pack({
            "version": self.version, "request_id": self.request_id,
            "page_format": self.page_format.to_dict(), "format_hash": self.format_hash,
            "static_scales": self.static_scales, "num_tokens": self.num_tokens,
            "page_ids": list(self.page_ids), "tail": self.tail, "tail_len": self.tail_len,
            "first_token": self.first_token, "sender": self.sender, "sender_num_pages": self.sender_num_pages,
        })


def decode_manifest(blob: bytes, expected_format: PageFormat | None = None) -> Manifest:
    """Parse and fully validate a manifest; with ``expected_format``, also require that format.

    Raises ManifestError for anything a transfer must not be issued on.
    """
    payload = unpack(blob, _WHAT, ManifestError)
    check_version(payload, MANIFEST_VERSION, _WHAT, ManifestError)
    check_keys(payload, _FIELDS, _WHAT, ManifestError)
    fields = {key: take(payload, key, kind, _WHAT, ManifestError)
              for key, kind in (("request_id", str), ("num_tokens", int), ("tail", bytes), ("tail_len", int),
                                ("first_token", int), ("sender", str), ("sender_num_pages", int))}
    fields["static_scales"] = take(payload, "static_scales", bytes, _WHAT, ManifestError, optional=True)
    page_ids = take(payload, "page_ids", list, _WHAT, ManifestError)
    fmt = format_from_wire(take(payload, "page_format", dict, _WHAT, ManifestError),
                           take(payload, "format_hash", str, _WHAT, ManifestError), _WHAT, ManifestError)
    manifest = Manifest(page_format=fmt, page_ids=tuple(page_ids), **fields)
    if expected_format is not None and expected_format.hash != fmt.hash:
        raise ManifestError(f"page format mismatch: the manifest's pages are {describe(fmt)}, but this "
                            f"worker reads {describe(expected_format)}")
    return manifest


# The receiver's notice that a manifest's pages have landed: the sender may free them.
_DONE_PREFIX = b"done:"


def done_notice(request_id: str) -> bytes:
    return _DONE_PREFIX + request_id.encode()


def is_done_notice(msg: bytes) -> bool:
    """Whether ``msg`` is meant as a done notice (it may still be malformed: ``parse_done_notice``)."""
    return msg.startswith(_DONE_PREFIX)


def parse_done_notice(msg: bytes) -> str | None:
    """The request id of a done notice, or None for any other message (a malformed one included)."""
    if not is_done_notice(msg):
        return None
    try:
        return msg[len(_DONE_PREFIX):].decode()
    except UnicodeDecodeError:
        return None
