"""NIXL specifics with two real agents in this process: transfers that are really in flight.

UCX moves DRAM->DRAM synchronously through shared memory here, so to catch a transfer mid-flight
the agents are forced onto TCP (``ucx_config={"TLS": "tcp"}``), where puts complete
asynchronously on the progress thread, as RDMA would.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tests.transfer.pools import big_format, random_pool, unique

pytest.importorskip("nixl", reason="nixl is not installed")

from transfer import TransferState  # noqa: E402
from transfer.nixl_transport import NixlTransport  # noqa: E402

PAGES = 512  # x 256 KiB = 128 MiB per transfer: still in flight when checked, even on a loaded host


def transports(tag: str, seed: int, pages: int = PAGES, tcp: bool = True,
               connect: bool = True) -> tuple[NixlTransport, NixlTransport]:
    """a (random pages) and b (zeros), connected both ways unless ``connect`` is False."""
    fmt = big_format()
    ucx = {"ucx_config": {"TLS": "tcp"}} if tcp else {}
    a, b = NixlTransport(unique(f"{tag}-a"), **ucx), NixlTransport(unique(f"{tag}-b"), **ucx)
    a.register_pool(random_pool(fmt, pages, seed=seed), fmt)
    b.register_pool(torch.zeros((pages, fmt.page_bytes), dtype=torch.uint8), fmt)
    if connect:
        a.add_peer(b.handshake())
        b.add_peer(a.handshake())
    return a, b


@pytest.fixture(scope="module")
def tcp_pair():
    a, b = transports("tcp", 11)
    yield a, b
    a.close()
    b.close()


def drain(t: NixlTransport, seconds: float) -> list:
    time.sleep(seconds)
    return t.poll_notifications()


def test_abort_mid_flight_drains_and_stays_usable(tcp_pair) -> None:
    a, b = tcp_pair
    drain(b, 0)
    in_flight = False
    for _ in range(5):  # a loaded host may finish the transfer before it can be caught
        h = a.write_pages(b.name, list(range(PAGES)), list(range(PAGES)), deadline_s=30, notify=b"aborted")
        in_flight = a.check(h._xfer) == "PROC"
        assert h.abort() is TransferState.ABORTED
        assert h.quiesced and h._xfer is None
        if in_flight:
            break
    assert in_flight
    assert drain(b, 0.3) == []                            # no proof of delivery for an aborted transfer
    again = a.write_pages(b.name, [0, 1, 2], [5, 6, 7], deadline_s=30, notify=b"ok")
    assert again.wait(10) is TransferState.DONE
    assert torch.equal(b.storage[5:8], a.storage[0:3])
    assert drain(b, 0.1) == [(a.name, b"ok")]


def test_deadline_mid_flight_times_out(tcp_pair) -> None:
    a, b = tcp_pair
    drain(b, 0)
    h = a.read_pages(b.name, list(range(PAGES)), list(range(PAGES)), deadline_s=0.002, notify=b"late")
    assert h.wait(10) is TransferState.TIMED_OUT and h.quiesced
    assert h.stats.seconds >= 0.002
    assert drain(b, 0.2) == []


def test_push_and_pull_over_tcp(tcp_pair) -> None:
    a, b = tcp_pair
    push = a.write_pages(b.name, list(range(32)), list(range(32, 64)), deadline_s=30)
    assert push.wait(20) is TransferState.DONE
    assert torch.equal(b.storage[32:64], a.storage[0:32])
    pull = b.read_pages(a.name, list(range(64, 96)), list(range(64, 96)), deadline_s=30)
    assert pull.wait(20) is TransferState.DONE
    assert torch.equal(b.storage[64:96], a.storage[64:96])


def test_ucx_config_values_cannot_carry_commas() -> None:
    with pytest.raises(ValueError, match="cannot contain ','"):
        NixlTransport(unique("bad"), ucx_config={"TLS": "tcp,self"})


def test_a_pools_progress_delay_reaches_its_workers_agents() -> None:
    """`transfer_progress_delay_us` in a pool's config is the delay its workers' agents run with."""
    from router.config import PoolConfig
    from router.workers import worker_config
    from transfer.endpoint import WorkerEndpoint

    pool = PoolConfig("delay", load_format="dummy", model_shape="smollm2-135m", device="cpu", num_pages=8,
                      transfer_progress_delay_us=50_000)
    endpoint = WorkerEndpoint(worker_config(pool, unique("delay-worker")))
    try:
        assert endpoint.transport.progress_delay_us == 50_000
    finally:
        endpoint.transport.close()
    default = NixlTransport(unique("default-delay"))
    try:
        assert default.progress_delay_us == 1000
    finally:
        default.close()


def test_progress_delay_must_be_positive() -> None:
    with pytest.raises(ValueError, match="makes NIXL's progress thread spin"):
        NixlTransport(unique("spin"), progress_delay_us=0)


def thread_cpu_s(tids: set[str]) -> float:
    """User + system CPU seconds of these threads of this process (/proc/self/task/TID/stat)."""
    ticks = 0
    for tid in tids:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        ticks += int(fields[11]) + int(fields[12])      # utime, stime: fields 14 and 15 of stat
    return ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_idle_agents_leave_the_cpu_alone() -> None:
    """NIXL's progress thread spins (a core per agent) unless its poll delay is set; two idle agents
    after a transfer must use a small share of one core between them."""
    before = set(os.listdir("/proc/self/task"))
    a, b = transports("idle", 5, pages=4, tcp=False)
    try:
        assert a.write_pages(b.name, [0, 1], [2, 3], deadline_s=10).wait(10) is TransferState.DONE
        agent_threads = set(os.listdir("/proc/self/task")) - before
        assert agent_threads, "NIXL started no threads: nothing measured"
        cpu0, t0 = thread_cpu_s(agent_threads), time.monotonic()
        time.sleep(2.0)
        share = (thread_cpu_s(agent_threads) - cpu0) / (time.monotonic() - t0)
        assert share < 0.25, f"two idle NIXL agents' threads used {share:.0%} of a core"
    finally:
        a.close()
        b.close()


def test_removing_a_peer_mid_flight_aborts_its_transfers_first() -> None:
    """remove_peer dropped NIXL's peer under a live WRITE: its next check raised, the handle ended FAILED
    with quiesced True, and the bytes went on landing (the owner would reuse pages still being written)."""
    a, b = transports("rm", 12)
    try:
        for _ in range(5):  # a loaded host may finish the transfer before it can be caught
            h = a.write_pages(b.name, list(range(PAGES)), list(range(PAGES)), deadline_s=30, notify=b"x")
            if a.check(h._xfer) == "PROC":
                break
            h.wait(10)
        else:
            pytest.fail("no transfer was caught in flight")
        a.remove_peer(b.name)
        assert h.state is TransferState.ABORTED and h.quiesced and b.name not in a.peers
        landed = b.storage.clone()
        time.sleep(0.3)
        assert torch.equal(b.storage, landed)             # quiesced: nothing lands after it said so
        assert drain(b, 0) == []
    finally:
        a.close()
        b.close()


def test_a_check_nixl_cannot_answer_ends_the_transfer_not_quiesced(monkeypatch) -> None:
    """A raising state check was taken for ERR, which says the request ended: its pages were then
    released for reuse though it could still be writing them."""
    a, b = transports("unk", 13)
    try:
        h = a.write_pages(b.name, list(range(PAGES)), list(range(PAGES)), deadline_s=30)

        def no_answer(_xfer):                             # NIXL raising mid-transfer: not causable here
            raise RuntimeError("NIXL_ERR_NOT_FOUND")

        monkeypatch.setattr(a._agent, "check_xfer_state", no_answer)
        assert h.poll() is TransferState.FAILED and not h.quiesced
        assert "UNKNOWN" in h.error
        monkeypatch.undo()
        deadline = time.monotonic() + 30                 # let the real transfer end before closing
        while not torch.equal(b.storage[-1], a.storage[-1]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        a.close()
        b.close()


def test_a_handshake_naming_another_agent_leaves_a_connected_peer_alone() -> None:
    """Refusing a handshake whose NIXL metadata names another agent dropped that agent's metadata, even
    when it was a connected peer: every later transfer to it failed with NIXL_ERR_NOT_FOUND."""
    import dataclasses

    from transfer import PeerError

    a, b = transports("hs", 14, pages=8, tcp=False, connect=False)
    try:
        a.add_peer(b.handshake())
        with pytest.raises(PeerError, match="NIXL metadata is agent"):
            a.add_peer(dataclasses.replace(b.handshake(), agent_name=unique("someone-else")))
        h = a.write_pages(b.name, [1], [2], deadline_s=10)
        assert h.wait(10) is TransferState.DONE and torch.equal(b.storage[2], a.storage[1])
    finally:
        a.close()
        b.close()


def _peer_process(conn) -> None:
    """A NIXL agent in its own process (TCP), connected to the parent's, living until it is killed."""
    from transfer.handshake import decode_handshake

    fmt = big_format()
    b = NixlTransport(unique("dead-b"), ucx_config={"TLS": "tcp"})
    b.register_pool(torch.zeros((PAGES, fmt.page_bytes), dtype=torch.uint8), fmt)
    conn.send(b.handshake().encode())
    b.add_peer(decode_handshake(conn.recv()))
    conn.send("ready")
    time.sleep(600)


