"""`kvwire serve` end to end: a subprocess with two pools (bf16, NVFP4) of the real SmolLM2 on
Ray/NIXL, called by the generated client, by a client built from reflection alone, and by
`kvwire generate --router`; bad requests, a full queue, metrics, Stats, and a clean Ctrl-C."""
from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from router.client import RouterClient
from tests.router.conftest import kvwire_exe, start_serve, wait_until

pytestmark = pytest.mark.slow

CONFIG = """
[router]
max_inflight = 4
max_queue = 4

[[pools]]
name = "smol-bf16"
kv_format = "bf16"
num_pages = 512
max_batch = 8

[[pools]]
name = "smol-nvfp4"
kv_format = "nvfp4"
num_pages = 512
max_batch = 8
"""


@pytest.fixture(scope="module")
def served(tmp_module):
    s = start_serve(CONFIG, tmp_module)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(served):
    with RouterClient(served.target, timeout_s=120) as c:
        yield c


def test_generated_client_streams_tokens(client):
    events = list(client.generate("The capital of France is", max_tokens=6))
    deltas = [e.delta for e in events if e.HasField("delta")]
    assert len(deltas) >= 2, "tokens should arrive in more than one message"
    done = events[-1].finished
    assert events[-1].HasField("finished") and done.pool == "smol-bf16" and done.kv_format == "bf16"
    tokens = [t for d in deltas for t in d.token_ids]
    assert len(tokens) == done.completion_tokens == 6 and done.finish_reason == "length"
    assert "Paris" in "".join(d.text for d in deltas)
    assert done.prompt_tokens == 5 and done.ttft_s > 0 and done.attempts == 1


