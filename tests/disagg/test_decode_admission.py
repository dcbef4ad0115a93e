"""Decode admission with a small page pool: a request is admitted only when the pool can hold it at
max_tokens beside what the admitted ones may still grow to; one that can never fit is refused at
once; waiters are admitted in arrival order. Plain classes, in-process transport, random weights."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from decode.worker import DecodeWorker
from kvwire.page_pool import CapacityError
from kvwire.sampling import SamplingParams
from kvwire.worker_config import WorkerConfig
from prefill.worker import PrefillWorker

DUMMY = dict(load_format="dummy", model_shape="smollm2-135m", device="cpu", transport="inprocess")


@pytest.fixture(scope="module")
def pair():
    tag = time.monotonic_ns()
    prefill = PrefillWorker(WorkerConfig(f"adm-prefill-{tag}", "nvfp4", num_pages=64, **DUMMY))
    decode = DecodeWorker(WorkerConfig(f"adm-decode-{tag}", "nvfp4", num_pages=24, max_batch=8, **DUMMY))
    prefill.add_peer(decode.handshake())
    decode.add_peer(prefill.handshake())
    yield prefill, decode
    decode.shutdown()
    prefill.shutdown()


def manifest(prefill: PrefillWorker, rid: str, tokens: int, params: SamplingParams) -> bytes:
    ids = torch.randint(1, 49152, (tokens,), generator=torch.Generator().manual_seed(len(rid) + tokens)).tolist()
    blob = prefill.prefill(rid, ids, params)
    prefill.release(rid)                   # the pages stay unsent: reservation is all this tests
    return blob


def test_too_large_for_the_pool_is_refused_at_once(pair):
    prefill, decode = pair
    params = SamplingParams(max_tokens=400)            # 100 + 399 tokens: 31 pages of the 24
    with pytest.raises(CapacityError, match=r"may grow to 31 pages \(prompt and max_tokens\); .* has 24 in all"):
        decode.reserve(manifest(prefill, "huge", 100, params), params, timeout_s=30)
    assert decode.counters()["pages_in_use"] == 0


def test_growth_is_reserved_and_waiters_go_in_order(pair):
    prefill, decode = pair
    a, b, c = SamplingParams(max_tokens=120), SamplingParams(max_tokens=150), SamplingParams(max_tokens=4)
    got = decode.reserve(manifest(prefill, "a", 100, a), a, timeout_s=10)      # may grow to 13 pages
    assert len(got["pages"]) == 6
    order: list[str] = []

    def wait_for(rid: str, blob: bytes, params: SamplingParams) -> threading.Thread:
        t = threading.Thread(target=lambda: (decode.reserve(blob, params, timeout_s=60), order.append(rid)))
        t.start()
        return t

    tb = wait_for("b", manifest(prefill, "b", 100, b), b)     # 15 pages: 13 + 15 > 24, so it waits
    time.sleep(0.5)
    tc = wait_for("c", manifest(prefill, "c", 20, c), c)      # 1 page would fit now, but b came first
    time.sleep(0.5)
    assert order == [] and decode.counters()["reserved"] == 1
    assert decode.cancel("a")
    tb.join(30)
    tc.join(30)
    assert order == ["b", "c"]
    assert decode.cancel("b") and decode.cancel("c") and decode.counters()["pages_in_use"] == 0
