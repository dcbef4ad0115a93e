"""Requests that outgrow a worker's page pool, in-process on a real Ray cluster: requests too
large for a worker are refused with INVALID_ARGUMENT at once; requests that only do not fit
together wait for each other instead of failing mid-stream; a request_id in flight is not
accepted twice. Random weights at SmolLM2's shape keep it quick on the CPU."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch

from router.client import RouterClient
from router.config import PoolConfig, RouterConfig, ServeConfig
from router.serve import start_router
from tests.router.conftest import wait_until

pytestmark = pytest.mark.slow

PAGES = 24        # per worker; 16-token pages


@pytest.fixture(scope="module")
def client(ray_cluster):
    cfg = ServeConfig(RouterConfig(port=0, metrics_port=0, max_inflight=8, max_queue=8),
                      (PoolConfig("small", load_format="dummy", model_shape="smollm2-135m", device="cpu",
                                  num_pages=PAGES, max_batch=8),))
    running = start_router(cfg)
    with RouterClient(running.target, timeout_s=300) as c:
        yield c
    running.stop()


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
    wait_until(lambda: idle(client), 30.0)


def test_requests_that_fit_only_one_at_a_time_all_finish(client):
    """Each may grow to 13 of the 24 pages: admitted together they would run out mid-stream (every
    one of them failed so before admission counted growth); now they take turns and all finish."""
    def run(i: int):
        return client.complete(prompt_ids=prompt(100, 10 + i), max_tokens=120, ignore_eos=True, timeout_s=240)

    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(run, range(3)))
    for c in done:
        assert c.finished.finish_reason == "length" and len(c.token_ids) == 120
    wait_until(lambda: idle(client), 30.0)


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
    wait_until(lambda: idle(client), 30.0)