def test_a_peer_killed_mid_write_ends_it_failed_and_quiesced() -> None:
    """NIXL raises (nixlRemoteDisconnectError) where a request ended because its peer died: that request
    is over, so its pages may be reused; only a check NIXL cannot answer leaves them quarantined."""
    import multiprocessing
    import signal

    from transfer.handshake import decode_handshake

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_peer_process, args=(theirs,), daemon=True)
    proc.start()
    fmt = big_format()
    a = NixlTransport(unique("dead-a"), ucx_config={"TLS": "tcp"})
    try:
        a.register_pool(random_pool(fmt, PAGES, seed=15), fmt)
        assert ours.poll(60)
        peer = a.add_peer(decode_handshake(ours.recv()))
        ours.send(a.handshake().encode())
        assert ours.poll(30) and ours.recv() == "ready"
        h = a.write_pages(peer, list(range(PAGES)), list(range(PAGES)), deadline_s=60)
        in_flight = a.check(h._xfer) == "PROC"
        os.kill(proc.pid, signal.SIGKILL)
        state = h.wait(50)
        if not in_flight and state is TransferState.DONE:
            pytest.skip("the WRITE finished before the peer could be killed")
        assert state is TransferState.FAILED and h.quiesced, (state, h.error)
        assert h.error.startswith("NIXL reported ERR: nixl"), h.error      # the reason, not just "ERR"
    finally:
        proc.kill()
        proc.join(10)
        a.close()
