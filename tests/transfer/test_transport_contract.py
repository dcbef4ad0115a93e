"""The Transport contract, run against every transport with two agents in this process.

NIXL here is real: two agents with their own UCX workers, talking through UCX on this host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pytest
import torch

from tests.transfer.pools import notifications, random_pool, small_format, unique
from transfer import PageIdError, PeerError, TransferError, TransferState, Transport, make_transport

KINDS = ["inprocess", pytest.param("nixl", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("nixl") is None, reason="nixl is not installed"))]


@dataclass
class Pair:
    a: Transport
    b: Transport
    pool_a: torch.Tensor
    pool_b: torch.Tensor


@pytest.fixture(params=KINDS)
def pair(request, fmt) -> Iterator[Pair]:
    a, b = make_transport(request.param, unique("a")), make_transport(request.param, unique("b"))
    pool_a, pool_b = random_pool(fmt, 32, seed=1), random_pool(fmt, 24, seed=2)
    a.register_pool(pool_a, fmt)
    b.register_pool(pool_b, fmt)
    assert a.add_peer(b.handshake()) == b.name
    assert b.add_peer(a.handshake()) == a.name
    yield Pair(a, b, pool_a, pool_b)
    a.close()
    b.close()


def test_push_copies_exactly_the_pages(pair: Pair, fmt) -> None:
    before_a, before_b = pair.pool_a.clone(), pair.pool_b.clone()
    local, remote = [3, 4, 5, 9], [10, 11, 20, 21]
    h = pair.a.write_pages(pair.b.name, local, remote, deadline_s=10, notify=b"req-1:pushed")
    assert h.wait(5) is TransferState.DONE
    expected = before_b.clone()
    expected[remote] = before_a[local]
    assert torch.equal(pair.pool_b, expected)          # the pages, and nothing else
    assert torch.equal(pair.pool_a, before_a)
    s = h.stats
    assert (s.num_pages, s.num_descriptors, s.compact_bytes) == (4, 3, 4 * fmt.page_bytes)
    assert s.bf16_bytes == 4 * fmt.page_size * fmt.bf16_bytes_per_token
    assert s.seconds > 0
    assert notifications(pair.b) == [(pair.a.name, b"req-1:pushed")]
    assert pair.a.poll_notifications() == []


def test_pull_copies_exactly_the_pages(pair: Pair, fmt) -> None:
    before_a, before_b = pair.pool_a.clone(), pair.pool_b.clone()
    remote, local = [0, 1, 2, 3, 30], [5, 6, 7, 8, 0]
    h = pair.b.read_pages(pair.a.name, remote, local, deadline_s=10, notify=b"req-2:have-pages")
    assert h.wait(5) is TransferState.DONE
    expected = before_b.clone()
    expected[local] = before_a[remote]
    assert torch.equal(pair.pool_b, expected)
    assert torch.equal(pair.pool_a, before_a)
    assert h.stats.num_descriptors == 2 and h.stats.compact_bytes == 5 * fmt.page_bytes
    # pull: the page owner learns that the receiver has its pages, so it may free them
    assert notifications(pair.a) == [(pair.b.name, b"req-2:have-pages")]


def test_empty_transfer_completes_and_notifies(pair: Pair) -> None:
    h = pair.a.write_pages(pair.b.name, [], [], deadline_s=10, notify=b"tail-only")
    assert h.wait(5) is TransferState.DONE and h.stats.compact_bytes == 0
    assert notifications(pair.b) == [(pair.a.name, b"tail-only")]


def test_standalone_notification(pair: Pair) -> None:
    pair.b.send_notification(pair.a.name, b"cancel:req-9")
    assert notifications(pair.a) == [(pair.b.name, b"cancel:req-9")]


def test_abort_is_idempotent_and_suppresses_the_notification(pair: Pair) -> None:
    h = pair.a.write_pages(pair.b.name, [1, 2], [3, 4], deadline_s=10, notify=b"must-not-arrive")
    assert h.abort() is TransferState.ABORTED
    assert h.abort() is TransferState.ABORTED and h.poll() is TransferState.ABORTED and h.quiesced
    assert notifications(pair.b, timeout=0.2) == []
    done = pair.a.write_pages(pair.b.name, [1], [3], deadline_s=10)
    assert done.wait(5) is TransferState.DONE
    assert done.abort() is TransferState.DONE          # aborting a finished transfer changes nothing


def test_deadline_times_out(pair: Pair) -> None:
    h = pair.a.write_pages(pair.b.name, [1, 2], [3, 4], deadline_s=0.0, notify=b"too-late")
    assert h.poll() is TransferState.TIMED_OUT
    assert h.wait(1) is TransferState.TIMED_OUT and h.abort() is TransferState.TIMED_OUT
    assert notifications(pair.b, timeout=0.2) == []


def test_page_ids_checked_before_anything_is_issued(pair: Pair) -> None:
    before = pair.pool_b.clone()
    with pytest.raises(PageIdError, match=r"remote pages \(pool of peer .*\): page id 24 is outside \[0, 24\)"):
        pair.a.write_pages(pair.b.name, [0, 1], [23, 24], deadline_s=10, notify=b"x")
    with pytest.raises(PageIdError, match=r"local pages .*: page id 32 is outside \[0, 32\)"):
        pair.a.write_pages(pair.b.name, [32], [0], deadline_s=10, notify=b"x")
    with pytest.raises(PageIdError, match="appears more than once"):
        pair.a.write_pages(pair.b.name, [0, 1], [5, 5], deadline_s=10, notify=b"x")
    with pytest.raises(PageIdError, match="2 local pages cannot pair with 1 remote"):
        pair.b.read_pages(pair.a.name, [0], [1, 2], deadline_s=10, notify=b"x")
    with pytest.raises(ValueError, match="deadline_s must be seconds"):
        pair.a.write_pages(pair.b.name, [0], [0], deadline_s=-1)
    assert torch.equal(pair.pool_b, before)
    assert notifications(pair.b, timeout=0.2) == [] and notifications(pair.a, timeout=0.0) == []


def test_unknown_peer(pair: Pair) -> None:
    with pytest.raises(PeerError, match="unknown peer 'nobody'"):
        pair.a.write_pages("nobody", [0], [0], deadline_s=10)


def test_peer_with_another_format_is_refused(pair: Pair) -> None:
    other = make_transport(pair.a.kind.value, unique("other"))
    other_fmt = small_format("nvfp4")
    other.register_pool(random_pool(other_fmt, 4, seed=3), other_fmt)
    try:
        with pytest.raises(PeerError, match="its pages are nvfp4 .* but this pool's are fp8-token/nvfp4"):
            pair.a.add_peer(other.handshake())
        assert other.name not in pair.a.peers
    finally:
        other.close()


def test_duplicate_peer_and_self_are_refused(pair: Pair) -> None:
    with pytest.raises(PeerError, match="already connected"):
        pair.a.add_peer(pair.b.handshake())
    with pytest.raises(PeerError, match="cannot add itself"):
        pair.a.add_peer(pair.a.handshake())


def test_closed_transport_refuses_work(pair: Pair) -> None:
    h = pair.a.write_pages(pair.b.name, [0], [0], deadline_s=10, notify=b"never")
    pair.a.write_pages(pair.b.name, [1], [1], deadline_s=10, notify=b"dropped")  # handle not kept
    pair.a.close()
    assert h.state is TransferState.ABORTED               # close drains live transfers
    with pytest.raises(TransferError, match="is closed"):
        pair.a.write_pages(pair.b.name, [0], [0], deadline_s=10)
    pair.a.close()                                        # idempotent
    assert notifications(pair.b, timeout=0.2) == []
    with pytest.raises(TransferError, match="is closed"):
        pair.a.handshake()


def test_pool_registration_rules(fmt) -> None:
    t = make_transport("inprocess", unique("reg"))
    with pytest.raises(TransferError, match="no registered pool"):
        t.handshake()
    with pytest.raises(ValueError, match=rf"contiguous \[num_pages >= 1, {fmt.page_bytes}\]"):
        t.register_pool(torch.zeros((4, 100), dtype=torch.uint8), fmt)
    with pytest.raises(ValueError, match="must be a uint8 tensor"):
        t.register_pool(torch.zeros((4, fmt.page_bytes), dtype=torch.int16), fmt)
    t.register_pool(torch.zeros((4, fmt.page_bytes), dtype=torch.uint8), fmt)
    with pytest.raises(TransferError, match="already has a registered pool"):
        t.register_pool(torch.zeros((4, fmt.page_bytes), dtype=torch.uint8), fmt)
    t.close()
