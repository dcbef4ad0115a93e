"""Manifest codec: a roundtrip, and every malformed manifest refused with a message that says why."""
from __future__ import annotations

import msgpack
import pytest
import torch

from kvwire.formats import PageFormat
from tests.transfer.pools import small_format
from transfer import MANIFEST_VERSION, Manifest, ManifestError, decode_manifest


def make_manifest(fmt: PageFormat, page_ids=(4, 5, 9), tail_len: int = 3, scales: bool = False) -> Manifest:
    tail = torch.randn(fmt.num_layers, 2, fmt.num_kv_heads, tail_len, fmt.head_dim).to(torch.bfloat16)
    static = torch.rand(fmt.num_layers, 2, fmt.num_kv_heads) + 0.1 if scales else None
    return Manifest.from_tensors(request_id="req-1", page_format=fmt, page_ids=list(page_ids), tail=tail,
                                 first_token=42, sender="prefill-0", sender_num_pages=16, static_scales=static)


def tamper(blob: bytes, **changes) -> bytes:
    payload = msgpack.unpackb(blob, raw=False)
    payload.update(changes)
    return msgpack.packb(payload, use_bin_type=True)


def refused(blob: bytes, match: str, expected: PageFormat | None = None) -> None:
    with pytest.raises(ManifestError, match=match):
        decode_manifest(blob, expected)


def test_roundtrip_keeps_every_field(fmt: PageFormat) -> None:
    m = make_manifest(fmt)
    back = decode_manifest(m.encode(), fmt)
    assert back == m
    assert back.version == MANIFEST_VERSION and back.format_hash == fmt.hash
    assert back.num_tokens == 3 * fmt.page_size + 3
    assert torch.equal(back.tail_tensor(), m.tail_tensor())
    assert back.static_scales_tensor() is None


def test_roundtrip_with_static_scales_and_empty_tail() -> None:
    fmt = small_format("fp8-head/nvfp4")
    m = make_manifest(fmt, tail_len=0, scales=True)
    back = decode_manifest(m.encode(), fmt)
    assert back.tail == b"" and back.tail_tensor().shape == (2, 2, 2, 0, 64)
    assert torch.equal(back.static_scales_tensor(), m.static_scales_tensor())


def test_manifest_error_is_a_value_error() -> None:
    assert issubclass(ManifestError, ValueError)


@pytest.mark.parametrize("blob", [b"\xc1", b"\x8c\xa7version", b""])
def test_malformed_msgpack(blob: bytes) -> None:
    refused(blob, "not valid msgpack")


def test_not_a_map() -> None:
    refused(msgpack.packb([1, 2, 3]), "must be a msgpack map")


def test_wrong_version(fmt: PageFormat) -> None:
    refused(tamper(make_manifest(fmt).encode(), version=2), "version 2 is not supported.*reads version 1")
    refused(tamper(make_manifest(fmt).encode(), version="1"), "no integer 'version'")


def test_missing_and_unexpected_fields(fmt: PageFormat) -> None:
    payload = msgpack.unpackb(make_manifest(fmt).encode(), raw=False)
    del payload["first_token"]
    payload["priority"] = 1
    refused(msgpack.packb(payload, use_bin_type=True), r"missing \['first_token'\], unexpected \['priority'\]")


def test_format_hash_must_match_the_description(fmt: PageFormat) -> None:
    refused(tamper(make_manifest(fmt).encode(), format_hash="0123456789abcdef"),
            f"format hash '0123456789abcdef' does not match.*hashes to '{fmt.hash}'")


def test_format_description_must_be_readable(fmt: PageFormat) -> None:
    refused(tamper(make_manifest(fmt).encode(), page_format={"key": ["fp7", "none"]}), "unreadable page format")


def test_format_must_be_the_expected_one(fmt: PageFormat) -> None:
    other = small_format("nvfp4")
    refused(make_manifest(fmt).encode(), r"mismatch: the manifest's pages are fp8-token/nvfp4 .*"
                                         r"this worker reads nvfp4 \(", expected=other)


@pytest.mark.parametrize("pages,match", [
    ([4, 16, 5], r"page id 16 is outside the sender's pool \[0, 16\)"),
    ([4, -1, 5], r"page id -1 is outside"),
    ([4, 5, 4], "page id 4 appears more than once"),
    ([4, "5", 6], "page ids must be integers"),
    ([4, True, 6], "page ids must be integers"),
])
def test_bad_page_ids(fmt: PageFormat, pages: list, match: str) -> None:
    refused(tamper(make_manifest(fmt).encode(), page_ids=pages), match)


def test_num_tokens_must_add_up(fmt: PageFormat) -> None:
    refused(tamper(make_manifest(fmt).encode(), num_tokens=50),
            r"num_tokens 50 does not match 3 full pages x 16 tokens \+ tail_len 3 = 51")


def test_tail_length_must_match(fmt: PageFormat) -> None:
    blob = make_manifest(fmt).encode()
    refused(tamper(blob, tail=b"\x00" * 10), r"tail must be 3072 bytes of bf16 .* got 10")
    refused(tamper(blob, tail_len=17, num_tokens=65), r"tail_len 17 is outside \[0, page_size=16\]")


def test_field_types_are_checked(fmt: PageFormat) -> None:
    blob = make_manifest(fmt).encode()
    refused(tamper(blob, first_token=1.5), "field 'first_token' must be an integer")
    refused(tamper(blob, sender=b"prefill-0"), "field 'sender' must be a string")
    refused(tamper(blob, page_ids={"0": 1}), "field 'page_ids' must be a list")
    refused(tamper(blob, sender=""), "sender must be a non-empty string")


def test_static_scales_required_exactly_when_the_format_has_them(fmt: PageFormat) -> None:
    refused(tamper(make_manifest(fmt).encode(), static_scales=b"\x00" * 32), "keeps its scales in the pages")
    head = small_format("fp8-head")
    blob = make_manifest(head, scales=True).encode()
    refused(tamper(blob, static_scales=None),
            r"needs static scales: fp32 \[layers=2, 2, kv_heads=2\] = 32 bytes, got none")
    refused(tamper(blob, static_scales=torch.full((8,), -1.0).numpy().tobytes()), "must be positive")
    refused(tamper(blob, static_scales=torch.full((8,), float("nan")).numpy().tobytes()), "non-finite")


def test_building_a_bad_manifest_fails_too(fmt: PageFormat) -> None:
    with pytest.raises(ManifestError, match="outside the sender's pool"):
        make_manifest(fmt, page_ids=(1, 99))
    with pytest.raises(ManifestError, match="at least one token"):
        make_manifest(fmt, page_ids=(), tail_len=0)
