"""A prefill worker short of pages: a prompt waits for the pages held requests free (and says so
when they are not freed in time), one larger than the pool is refused at once, and the probes the
router sends answer while a prefill holds the worker's lock. Plain classes, random weights."""
from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from kvwire.page_pool import CapacityError, NoRoomError
from kvwire.sampling import SamplingParams
from kvwire.worker_config import WorkerConfig
from prefill.worker import PrefillWorker

PARAMS = SamplingParams(max_tokens=4)


@pytest.fixture
def worker():
    w = PrefillWorker(WorkerConfig(f"pages-{time.monotonic_ns()}", "fp8-token", load_format="dummy",
                                   model_shape="smollm2-135m", device="cpu", transport="inprocess", num_pages=10))
    yield w
    w.shutdown()


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(1, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_prompt_waits_for_held_pages(worker):
    worker.prefill_request("a", prompt(100, 1), PARAMS)                    # holds 6 of the 10 pages
    with pytest.raises(NoRoomError, match="no room for 6 pages"):
        worker.prefill_request("b", prompt(100, 2), PARAMS, wait_s=0.3)
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(b=worker.prefill_request("b", prompt(100, 2), PARAMS, 60)))
    waiter.start()
    time.sleep(0.5)
    assert not got and waiter.is_alive()                                  # still waiting for pages
    assert worker.release("a")
    waiter.join(60)
    assert got["b"]["manifest"] and worker.counters()["requests_held"] == 1
    assert worker.release("b") and worker.counters()["pages_in_use"] == 0


def test_waiting_prompts_go_in_arrival_order(worker):
    worker.prefill_request("a", prompt(100, 5), PARAMS)                    # 6 of the 10 pages held
    order: list[str] = []

    def wait_for(rid: str, n: int) -> threading.Thread:
        t = threading.Thread(target=lambda: (worker.prefill_request(rid, prompt(n, 6), PARAMS, 60), order.append(rid)))
        t.start()
        return t

    tb = wait_for("b", 100)                          # 6 pages: waits for "a"
    time.sleep(0.3)
    tc = wait_for("c", 20)                           # 1 page would fit now, but "b" came first
    time.sleep(0.5)
    assert order == []
    assert worker.release("a")
    tb.join(60)
    tc.join(60)
    assert order == ["b", "c"]
    assert worker.release("b") and worker.release("c")


def test_a_prompt_larger_than_the_pool_is_refused_at_once(worker):
    t0 = time.monotonic()
    with pytest.raises(CapacityError, match="a prompt of 300 tokens needs 18 pages; .* has 10 in all"):
        worker.prefill_request("big", prompt(300, 3), PARAMS, wait_s=30)
    assert time.monotonic() - t0 < 5 and worker.counters()["pages_in_use"] == 0


def test_probes_answer_while_a_prefill_holds_the_lock(worker):
    answers: list = []
    with worker._lock:                                 # what a long prefill does for its whole forward
        probe = threading.Thread(target=lambda: answers.extend([worker.counters(),
                                                                worker.cached_prefix_pages(prompt(40, 4))]))
        probe.start()
        probe.join(5)
        assert not probe.is_alive(), "counters / cached_prefix_pages waited for the prefill lock"
    assert answers[0]["pages_free"] == 10 and answers[1] == 0


def test_a_withdrawn_prompt_stops_waiting_and_frees_its_turn(worker):
    from transfer.endpoint import Withdrawn

    worker.prefill_request("a", prompt(100, 11), PARAMS)                  # 6 of the 10 pages held
    got: dict = {}

    def run(rid: str, n: int) -> threading.Thread:
        def go() -> None:
            try:
                got[rid] = worker.prefill_request(rid, prompt(n, 12), PARAMS, 60)
            except Exception as exc:
                got[rid] = exc
        t = threading.Thread(target=go)
        t.start()
        return t

    tb = run("b", 100)                               # waits for "a"
    time.sleep(0.3)
    tc = run("c", 20)                                # fits, but behind "b"
    time.sleep(0.5)
    assert not got and worker.withdraw("b")
    tb.join(10)
    tc.join(30)
    assert isinstance(got["b"], Withdrawn) and got["c"]["manifest"], got
    assert worker.release("a") and worker.release("c") and worker.counters()["pages_in_use"] == 0


def test_a_hold_lasts_as_long_as_its_caller_may_wait(worker):
    """Holds expired after hold_timeout_s (120 s) while the router could wait up to 600 s for a decode
    worker's room: the push then failed with 'not held'. hold_timeout_s is shrunk here to 0.2 s."""
    import dataclasses

    worker.cfg = dataclasses.replace(worker.cfg, hold_timeout_s=0.2)
    worker.prefill_request("patient", prompt(40, 13), PARAMS, wait_s=30)
    worker.prefill_request("quick", prompt(40, 14), PARAMS, wait_s=0.1)
    time.sleep(1.0)                                   # the notice thread expires holds every few ms
    assert worker.counters()["requests_held"] == 1
    assert worker.release("patient") and not worker.release("quick")


