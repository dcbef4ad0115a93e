"""The router under load, in-process on a real Ray cluster: 64 concurrent streams with a prefill
worker killed during them, client cancellation and deadlines. Nothing is lost or duplicated and
no worker holds pages afterwards."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import ray

from kvwire.model.registry import load_tokenizer
from kvwire.sampling import SamplingParams
from router.client import RouterClient
from router.config import PoolConfig, RouterConfig, ServeConfig
from router.serve import start_router
from router.workers import Role
from tests.router.conftest import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def router(ray_cluster):
    cfg = ServeConfig(RouterConfig(port=0, metrics_port=0, max_inflight=32, max_queue=64, max_attempts=3),
                      (PoolConfig("load", kv_format="fp8-token", prefill_workers=2, decode_workers=1,
                                  num_pages=1024, max_batch=32),))
    running = start_router(cfg)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(router):
    with RouterClient(router.target, timeout_s=300) as c:
        yield c


def _idle(client: RouterClient) -> bool:
    return all(w.pages_in_use == 0 and w.requests == 0 for p in client.stats().pools for w in p.workers)


def test_prefill_worker_chosen_by_prefix_affinity(router, client):
    """Prime the second prefill worker's cache with a prompt; the router sends that prompt to it."""
    pool = router.pools["load"]
    second = sorted((w for w in pool.workers if w.role is Role.PREFILL), key=lambda w: w.name)[1]
    text = "Affinity check. " + "Pages of a shared prefix stay cached on one worker. " * 12
    ids = load_tokenizer().encode(text)
    ray.get(second.actor.prefill_request.remote("prime", ids, SamplingParams(max_tokens=1)))
    ray.get(second.actor.release.remote("prime"))
    done = client.complete(text, max_tokens=2).finished
    assert done.prefill_worker == second.name
    assert done.prefix_pages_reused == (len(ids) - 1) // 16
    again = client.complete("Something else entirely, short.", max_tokens=1).finished
    assert again.prefix_pages_reused == 0


def test_64_streams_with_a_prefill_worker_killed(router, client):
    pool = router.pools["load"]
    ok_before = stats_of(client).requests_ok
    seen: dict[int, object] = {}
    lock = threading.Lock()

    def one(i: int):
        rid = f"load-{i}"
        tokens = []
        try:
            for e in client.generate(f"Request {i}: list three colours.", max_tokens=8, request_id=rid):
                if e.HasField("delta"):
                    tokens.extend(e.delta.token_ids)
                else:
                    assert e.finished.request_id == rid and e.finished.completion_tokens == len(tokens)
                    result = ("ok", e.finished.attempts)
        except grpc.RpcError as exc:
            result = (exc.code().name, exc.details())
        with lock:
            assert i not in seen, f"request {i} answered twice"
            seen[i] = result
        return result

    def kill_a_prefill_worker():
        wait_until(lambda: len(seen) >= 4, 120, 0.05)
        victim = next(w for w in pool.workers if w.role is Role.PREFILL and w.alive)
        ray.kill(victim.actor, no_restart=True)

    killer = threading.Thread(target=kill_a_prefill_worker)
    killer.start()
    with ThreadPoolExecutor(64) as ex:
        results = list(ex.map(one, range(64)))
    killer.join()
    assert sorted(seen) == list(range(64))
    ok = [r for r in results if r[0] == "ok"]
    failed = [r for r in results if r[0] != "ok"]
    assert all(code in ("INTERNAL", "UNAVAILABLE") for code, _ in failed), failed
    assert len(ok) >= 56, results          # a killed worker's requests are retried, at most a few fail
    stats = client.stats().pools[0]
    assert stats.requests_ok - ok_before == len(ok)
    assert wait_until(lambda: stats_of(client).workers_replaced >= 1, 120), "the dead worker was not replaced"
    assert wait_until(lambda: _idle(client), 60), client.stats()
    live = [w for w in stats_of(client).workers if w.role == "prefill" and w.alive]
    assert len(live) == 2


def stats_of(client: RouterClient):
    return client.stats().pools[0]


def test_client_cancel_frees_pages(client):
    stream = client.generate("Count: 1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=400)
    got = 0
    for e in stream:
        assert e.HasField("delta"), "the request finished before it could be cancelled"
        got += len(e.delta.token_ids)
        if got >= 3:
            break
    stream.cancel()
    assert wait_until(lambda: _idle(client), 30), client.stats()
    # the router counts the cancel when its handler unwinds, which can be after the workers are idle
    assert wait_until(lambda: stats_of(client).requests_cancelled >= 1, 10), client.stats()


def test_deadline_ends_request_and_frees_pages(client):
    """A deadline is a cancel, not a worker failure: when the router's own timer fired first (it runs to
    the client's deadline) the request was counted failed."""
    before = stats_of(client)
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        client.complete("Count: 1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=400, timeout_s=3.0)
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - start < 15
    assert wait_until(lambda: _idle(client), 30), client.stats()
    assert wait_until(lambda: stats_of(client).requests_cancelled == before.requests_cancelled + 1, 10), \
        client.stats()
    assert stats_of(client).requests_failed == before.requests_failed


def test_decode_worker_killed_mid_stream_fails_cleanly_then_is_replaced(router, client):
    pool = router.pools["load"]
    stream = client.generate("Count: 1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=400)
    first = next(stream)
    assert first.HasField("delta")
    victim = next(w for w in pool.workers if w.role is Role.DECODE)
    ray.kill(victim.actor, no_restart=True)
    with pytest.raises(grpc.RpcError) as err:
        for _ in stream:
            pass
    assert err.value.code() is grpc.StatusCode.INTERNAL and "died" in err.value.details()
    done = client.complete("After the replacement.", max_tokens=2, timeout_s=180).finished
    assert done.completion_tokens == 2 and done.decode_worker != victim.name
    assert wait_until(lambda: _idle(client), 60), client.stats()
