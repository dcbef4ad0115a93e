"""Requests that outgrow a worker's page pool, in-process on a real Ray cluster: requests too
large for a worker are refused with INVALID_ARGUMENT at once; requests that only do not fit
together wait for each other instead of failing mid-stream; a request_id in flight is not
accepted twice; a cancelled request waiting for pages holds up no one; a decode worker's death
ends its streams at once whoever notices it. Random weights at SmolLM2's shape keep it quick on
the CPU."""
from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import ray
import torch

from router.client import RouterClient
from router.config import PoolConfig, RouterConfig, ServeConfig
from router.serve import start_router
from router.workers import Role
from tests.router.conftest import wait_until

pytestmark = pytest.mark.slow

PAGES = 24        # per worker; 16-token pages


@pytest.fixture(scope="module")
def router(ray_cluster):
    cfg = ServeConfig(RouterConfig(port=0, metrics_port="any", max_inflight=8, max_queue=8),
                      (PoolConfig("small", load_format="dummy", model_shape="smollm2-135m", device="cpu",
                                  num_pages=PAGES, max_batch=8, hung_worker_s=10),))
    running = start_router(cfg)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(router):
    with RouterClient(router.target, timeout_s=300) as c:
        yield c


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(1, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def idle(client: RouterClient) -> bool:
    return all(w.pages_in_use == 0 and w.requests == 0 for p in client.stats().pools for w in p.workers)


@pytest.mark.parametrize("tokens, max_tokens, words", [
    (500, 8, ["500 tokens needs 31 pages", f"has {PAGES} in all"]),         # the prefill worker's pool
    (100, 400, ["may grow to 31 pages", f"has {PAGES} in all"]),            # the decode worker's
])
def test_a_request_larger_than_a_pool_is_invalid_at_once(client, tokens, max_tokens, words):
    with pytest.raises(grpc.RpcError) as err:
        client.complete(prompt_ids=prompt(tokens, 1), max_tokens=max_tokens, timeout_s=60)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    for word in words:
        assert word in err.value.details()
    assert "Traceback" not in err.value.details()
    assert wait_until(lambda: idle(client), 30.0), client.stats()


def test_requests_that_fit_only_one_at_a_time_all_finish(client):
    """Each may grow to 13 of the 24 pages: admitted together they would run out mid-stream (every
    one of them failed so before admission counted growth); now they take turns and all finish."""
    def run(i: int):
        return client.complete(prompt_ids=prompt(100, 10 + i), max_tokens=120, ignore_eos=True, timeout_s=240)

    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(run, range(3)))
    for c in done:
        assert c.finished.finish_reason == "length" and len(c.token_ids) == 120
    assert wait_until(lambda: idle(client), 30.0), client.stats()


def test_a_request_id_in_flight_is_refused(client):
    first: dict = {}
    streaming = threading.Event()

    def run_first() -> None:
        out = []
        for event in client.generate(None, prompt(40, 3), 120, max_tokens=60, ignore_eos=True, request_id="same"):
            out.append(event)
            streaming.set()
        first["events"] = out

    t = threading.Thread(target=run_first)
    t.start()
    assert streaming.wait(120)
    with pytest.raises(grpc.RpcError) as err:
        client.complete(prompt_ids=prompt(40, 4), max_tokens=4, request_id="same", timeout_s=60)
    assert err.value.code() is grpc.StatusCode.ALREADY_EXISTS and "'same'" in err.value.details()
    t.join(120)
    assert first["events"][-1].finished.completion_tokens == 60
    again = client.complete(prompt_ids=prompt(40, 5), max_tokens=4, request_id="same", timeout_s=60)
    assert len(again.token_ids) == 4                      # the id is free again once the first ended
    assert wait_until(lambda: idle(client), 30.0), client.stats()


def test_a_cancelled_waiter_does_not_hold_up_those_behind_it(client):
    """B waits for decode room behind A and its client gives up; C fits beside A. C waited behind the
    dead B until A finished (and B then reserved pages for nobody)."""
    ended: dict = {}

    def stream(name: str, ids: list[int], max_tokens: int) -> None:
        try:
            for _ in client.generate(None, ids, 300, max_tokens=max_tokens, ignore_eos=True):
                pass
        finally:
            ended[name] = time.monotonic()

    a = threading.Thread(target=stream, args=("a", prompt(100, 20), 230))     # may grow to 21 of the 24 pages
    a.start()
    assert wait_until(lambda: any(w.requests for p in client.stats().pools for w in p.workers
                                  if w.role == "decode"), 60)
    b = client.generate(None, prompt(100, 21), 300, max_tokens=120, ignore_eos=True)  # 13 pages: must wait
    threading.Timer(3.0, b.cancel).start()
    with pytest.raises(grpc.RpcError) as err:
        next(b)
    assert err.value.code() is grpc.StatusCode.CANCELLED
    client.complete(prompt_ids=prompt(10, 22), max_tokens=2, timeout_s=120)            # C: one page
    c_done = time.monotonic()
    a.join(300)
    assert c_done < ended["a"] - 1.0, f"C waited for A to finish (C ended {ended['a'] - c_done:.1f} s before A)"
    assert wait_until(lambda: idle(client), 30.0), client.stats()