def test_reflection_only_client(served):
    """No generated code: descriptors come from the server's reflection service."""
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(served.target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        assert "kvwire.v1.Router" in db.get_services()
        pool = descriptor_pool.DescriptorPool(db)
        method = pool.FindServiceByName("kvwire.v1.Router").methods_by_name["Generate"]
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        call = channel.unary_stream("/kvwire.v1.Router/Generate", request_serializer=request_cls.SerializeToString,
                                    response_deserializer=response_cls.FromString)
        events = list(call(request_cls(prompt="The capital of France is", max_tokens=4, kv_format="nvfp4"),
                           timeout=120))
    tokens = [t for e in events if e.HasField("delta") for t in e.delta.token_ids]
    assert len(tokens) == 4 and events[-1].finished.kv_format == "nvfp4"


def test_health_service_says_serving(served):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(served.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", "kvwire.v1.Router"):
            assert stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("kwargs, words", [
    (dict(prompt=""), ["prompt is empty"]),
    (dict(prompt="hi", kv_format="fp5"), ["fp5", "served formats: bf16, nvfp4"]),
    (dict(prompt="hi", kv_format="fp8-token"), ["no pool serves", "fp8-token"]),
    (dict(prompt="hi", pool="nope"), ["unknown pool", "smol-bf16"]),
    (dict(prompt="hi", max_tokens=9000), ["max_tokens must be between 1 and 8191"]),
    (dict(prompt="hi", temperature=-1.0), ["temperature"]),
    (dict(prompt="hi", temperature=float("nan")), ["temperature", "finite", "nan"]),
    (dict(prompt="hi", temperature=1e39), ["temperature", "finite", "inf"]),        # inf as a proto float
    (dict(prompt="word " * 9000), ["9001 tokens", "at most 8191"]),
    (dict(prompt="hi", prompt_ids=[1, 2]), ["not both"]),
])
def test_bad_requests_are_invalid_argument(client, kwargs, words):
    prompt = kwargs.pop("prompt")
    with pytest.raises(grpc.RpcError) as err:
        client.complete(prompt, **kwargs)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    for w in words:
        assert w in err.value.details()


def test_generate_cli_against_router(served):
    out = subprocess.run([kvwire_exe(), "generate", "--router", served.target, "--max-tokens", "5",
                          "The capital of France is"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout and "pool smol-bf16 (bf16)" in out.stdout
    bad = subprocess.run([kvwire_exe(), "generate", "--router", served.target, "--kv-format", "fp8-head", "hi"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "INVALID_ARGUMENT" in bad.stderr and "Traceback" not in bad.stderr


def test_nvfp4_pool_ships_about_0_28_of_bf16(client):
    """Same long prompts to both pools: Stats' wire bytes (full pages only) compare as the formats do."""
    before = {p.pool: p.wire_bytes for p in client.stats().pools}
    prompts = [f"Document {i}. " + "The quick brown fox jumps over the lazy dog. " * 60 for i in range(2)]
    for fmt in ("bf16", "nvfp4"):
        for p in prompts:
            done = client.complete(p, max_tokens=2, kv_format=fmt).finished
            assert done.wire_bytes > 0 and done.wire_bf16_bytes >= done.wire_bytes
            assert (done.wire_bf16_bytes > done.wire_bytes) == (fmt != "bf16")
    after = {p.pool: p for p in client.stats().pools}
    bf16 = after["smol-bf16"].wire_bytes - before["smol-bf16"]
    nvfp4 = after["smol-nvfp4"].wire_bytes - before["smol-nvfp4"]
    assert nvfp4 / bf16 == pytest.approx(6540 / 23040, rel=0.01)
    assert after["smol-nvfp4"].requests_ok >= 2


def test_queue_full_is_resource_exhausted_and_nothing_is_lost(served):
    """4 running + 4 queued fit; of 16 at once the rest are refused at once, none hangs."""
    def one(i: int):
        try:
            with RouterClient(served.target, timeout_s=180) as c:
                return c.complete(f"Count to ten: {i}", max_tokens=24).finished.completion_tokens
        except grpc.RpcError as exc:
            return exc.code()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    done = [r for r in results if isinstance(r, int)]
    refused = [r for r in results if r is grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(done) + len(refused) == 16, results
    assert refused and len(done) >= 4


def test_metrics_and_no_pages_held_after(served, client):
    with pytest.raises(grpc.RpcError) as err:       # a pool name made up by a client is not a label value
        client.complete("hi", pool="made-up-" + "z" * 40, max_tokens=2, timeout_s=30)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value
    text = urllib.request.urlopen(f"http://127.0.0.1:{served.metrics_port}/metrics", timeout=10).read().decode()
    for name in ("kvwire_ttft_seconds_bucket", "kvwire_tpot_seconds_bucket", "kvwire_requests_total",
                 "kvwire_wire_bytes_total", "kvwire_wire_bf16_bytes_total", "kvwire_kv_pages_in_use",
                 "kvwire_prefix_pages_reused_total"):
        assert name in text, name
    assert 'outcome="rejected"' in text and 'outcome="ok"' in text
    assert "made-up-" not in text and 'kvwire_requests_total{outcome="invalid",pool="-"}' in text

    def idle() -> bool:
        return all(w.pages_in_use == 0 and w.requests == 0 for p in client.stats().pools for w in p.workers)
    assert wait_until(idle, 30), client.stats()


def test_bench_serve_against_the_router(served, tmp_path):
    """Without --kv-formats it loads every format the router serves; one it does not serve is a usage error."""
    unserved = subprocess.run([kvwire_exe(), "bench", "serve", "--router", served.target, "--kv-formats",
                               "bf16,fp8-token"], capture_output=True, text=True, timeout=120)
    assert unserved.returncode == 2 and "serves bf16, nvfp4; not fp8-token" in unserved.stderr, unserved.stderr
    out = tmp_path / "serve.json"
    run = subprocess.run([kvwire_exe(), "bench", "serve", "--router", served.target,
                          "--requests", "2", "--concurrency", "2", "--prompt-tokens", "40", "--output-tokens", "3",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert [r["kv_format"] for r in result["results"]] == ["bf16", "nvfp4"]
    for r in result["results"]:
        assert r["requests_ok"] == 2 and not r["errors"] and r["ttft_p50_s"] > 0 and r["output_tokens_per_s"] > 0
    nv = result["results"][1]
    assert nv["wire_ratio"] == pytest.approx(6540 / 23040, rel=0.01)
    assert "| nvfp4 | 2 | 0 |" in run.stdout


def test_sigterm_drains_a_second_signal_cancels_and_everything_stops(served, client):
    """SIGTERM (what k8s sends; Ctrl-C alike) refuses new requests and lets streams in flight finish
    (they were cut off after 2 s; and Ray's own SIGTERM handler killed the process 3 s later, status
    134); a second signal cancels those left. The process ends cleanly, status 0."""
    short = client.generate("Count: 1, 2, 3,", max_tokens=12, ignore_eos=True)
    long = client.generate("Count: 1, 2, 3,", max_tokens=2000, ignore_eos=True, pool="smol-nvfp4")
    assert next(short).HasField("delta") and next(long).HasField("delta")     # both are decoding
    served.proc.send_signal(signal.SIGTERM)
    assert wait_until(lambda: any("draining 2 in-flight request(s)" in line for line in served.lines), 30), \
        served.lines[-10:]
    with pytest.raises(grpc.RpcError) as err:             # refused: the router is going away
        client.complete("Too late.", max_tokens=2, timeout_s=30)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE, err.value
    rest = list(short)
    assert rest[-1].HasField("finished") and rest[-1].finished.completion_tokens == 12, rest[-1]
    time.sleep(4.0)                                       # past the 3 s after which Ray's handler killed it
    assert served.proc.poll() is None, "the router did not wait for the long stream"
    served.proc.send_signal(signal.SIGINT)
    with pytest.raises(grpc.RpcError) as err:
        for _ in long:
            pass
    assert err.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), err.value
    assert served.proc.wait(90) == 0, "\n".join(served.lines[-20:])
    assert "[kvwire] stopped" in "\n".join(served.lines)
