"""NIXL across two processes: two Ray actors on a local Ray cluster bound to 127.0.0.1.

One cluster per module (starting Ray costs seconds). Each actor holds a default-UCX agent and a
TCP-only agent (see ray_peer.py); the driver only moves handshakes and compares bytes.
"""
from __future__ import annotations

import os

import pytest

from tests.local_ray import local_ray
from tests.transfer.pools import big_format, small_format

pytest.importorskip("nixl", reason="nixl is not installed")
ray = pytest.importorskip("ray", reason="ray is not installed")

NUM_PAGES = {"default": 32, "tcp": 512}  # tcp: 128 MiB transfers, still in flight when checked


@pytest.fixture(scope="module")
def peers():
    with local_ray(num_cpus=2, object_store_mb=80):
        from tests.transfer.ray_peer import PoolPeer
        actor = ray.remote(num_cpus=0)(PoolPeer)
        formats = {"default": small_format().to_dict(), "tcp": big_format().to_dict()}
        prefill = actor.remote("prefill", formats, NUM_PAGES, seed=1)
        decode = actor.remote("decode", formats, NUM_PAGES, seed=2)
        for link in NUM_PAGES:
            ray.get([prefill.add_peer.remote(link, decode.handshake.remote(link)),
                     decode.add_peer.remote(link, prefill.handshake.remote(link))])
        yield prefill, decode
        ray.get([prefill.close.remote(), decode.close.remote()])


def test_actors_are_separate_processes(peers) -> None:
    pids = set(ray.get([p.pid.remote() for p in peers]))
    assert len(pids) == 2 and os.getpid() not in pids


def test_push_across_processes(peers) -> None:
    prefill, decode = peers
    local, remote = [3, 4, 5, 9], [10, 11, 20, 21]
    out = ray.get(prefill.transfer.remote("default", "WRITE", "decode-default", local, remote, 30, b"req-1:pushed"))
    fmt = small_format()
    assert out["state"] == "done" and out["descriptors"] == 3 and out["compact_bytes"] == 4 * fmt.page_bytes
    assert ray.get(decode.pages.remote("default", remote)) == ray.get(prefill.pages.remote("default", local))
    assert ray.get(decode.notifications.remote("default", 1, 5.0)) == [("prefill-default", b"req-1:pushed")]


def test_pull_across_processes(peers) -> None:
    prefill, decode = peers
    remote, local = [0, 1, 2, 30], [12, 13, 14, 0]
    untouched = ray.get(decode.pages.remote("default", [1, 31]))
    out = ray.get(decode.transfer.remote("default", "READ", "prefill-default", local, remote, 30, b"req-2:have"))
    assert out["state"] == "done" and out["descriptors"] == 2
    assert ray.get(decode.pages.remote("default", local)) == ray.get(prefill.pages.remote("default", remote))
    assert ray.get(decode.pages.remote("default", [1, 31])) == untouched
    # the page owner (prefill) learns that decode has the pages: now it may free them
    assert ray.get(prefill.notifications.remote("default", 1, 5.0)) == [("decode-default", b"req-2:have")]


def test_abort_mid_flight_across_processes(peers) -> None:
    prefill, decode = peers
    pages = list(range(NUM_PAGES["tcp"]))
    outs = []
    while not any(o["in_flight"] for o in outs) and len(outs) < 5:  # a loaded host may finish first
        outs.append(ray.get(prefill.transfer.remote("tcp", "WRITE", "decode-tcp", pages, pages, 30, b"no", True)))
    assert any(o["in_flight"] for o in outs), outs
    assert all(o["state"] == "aborted" and o["quiesced"] for o in outs)
    assert ray.get(decode.notifications.remote("tcp", 1, 0.5)) == []
    again = ray.get(prefill.transfer.remote("tcp", "WRITE", "decode-tcp", [0, 1], [2, 3], 30, b"after"))
    assert again["state"] == "done"
    assert ray.get(decode.pages.remote("tcp", [2, 3])) == ray.get(prefill.pages.remote("tcp", [0, 1]))
    assert ray.get(decode.notifications.remote("tcp", 1, 5.0)) == [("prefill-tcp", b"after")]


def test_deadline_across_processes(peers) -> None:
    prefill, decode = peers
    pages = list(range(NUM_PAGES["tcp"]))
    out = ray.get(decode.transfer.remote("tcp", "READ", "prefill-tcp", pages, pages, 0.002, b"late"))
    assert out["state"] == "timed_out" and out["quiesced"]
    assert ray.get(prefill.notifications.remote("tcp", 1, 0.5)) == []


def test_bad_format_and_bad_page_ids_refused_across_processes(peers) -> None:
    prefill, decode = peers
    refusal = ray.get(decode.try_add_peer.remote("default", prefill.handshake.remote("tcp")))
    assert refusal.startswith("PeerError: refusing peer 'prefill-tcp': its pages are bf16")
    before = ray.get(decode.pages.remote("default", list(range(NUM_PAGES["default"]))))
    out = ray.get(prefill.transfer.remote("default", "WRITE", "decode-default", [0, 1], [31, 32], 30, b"x"))
    assert out["error"].startswith("PageIdError: remote pages (pool of peer 'decode-default'): page id 32")
    assert ray.get(decode.pages.remote("default", list(range(NUM_PAGES["default"])))) == before
    assert ray.get(decode.notifications.remote("default", 1, 0.3)) == []
