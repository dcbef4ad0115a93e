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


def test_a_withdrawn_waiter_leaves_the_queue_and_those_behind_go_on(pair):
    """A request whose caller gave up (client cancel, deadline) stayed first in line until it got room
    or its own wait ran out, holding up later requests that fit."""
    from transfer.endpoint import Withdrawn

    prefill, decode = pair
    a, b, c = SamplingParams(max_tokens=120), SamplingParams(max_tokens=150), SamplingParams(max_tokens=4)
    decode.reserve(manifest(prefill, "wa", 100, a), a, timeout_s=10)             # may grow to 13 of 24 pages
    outcome: dict = {}

    def reserve(rid: str, blob: bytes, params: SamplingParams) -> threading.Thread:
        def run() -> None:
            try:
                outcome[rid] = decode.reserve(blob, params, timeout_s=60)
            except Exception as exc:
                outcome[rid] = exc
        t = threading.Thread(target=run)
        t.start()
        return t

    tb = reserve("wb", manifest(prefill, "wb", 100, b), b)       # 15 pages: waits for "wa"
    time.sleep(0.5)
    tc = reserve("wc", manifest(prefill, "wc", 20, c), c)        # 1 page: fits, but queued behind "wb"
    time.sleep(0.5)
    assert not outcome
    assert decode.withdraw("wb") and not decode.withdraw("nobody")
    tb.join(10)
    tc.join(10)
    assert isinstance(outcome["wb"], Withdrawn), outcome
    assert "pages" in outcome["wc"], outcome                     # admitted beside "wa", without waiting for it
    assert decode.cancel("wa") and decode.cancel("wc") and decode.counters()["pages_in_use"] == 0


def test_a_failed_activation_frees_its_pages(pair, monkeypatch):
    """activate() took the reservation, then failed building the request (a device error, faked here):
    its pages were held by nothing, and neither cancel nor abort could reach them."""
    import decode.worker

    prefill, decode_worker = pair
    params = SamplingParams(max_tokens=8)
    decode_worker.reserve(manifest(prefill, "act", 40, params), params, timeout_s=10)

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory (faked)")

    monkeypatch.setattr(decode.worker, "Sampler", broken)
    with pytest.raises(RuntimeError, match="faked"):
        decode_worker.activate("act")
    assert not decode_worker.cancel("act") and not decode_worker.abort("act")
    assert decode_worker.counters()["pages_in_use"] == 0


def test_pages_an_aborted_transfer_may_still_write_are_quarantined(pair, monkeypatch):
    """A transfer whose abort could not confirm it stopped (NIXL still PROC after the grace) may go on
    writing into the reserved pages: they went straight back to the pool, to the next request admitted."""
    import pickle

    import decode.worker
    from transfer.base import TransferError

    prefill, decode_worker = pair
    monkeypatch.setattr(decode.worker, "QUARANTINE_S", 0.5)
    params = SamplingParams(max_tokens=4)
    slots = decode_worker.kv.tails.free_slots
    pages = decode_worker.reserve(manifest(prefill, "q", 40, params), params, timeout_s=10)["pages"]
    assert decode_worker.kv.tails.free_slots == slots - 1
    assert decode_worker.cancel("q", quarantine=True)
    c = decode_worker.counters()
    assert c["pages_quarantined"] == len(pages) == c["pages_in_use"] > 0 and c["reserved"] == 0
    assert decode_worker.kv.tails.free_slots == slots     # no transfer writes a tail slot: it is free at once
    time.sleep(1.0)
    c = decode_worker.counters()
    assert c["pages_quarantined"] == 0 and c["pages_in_use"] == 0
    # the flag reaches the router through Ray, which pickles the worker's exception
    assert pickle.loads(pickle.dumps(TransferError("ended TIMED_OUT", quiesced=False))).quiesced is False


def test_a_manifest_whose_token_or_tail_the_model_cannot_use_is_refused(pair):
    """A first token past the vocabulary, or a NaN in the bf16 tail, passed the manifest's checks; the
    request was admitted and the next decode step failed every request batched with it."""
    import msgpack

    from transfer.manifest import ManifestError

    prefill, decode_worker = pair
    params = SamplingParams(max_tokens=4)
    payload = msgpack.unpackb(manifest(prefill, "bad", 40, params))     # 2 full pages and an 8-token tail
    assert payload["tail"]
    for change, words in (({"first_token": 10**9}, "first_token 1000000000 is not a token id"),
                          ({"tail": b"\xff" * len(payload["tail"])}, "non-finite")):    # bf16 0xffff is a NaN
        with pytest.raises(ManifestError, match=words):
            decode_worker.reserve(msgpack.packb(payload | change), params, timeout_s=10)
    assert decode_worker.counters()["pages_in_use"] == 0 and decode_worker.counters()["reserved"] == 0
    assert decode_worker.reserve(msgpack.packb(payload), params, timeout_s=10)["pages"]
    assert decode_worker.cancel("bad")
