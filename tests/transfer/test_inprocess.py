"""In-process transport specifics: lazy copy, process-local peers, the registry."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.transfer.pools import random_pool, unique
from transfer import InProcessTransport, PeerError, TransferState, make_transport


@pytest.fixture
def two(fmt):
    a, b = InProcessTransport(unique("a")), InProcessTransport(unique("b"))
    a.register_pool(random_pool(fmt, 8, seed=1), fmt)
    b.register_pool(torch.zeros((8, fmt.page_bytes), dtype=torch.uint8), fmt)
    a.add_peer(b.handshake())
    b.add_peer(a.handshake())
    yield a, b
    a.close()
    b.close()


def test_nothing_moves_before_the_first_poll(two) -> None:
    a, b = two
    h = a.write_pages(b.name, [0, 1], [0, 1], deadline_s=10)
    assert h.state is TransferState.PENDING and int(b.storage.sum()) == 0
    assert h.abort() is TransferState.ABORTED
    assert int(b.storage.sum()) == 0                      # aborted before it ran: destination untouched


def test_a_handshake_from_another_process_is_refused(two, fmt) -> None:
    a, b = two
    c = InProcessTransport(unique("c"))
    c.register_pool(random_pool(fmt, 2, seed=5), fmt)
    handshake = c.handshake()
    with pytest.raises(PeerError, match="lives in process '1', not this one"):
        a.add_peer(dataclasses.replace(handshake, backend_metadata=b"1"))
    c.close()
    with pytest.raises(PeerError, match="no open in-process transport"):
        a.add_peer(handshake)


def test_names_are_unique_while_open(fmt) -> None:
    name = unique("dup")
    t = make_transport("inprocess", name)
    with pytest.raises(PeerError, match="already exists"):
        InProcessTransport(name)
    t.close()
    InProcessTransport(name).close()                      # free again once closed


def test_transfer_to_a_closed_peer_fails(two) -> None:
    a, b = two
    h = a.write_pages(b.name, [0], [0], deadline_s=10)
    b.close()
    assert h.poll() is TransferState.FAILED and "closed" in h.error


def test_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown transport kind 'rdma'; use one of nixl, inprocess"):
        make_transport("rdma", "x")
