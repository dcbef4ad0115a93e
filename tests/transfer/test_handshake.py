"""Handshake codec: roundtrip and refusals of malformed or inconsistent pool descriptions."""
from __future__ import annotations

import msgpack
import pytest

from kvwire.formats import PageFormat
from transfer import Handshake, HandshakeError, MemoryType, PoolInfo, TransportKind, decode_handshake


def make(fmt: PageFormat) -> Handshake:
    pool = PoolInfo(base_address=0x7F0000001000, num_pages=64, page_bytes=fmt.page_bytes, page_format=fmt,
                    memory_type=MemoryType.VRAM, device_id=3)
    return Handshake("decode-1", TransportKind.NIXL, b"\x00nixl-metadata\xff", pool)


def tamper(blob: bytes, pool: bool = False, **changes) -> bytes:
    payload = msgpack.unpackb(blob, raw=False)
    (payload["pool"] if pool else payload).update(changes)
    return msgpack.packb(payload, use_bin_type=True)


def test_roundtrip(fmt: PageFormat) -> None:
    h = make(fmt)
    back = decode_handshake(h.encode())
    assert back == h
    assert back.pool.format_hash == fmt.hash
    assert back.pool.page_address(2) == 0x7F0000001000 + 2 * fmt.page_bytes


@pytest.mark.parametrize("changes,pool,match", [
    ({"version": 9}, False, "handshake version 9 is not supported"),
    ({"transport": "rdma"}, False, "transport 'rdma' is not one of"),
    ({"backend_metadata": "text"}, False, "'backend_metadata' must be bytes"),
    ({"agent_name": ""}, False, "agent_name must be a non-empty string"),
    ({"memory_type": "HBM"}, True, "memory_type 'HBM' is not one of"),
    ({"page_bytes": 4096}, True, "page_bytes 4096 does not match its format"),
    ({"num_pages": 0}, True, "num_pages must be at least 1"),
    ({"format_hash": "ffffffffffffffff"}, True, "does not match its page format description"),
    ({"base_address": -5}, True, "base_address must be a non-negative integer"),
])
def test_refusals(fmt: PageFormat, changes: dict, pool: bool, match: str) -> None:
    with pytest.raises(HandshakeError, match=match):
        decode_handshake(tamper(make(fmt).encode(), pool=pool, **changes))


def test_garbage() -> None:
    with pytest.raises(HandshakeError, match="not valid msgpack"):
        decode_handshake(b"\xc1\x00")


def test_a_huge_format_with_a_matching_hash_is_refused_before_its_layout(fmt: PageFormat) -> None:
    """A 311-byte handshake describing 10**6 layers, its hash computed to match, took 13 s and
    3 GiB to decode (the pool's page_bytes check built the layout first)."""
    import hashlib
    import json
    desc = fmt.to_dict() | {"num_layers": 10**6}
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    with pytest.raises(HandshakeError, match="past any model"):
        decode_handshake(tamper(make(fmt).encode(), pool=True, page_format=desc, format_hash=digest))
