"""Prefill and decode Ray actors on 127.0.0.1, compact pages pulled over NIXL (UCX, DRAM)."""
import os
import time

import pytest

from decode.actor import start_decode_actor
from kvwire.engine import Engine, EngineConfig
from kvwire.calibration import CALIBRATION_TEXT
from kvwire.sampling import SamplingParams
from kvwire.worker_config import WorkerConfig
from prefill.actor import start_prefill_actor
from router.disagg import RequestFailed, TransferMode, connect, generate

pytestmark = pytest.mark.slow
pytest.importorskip("nixl")

PROMPT = "Here is a list of countries and their capitals. Germany: Berlin. Spain: Madrid. Italy: Rome. France:"


def start_pair(fmt: str, tag: str, **kw):
    prefill = start_prefill_actor(WorkerConfig(f"prefill-{tag}", fmt, device="cpu", **kw))
    decode = start_decode_actor(WorkerConfig(f"decode-{tag}", fmt, device="cpu", **kw))
    return connect(prefill, decode)


def kill_and_wait_gone(ray, actor, timeout: float = 30.0) -> None:
    """Kill an actor and wait until its process has exited.

    `ray.kill` returns before the process is gone; while it lingers its NIXL agent still serves
    its pages, so a test of "the prefill worker died" must wait for the exit.
    """
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    ray.kill(actor)
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"actor process {pid} still alive {timeout}s after ray.kill")
        time.sleep(0.05)


def wait_pages_free(ray, *actors, timeout: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        counters = ray.get([a.counters.remote() for a in actors])
        if all(c["pages_in_use"] == 0 for c in counters) or time.monotonic() > deadline:
            return counters
        time.sleep(0.1)


@pytest.mark.parametrize("fmt,mode", [("bf16", "pull"), ("fp8-token", "push"), ("nvfp4", "push")])
def test_disaggregated_tokens_equal_single_process(ray_cluster, smollm2, fmt, mode):
    ray = ray_cluster
    model, tok = smollm2
    ids = tok.encode(PROMPT + " Paris. Portugal: Lisbon. Austria:")
    params = SamplingParams(max_tokens=12)
    engine = Engine(model, EngineConfig(kv_format=fmt), tok.encode(CALIBRATION_TEXT))
    want = list(engine.generate(ids, params))
    pair = start_pair(fmt, fmt.replace("/", "_"))
    prefill, decode = pair.prefill, pair.decode
    report = {}
    try:
        got = list(generate(pair, "req-1", ids, params, TransferMode(mode), report=report))
        assert got == want
        if mode == "push":
            # Wire bytes: the format's bytes per token for full-page tokens, plus the bf16 tail.
            pf = engine.page_format
            pages = (len(ids) - 1) // pf.page_size
            tail = len(ids) - pages * pf.page_size
            wire = report["compact_bytes"] + tail * pf.bf16_bytes_per_token
            want_bytes = pf.bytes_per_token * pages * pf.page_size + tail * pf.bf16_bytes_per_token
            assert abs(wire - want_bytes) <= 0.01 * want_bytes
            assert report["bf16_bytes"] == pages * pf.page_size * pf.bf16_bytes_per_token
            assert report["descriptors"] == 1  # fresh pools: one contiguous run on both sides
        counters = wait_pages_free(ray, prefill, decode)
        assert [c["pages_in_use"] for c in counters] == [0, 0], counters
    finally:
        for a in (prefill, decode):
            ray.kill(a)


def test_bad_manifests_are_refused_and_dead_prefill_frees_decode(ray_cluster, smollm2):
    ray = ray_cluster
    _, tok = smollm2
    ids = tok.encode(PROMPT)
    params = SamplingParams(max_tokens=4)
    pair = start_pair("fp8-token", "bad", transfer_deadline_s=5.0)
    prefill, decode = pair.prefill, pair.decode
    other = start_prefill_actor(WorkerConfig("prefill-other", "nvfp4", device="cpu"))
    try:
        with pytest.raises(ray.exceptions.RayTaskError, match="malformed|msgpack"):
            ray.get(decode.admit.remote(b"\x93not a manifest", params))
        blob = ray.get(other.prefill.remote("wrong-format", ids, params))
        with pytest.raises(ray.exceptions.RayTaskError, match="format"):
            ray.get(decode.admit.remote(blob, params))
        # A dead prefill worker: its manifest is valid, but its pages can no longer be pulled.
        blob = ray.get(prefill.prefill.remote("orphan", ids, params))
        kill_and_wait_gone(ray, prefill)
        with pytest.raises(ray.exceptions.RayTaskError, match="orphan.*failed|orphan.*ended"):
            ray.get(decode.admit.remote(blob, params))
        assert ray.get(decode.counters.remote())["pages_in_use"] == 0
        with pytest.raises(RequestFailed, match="died"):
            list(generate(pair, "after-death", ids, params))
    finally:
        for a in (prefill, decode, other):
            ray.kill(a)


def test_fifty_requests_some_aborted_leave_no_pages(ray_cluster, smollm2):
    ray = ray_cluster
    _, tok = smollm2
    pair = start_pair("fp8-token/nvfp4", "fifty")
    try:
        aborted = 0
        for n in range(50):
            ids = tok.encode(f"Request {n}: " + "count with me, " * (n % 9) + "one two")
            gen = generate(pair, f"r{n}", ids, SamplingParams(max_tokens=4, stop_at_eos=False))
            if n % 5 == 2:
                next(gen)
                gen.close()           # the client goes away after the first token
                aborted += 1
            else:
                assert len(list(gen)) == 4
        assert aborted == 10
        counters = wait_pages_free(ray, pair.prefill, pair.decode)
        assert [c["pages_in_use"] for c in counters] == [0, 0], counters
        assert counters[0]["requests_held"] == 0 and counters[1]["running"] == 0
    finally:
        for a in (pair.prefill, pair.decode):
            ray.kill(a)
