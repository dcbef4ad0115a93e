"""Prefill and decode workers as plain classes, with the in-process transport (no Ray)."""
import time

import msgpack
import pytest

from decode.worker import DecodeWorker
from kvwire.sampling import SamplingParams
from kvwire.worker_config import WorkerConfig
from prefill.worker import PrefillWorker
from transfer.manifest import ManifestError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workers():
    prefill = PrefillWorker(WorkerConfig("ip-prefill", "fp8-token/nvfp4", device="cpu", transport="inprocess"))
    decode = DecodeWorker(WorkerConfig("ip-decode", "fp8-token/nvfp4", device="cpu", transport="inprocess",
                                       max_batch=4))
    prefill.add_peer(decode.handshake())
    decode.add_peer(prefill.handshake())
    yield prefill, decode
    decode.shutdown()
    prefill.shutdown()


def drain(decode: DecodeWorker, rid: str) -> tuple[list[int], str]:
    tokens = []
    while True:
        batch = decode.next_tokens(rid, timeout_s=10)
        tokens += batch.tokens
        if batch.finished:
            return tokens, batch.finished


def wait_idle(prefill: PrefillWorker, decode: DecodeWorker, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = prefill.counters()
        if p["pages_in_use"] == 0 and p["requests_held"] == 0 and decode.counters()["pages_in_use"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError((prefill.counters(), decode.counters()))


def test_fifty_requests_some_aborted_leave_no_pages(workers):
    prefill, decode = workers
    tok = prefill.tokenizer
    outcomes = {}
    for round_ in range(5):
        rids = []
        for i in range(10):
            n = round_ * 10 + i
            ids = tok.encode(f"Request {n}: " + "count with me, " * (n % 7) + "one two")
            params = SamplingParams(max_tokens=3 + n % 4, stop_at_eos=False)
            rid = decode.admit(prefill.prefill(f"r{n}", ids, params), params)
            rids.append(rid)
            if n % 4 == 1:
                decode.abort(rid)
        for rid in rids:
            outcomes[rid] = drain(decode, rid)
    assert len(outcomes) == 50
    finished = [f for _, f in outcomes.values()]
    assert finished.count("aborted") >= 10
    assert all(f in ("aborted", "length") for f in finished)
    for rid, (tokens, f) in outcomes.items():
        n = int(rid[1:])
        if f == "length":
            assert len(tokens) == 3 + n % 4
    wait_idle(prefill, decode)
    assert decode.counters()["running"] == 0
    assert prefill.counters()["requests_held"] == 0


def test_bad_manifests_refused_before_any_transfer(workers):
    prefill, decode = workers
    ids = prefill.tokenizer.encode("A prompt long enough to fill two pages of sixteen tokens each, at least, "
                                   "so that pages must move.")
    params = SamplingParams(max_tokens=2, stop_at_eos=False)
    blob = prefill.prefill("bad-1", ids, params)
    payload = msgpack.unpackb(blob)
    for change, words in (({"page_ids": [10_000] + payload["page_ids"][1:]}, "page"),
                          ({"format_hash": "0" * 16}, "hash"),
                          ({"version": 99}, "version"),
                          ({"num_tokens": payload["num_tokens"] + 1}, "num_tokens")):
        with pytest.raises(ManifestError, match=words):
            decode.admit(msgpack.packb(payload | change), params)
        assert decode.counters()["pages_in_use"] == 0
    with pytest.raises(ManifestError):
        decode.admit(blob[:-7], params)
    # The genuine manifest still works, and the prefill side frees its pages on the notice.
    rid = decode.admit(blob, params)
    tokens, finished = drain(decode, rid)
    assert len(tokens) == 2 and finished == "length"
    wait_idle(prefill, decode)


def test_tail_only_prompt(workers):
    prefill, decode = workers
    params = SamplingParams(max_tokens=3, stop_at_eos=False)
    blob = prefill.prefill("short", prefill.tokenizer.encode("Hi"), params)
    tokens, _ = drain(decode, decode.admit(blob, params))
    assert len(tokens) == 3
    wait_idle(prefill, decode)


def test_a_seeded_sampled_request_gives_the_engines_tokens(workers):
    """Prefill samples token 0 and the decode worker the rest: with a seed, the split must not
    show. Two generators seeded alike used to make token 1 reuse token 0's draw (at temperature
    1000 nearly every draw picks a different token, so a reused draw shows as a repeat)."""
    prefill, decode = workers
    ids = prefill.tokenizer.encode("Once upon a time, in a small village,")
    repeats = 0
    for seed in range(8):
        params = SamplingParams(max_tokens=4, temperature=1000.0, seed=seed, stop_at_eos=False)
        rid = decode.admit(prefill.prefill(f"seeded{seed}", ids, params), params)
        split, _ = drain(decode, rid)
        assert split == list(prefill.engine.generate(list(ids), params)), seed
        repeats += split[0] == split[1]
    assert repeats <= 1, f"token 1 repeated token 0 in {repeats} of 8 seeded requests"
    wait_idle(prefill, decode)
