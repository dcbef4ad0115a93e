"""msgpack helpers shared by the manifest and handshake codecs.

Both blobs cross a process (and trust) boundary, so decoding never trusts a field: every read
goes through ``take``, which checks the type and names the field in the error. The error class is
passed in so each codec raises its own ValueError subclass.
"""
from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

import msgpack

from kvwire.formats import PageFormat

E = TypeVar("E", bound=Enum)
_TYPE_NAMES = {int: "an integer", str: "a string", bytes: "bytes", dict: "a map", list: "a list"}


def pack(payload: dict[str, Any]) -> bytes:
    """msgpack with bin/str kept apart, so bytes never decode as text."""
    return msgpack.packb(payload, use_bin_type=True)


def unpack(blob: bytes, what: str, error: type[ValueError]) -> dict[str, Any]:
    """A top-level map from ``blob``, or ``error`` saying why not."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise error(f"{what} must be bytes, got {type(blob).__name__}")
    try:
        payload = msgpack.unpackb(bytes(blob), raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise error(f"{what} is not valid msgpack ({type(exc).__name__}: {exc})") from exc
    if not isinstance(payload, dict):
        raise error(f"{what} must be a msgpack map, got {type(payload).__name__}")
    return payload


def check_version(payload: dict[str, Any], supported: int, what: str, error: type[ValueError]) -> None:
    """Checked first, so a newer peer gets "unsupported version" rather than a field error."""
    version = payload.get("version")
    if type(version) is not int:
        raise error(f"{what} has no integer 'version' field (got {version!r}); expected version {supported}")
    if version != supported:
        raise error(f"{what} version {version} is not supported (this kvwire reads version {supported})")


def check_keys(payload: dict[str, Any], expected: set[str], what: str, error: type[ValueError]) -> None:
    missing = sorted(expected - payload.keys())
    extra = sorted(set(payload) - expected)
    if missing or extra:
        raise error(f"{what} fields are not the expected ones: missing {missing or 'none'}, "
                    f"unexpected {extra or 'none'}")


def take(payload: dict[str, Any], key: str, kind: type, what: str, error: type[ValueError],
         optional: bool = False) -> Any:
    """``payload[key]`` if it has exactly type ``kind`` (bool is not an int here)."""
    value = payload.get(key)
    if value is None and optional:
        return None
    if type(value) is not kind:
        name = _TYPE_NAMES.get(kind, kind.__name__)
        raise error(f"{what} field '{key}' must be {name}{' or nil' if optional else ''}, "
                    f"got {type(value).__name__} {value!r:.60}")
    return value


def take_enum(payload: dict[str, Any], key: str, enum: type[E], what: str, error: type[ValueError]) -> E:
    """``payload[key]``, a string, as a member of ``enum``; the error lists the values it knows."""
    value = take(payload, key, str, what, error)
    try:
        return enum(value)
    except ValueError:
        raise error(f"{what} {key} {value!r} is not one of {[m.value for m in enum]}") from None


def describe(fmt: PageFormat) -> str:
    """One line that tells two page formats apart in an error message."""
    return (f"{fmt.name} (page_size={fmt.page_size}, layers={fmt.num_layers}, "
            f"kv_heads={fmt.num_kv_heads}, head_dim={fmt.head_dim}, hash {fmt.hash})")


def format_from_wire(description: dict, wire_hash: str, what: str, error: type[ValueError]) -> PageFormat:
    """Rebuild a PageFormat and check it hashes to what the sender said it is.

    A mismatch means the sender's layout differs from ours (another kvwire version, another
    alignment) or the blob was corrupted; either way its pages cannot be read.
    """
    try:
        fmt = PageFormat.from_dict(description)
    except ValueError as exc:
        raise error(f"{what} carries an unreadable page format: {exc}") from exc
    if fmt.hash != wire_hash:
        raise error(f"{what} format hash {wire_hash!r} does not match its page format description, "
                    f"which hashes to {fmt.hash!r} here ({describe(fmt)}): the sender lays pages out "
                    f"differently from this kvwire, or the blob is corrupt")
    return fmt
