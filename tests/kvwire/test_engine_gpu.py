"""On CUDA the runner takes the Triton kernels; they must compute what the CPU reference does.

Same dummy-weight model (SmolLM2 shape) on the GPU and the CPU, float32 so that only the KV path
differs; prefill in two chunks (chunk kernel, quantise-on-write) then decode steps (decode
kernel), logits compared step by step.
"""
import copy

import pytest
import torch

from kvwire.engine import Engine, EngineConfig
from kvwire.kv_cache import SequenceKV
from kvwire.model.config import SHAPES
from kvwire.model.llama import LlamaModel
from kvwire.runner import Segment

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


@pytest.fixture(scope="module")
def models():
    cpu = LlamaModel(SHAPES["smollm2-135m"], dtype=torch.float32, device="cpu")
    cpu.init_random(seed=0)
    return cpu, copy.deepcopy(cpu).to("cuda")


@pytest.mark.parametrize("fmt", ["bf16", "fp8-token", "fp8-tensor", "nvfp4", "fp8-token/nvfp4"])
def test_kernel_path_matches_reference(models, fmt):
    torch.manual_seed(0)
    ids = torch.randint(0, 49152, (83,)).tolist()
    steps = torch.randint(0, 49152, (20,)).tolist()
    logits = []
    for model in models:
        engine = Engine(model, EngineConfig(kv_format=fmt, chunk_size=48), calibration_ids=ids)
        seq = SequenceKV()
        out = [engine.prefill(seq, ids).float().cpu()]
        for i, tok in enumerate(steps):
            out.append(engine.runner.forward([Segment(seq, [tok], ids + steps[:i + 1])])[0].float().cpu())
        engine.runner.release(seq)
        assert engine.kv.pool.counters().used == 0
        logits.append(torch.stack(out))
    cpu, gpu = logits
    err = (gpu - cpu).norm(dim=-1) / cpu.norm(dim=-1)
    assert float(err.max()) < 2e-2, err
    assert (gpu.argmax(-1) == cpu.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("fmt", ["fp8-token", "nvfp4"])
def test_gathered_prefix_path_matches_reference(models, fmt, monkeypatch):
    """The runner with every chunk's prefix gathered to bf16 (chunk_gathered), as it chooses for long
    prefixes and wide chunks on Hopper: prefill in three chunks, logits against the CPU reference."""
    from kvwire.kernels import chunk_gathered, chunk_plan
    calls, original = [], chunk_gathered.gathered_chunk_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    monkeypatch.setattr(chunk_plan, "gathered_prefix_pays", lambda *a: True)
    monkeypatch.setattr(chunk_gathered, "gathered_chunk_attention", counted)
    torch.manual_seed(1)
    ids = torch.randint(0, 49152, (130,)).tolist()
    logits = []
    for model in models:
        engine = Engine(model, EngineConfig(kv_format=fmt, chunk_size=48), calibration_ids=ids)
        seq = SequenceKV()
        logits.append(engine.prefill(seq, ids).float().cpu())
        engine.runner.release(seq)
    assert calls, "the runner never took the gathered path"
    cpu, gpu = logits
    assert float((gpu - cpu).norm() / cpu.norm()) < 2e-2
