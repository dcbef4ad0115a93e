"""On a GPU: prefill and decode actors sharing one GPU, pages pushed VRAM -> VRAM over NIXL.

Dummy weights at the SmolLM2 shape (the real GGUF is too big to carry to the GPU machine in one
run); the disaggregated tokens must equal the single-process engine's on the same weights.

This module starts its own Ray cluster: it declares the GPU (fractional actors need it counted),
forwards actor output (a worker that fails to start says why), and gives the actors the
driver's whole PYTHONPATH. On the GPU machine Ray, NIXL and gguf come from a PYTHONPATH entry
(/tmp/site); with only the tree on it, the actors' worker processes cannot import ray, never
register, and ``ray.get`` waits forever (the 2026-12-02 failure and hang).
"""
import os
import pathlib

import pytest
import torch

from decode.actor import start_decode_actor
from kvwire.engine import Engine, EngineConfig
from kvwire.model.registry import load_model
from kvwire.sampling import SamplingParams
from kvwire.worker_config import WorkerConfig
from prefill.actor import start_prefill_actor
from router.disagg import connect, generate

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("nixl")

DUMMY = dict(load_format="dummy", model_shape="smollm2-135m", device="cuda")
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
    ray.init(address="local", num_cpus=4, num_gpus=1, _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=True, object_store_memory=200 * 1024 * 1024, configure_logging=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.parametrize("fmt", ["bf16", "fp8-token", "nvfp4", "fp8-token/nvfp4"])
def test_vram_push_tokens_equal_single_process(ray_cluster, fmt):
    ray = ray_cluster
    model, _ = load_model(**DUMMY)
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (300,)).tolist()
    params = SamplingParams(max_tokens=16, stop_at_eos=False)
    engine = Engine(model, EngineConfig(kv_format=fmt))
    want = list(engine.generate(ids, params))
    tag = fmt.replace("/", "_")
    prefill = start_prefill_actor(WorkerConfig(f"gpu-prefill-{tag}", fmt, model="dummy", **DUMMY), num_gpus=0.4)
    decode = start_decode_actor(WorkerConfig(f"gpu-decode-{tag}", fmt, model="dummy", **DUMMY), num_gpus=0.4)
    try:
        pair = connect(prefill, decode)
        report = {}
        got = list(generate(pair, "gpu-1", ids, params, report=report))
        assert got == want
        pf = engine.page_format
        assert report["compact_bytes"] == (len(ids) - 1) // pf.page_size * pf.page_bytes
        assert report["descriptors"] == 1
        counters = ray.get([prefill.counters.remote(), decode.counters.remote()])
        assert [c["pages_in_use"] for c in counters] == [0, 0], counters
    finally:
        for a in (prefill, decode):
            ray.kill(a)
    del engine, model
    torch.cuda.empty_cache()