def test_a_request_id_retried_after_its_deadline_runs(client):
    """The client's first try ends at its deadline while its prompt is still in prefill; a retry under
    the same request_id found the first run's key still held on the worker and failed (INTERNAL)."""
    with pytest.raises(grpc.RpcError) as err:
        client.complete(prompt_ids=prompt(350, 40), max_tokens=4, request_id="retried", timeout_s=0.3)
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    again = client.complete(prompt_ids=prompt(350, 40), max_tokens=4, request_id="retried", timeout_s=120)
    assert len(again.token_ids) == 4
    assert wait_until(lambda: idle(client), 30.0), client.stats()


def test_a_client_closing_the_call_counts_ok_or_cancelled_never_failed(client):
    """Clients close the call as soon as Finished arrives, or mid-stream; when the router was paused at a
    yield it saw GeneratorExit, not CancelledError, and counted the request failed."""
    before = client.stats().pools[0]
    for i in range(10):
        stream = client.generate(None, prompt(20, 50 + i), 60, max_tokens=2 if i % 2 else 40, ignore_eos=True)
        for event in stream:
            if event.HasField("finished") or i % 2 == 0:     # odd: after Finished; even: after the first tokens
                stream.cancel()
                break
    stats = lambda: client.stats().pools[0]  # noqa: E731
    assert wait_until(lambda: stats().requests_ok + stats().requests_cancelled
                      == before.requests_ok + before.requests_cancelled + 10, 10), client.stats()
    assert stats().requests_failed == before.requests_failed
    assert stats().requests_ok - before.requests_ok >= 5


def test_a_hung_decode_worker_is_replaced_and_its_streams_end(router, client):
    """A decode worker that stops answering (SIGSTOP here; a GPU stuck in a kernel alike): its streams
    hung until their deadline (600 s without one) and it was never replaced."""
    pool = router.pools["small"]
    stream = client.generate(None, prompt(40, 60), 60, max_tokens=300, ignore_eos=True)
    assert next(stream).HasField("delta")
    victim = next(w for w in pool.workers if w.role is Role.DECODE)
    pid = ray.get(victim.actor.__ray_call__.remote(lambda self: os.getpid()))
    replaced = pool.totals.workers_replaced
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(grpc.RpcError) as err:
            for _ in stream:
                pass
        assert err.value.code() is grpc.StatusCode.INTERNAL and "hung" in err.value.details(), err.value
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:                  # killed by the router, as it should be
            pass
    assert wait_until(lambda: pool.totals.workers_replaced == replaced + 1 and idle(client), 120), client.stats()
    assert client.complete(prompt_ids=prompt(20, 61), max_tokens=3, timeout_s=120).finished.completion_tokens == 3


def test_both_workers_dying_together_end_streams_at_once_and_the_pool_recovers(router, client):
    """Deaths noticed by a probe, a reservation or the gauge refresher (not the stream pump): the pump
    was cancelled without ending its streams, which hung until their deadline. Both roles dying
    together: each replacement connected only to the live workers when it started, so the two never
    met and every later request failed (INTERNAL, 'not a connected peer') while Stats said alive.
    Last in this module: it replaces both workers."""
    pool = router.pools["small"]
    stream = client.generate(None, prompt(40, 30), 60, max_tokens=300, ignore_eos=True)
    assert next(stream).HasField("delta")
    dead = {w.role: w for w in pool.workers}
    replaced = pool.totals.workers_replaced
    # as reserve() and a probe do on a RayActorError
    router._loop.call_soon_threadsafe(lambda: [pool.worker_died(w) for w in dead.values()])
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        for _ in stream:
            pass
    assert err.value.code() is grpc.StatusCode.INTERNAL and "died" in err.value.details(), err.value
    assert time.monotonic() - start < 20
    # health says what the pool can do (it said SERVING while no worker was live)
    assert wait_until(lambda: health(router) == ("NOT_SERVING", "NOT_SERVING"), 5), health(router)
    assert wait_until(lambda: pool.totals.workers_replaced >= replaced + 2 and idle(client), 180), client.stats()
    assert wait_until(lambda: health(router) == ("SERVING", "SERVING"), 10), health(router)
    done = client.complete(prompt_ids=prompt(20, 31), max_tokens=3, timeout_s=120).finished
    assert done.completion_tokens == 3
    assert done.decode_worker != dead[Role.DECODE].name and done.prefill_worker != dead[Role.PREFILL].name
    prefill = next(w for w in pool.workers if w.role is Role.PREFILL)
    peers = ray.get(prefill.actor.__ray_call__.remote(lambda self: sorted(self.transport.peers)))
    assert peers == [done.decode_worker], peers

    def gauged() -> set[str]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10).read().decode()
        return {line.split('worker="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("kvwire_kv_pages_in_use{")}
    # the dead workers' series went (they kept their last reading for good); the refresher runs every 5 s
    assert wait_until(lambda: gauged() == {done.decode_worker, done.prefill_worker}, 30), gauged()


def health(router) -> tuple[str, str]:
    """The router's health for its service and for pool "small"."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(router.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return tuple(health_pb2.HealthCheckResponse.ServingStatus.Name(
            stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status)
            for name in ("kvwire.v1.Router", "kvwire.v1.Router/small"))