def test_a_hold_being_pushed_does_not_expire(worker):
    """_expire freed pages a push was still reading (a slow NIXL WRITE); a concurrent prompt could then
    take and overwrite them mid-transfer."""
    import dataclasses

    worker.cfg = dataclasses.replace(worker.cfg, hold_timeout_s=0.0)
    worker._stop.set()                                # no background expiry: this test calls _expire itself
    worker._thread.join(5)
    worker.prefill_request("p", prompt(40, 15), PARAMS, wait_s=0.0)
    assert worker._claim("p", math.inf)               # as push() does before the transfer starts
    time.sleep(0.05)
    worker._expire()
    assert worker.counters()["requests_held"] == 1
    worker._held["p"].expires = 0.0                   # the push ended without freeing it: it expires
    worker._expire()
    assert worker.counters()["requests_held"] == 0 and worker.counters()["pages_in_use"] == 0


def test_an_expired_hold_cannot_be_claimed_for_a_pull(worker):
    """A pull after the hold expired READ whatever request had taken those pages since, and decoded
    from it as if it were its own; the caller now claims the hold first and learns it is gone."""
    import dataclasses

    worker.cfg = dataclasses.replace(worker.cfg, hold_timeout_s=0.0)
    worker.prefill_request("late", prompt(40, 17), PARAMS, wait_s=0.0)
    worker.prefill_request("kept", prompt(40, 18), PARAMS, wait_s=30.0)
    assert worker.claim("kept")
    deadline = time.monotonic() + 5
    while worker.counters()["requests_held"] > 1 and time.monotonic() < deadline:
        time.sleep(0.05)                              # the notice thread expires "late"
    assert not worker.claim("late") and worker.counters()["requests_held"] == 1
    assert worker.release("kept") and worker.counters()["pages_in_use"] == 0


def test_a_claimed_pull_whose_caller_died_still_expires(worker, monkeypatch):
    """A claimed hold never expired: a driver that died between claim and release leaked its pages."""
    import dataclasses

    import prefill.worker

    monkeypatch.setattr(prefill.worker, "CLAIM_GRACE_S", 0.3)
    worker.cfg = dataclasses.replace(worker.cfg, hold_timeout_s=0.0, transfer_deadline_s=0.0)
    worker.prefill_request("orphan", prompt(40, 19), PARAMS, wait_s=0.0)
    assert worker.claim("orphan")
    assert worker.counters()["requests_held"] == 1                 # held past hold_timeout_s: claimed
    deadline = time.monotonic() + 10
    while worker.counters()["requests_held"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.counters()["requests_held"] == 0 and worker.counters()["pages_in_use"] == 0


def test_a_malformed_notice_or_a_failing_poll_does_not_stop_freeing_pages(worker, caplog):
    """One done notice with a non-UTF-8 id ended the notice thread for good (an uncaught
    UnicodeDecodeError), and with it every later release by notice and every expiry."""
    from transfer.manifest import done_notice

    worker.prefill_request("a", prompt(40, 16), PARAMS)
    worker.transport.deliver("stranger", b"done:\xff\xfe")
    real_poll, failures = worker.transport.poll_notifications, []

    failed = threading.Event()

    def poll_failing_once():                          # a transport hiccup this test cannot cause otherwise
        if not failures:
            failures.append(1)
            failed.set()
            raise RuntimeError("transport hiccup")
        return real_poll()

    worker.transport.poll_notifications = poll_failing_once
    assert failed.wait(10) and worker._thread.is_alive()
    worker.transport.deliver("decode", done_notice("a"))
    deadline = time.monotonic() + 5
    while worker.counters()["requests_held"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.counters()["requests_held"] == 0 and worker.counters()["pages_in_use"] == 0
    assert "malformed done notice" in caplog.text and "transport hiccup" in caplog.text


def test_a_prompt_withdrawn_while_it_runs_stops_at_the_next_chunk():
    """A cancelled long prompt ran to its end (43 s for 6,000 tokens on this CPU), holding the worker's
    lock, so every request behind it waited."""
    from transfer.endpoint import Withdrawn

    w = PrefillWorker(WorkerConfig(f"long-{time.monotonic_ns()}", "bf16", load_format="dummy",
                                   model_shape="smollm2-135m", device="cpu", transport="inprocess",
                                   num_pages=200, chunk_size=64))
    try:
        got: dict = {}

        def run() -> None:
            start = time.monotonic()
            try:
                got["result"] = w.prefill_request("long", prompt(2000, 16), PARAMS, 60)
            except Exception as exc:
                got["result"] = exc
            got["s"] = time.monotonic() - start

        t = threading.Thread(target=run)
        t.start()
        assert wait_for(lambda: w._busy_with == "long", 30)
        assert w.withdraw("long")
        t.join(60)
        assert isinstance(got["result"], Withdrawn), got
        assert w.counters()["pages_in_use"] == 0 and w.counters()["requests_held"] == 0
        assert w.prefill_request("next", prompt(40, 17), PARAMS, 10)["manifest"]    # the worker goes on
    finally:
        w.shutdown()


def wait_for(condition, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False
