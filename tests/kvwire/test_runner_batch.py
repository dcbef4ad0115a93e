"""A decode step over many sequences must store and attend exactly as each sequence alone.

Decode steps write the new token's K/V into every sequence's bf16 tail with one indexed write
per layer (sequences whose tail page is full take the general path: quantise it, open a new
tail). Here sequences at different tail offsets, one with a full tail, decode together; their
logits and their stored K/V must equal those of the same sequences decoded one at a time.
"""
import pytest
import torch

from kvwire.engine import Engine, EngineConfig
from kvwire.kv_cache import SequenceKV
from kvwire.model.config import ModelConfig
from kvwire.model.llama import LlamaModel
from kvwire.runner import Segment

TINY = ModelConfig(name="tiny", vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rope_scaling=None,
                   rms_norm_eps=1e-5, max_context=512, tie_embeddings=True, bos_token_id=None)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def run(model, fmt: str, prompts: list[list[int]], steps: list[list[int]], together: bool):
    engine = Engine(model, EngineConfig(kv_format=fmt, page_size=8, chunk_size=16),
                    calibration_ids=list(range(1, 60)))
    engine.kv.pool.storage.random_(0, 256)             # poison: an unwritten page cannot pass
    engine.kv.tails.data.normal_().mul_(1e3)
    seqs = [SequenceKV() for _ in prompts]
    for seq, ids in zip(seqs, prompts):
        engine.prefill(seq, ids)
    logits = []
    for step in steps:
        segs = [Segment(seq, [tok], None) for seq, tok in zip(seqs, step)]
        if together:
            logits.append(engine.runner.forward(segs).float().cpu())
        else:
            logits.append(torch.cat([engine.runner.forward([s]).float().cpu() for s in segs]))
    kv = engine.kv
    stored = [(torch.stack([kv.read_pages(layer, part, seq.pages) for layer in range(2) for part in (0, 1)]),
               kv.tails.data[seq.tail_slot].float().cpu()[..., :seq.tail_len(8), :])
              for seq in seqs]
    for seq in seqs:
        engine.runner.release(seq)
    assert kv.pool.counters().used == 0
    return torch.stack(logits), stored


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["bf16", "fp8-token/nvfp4"])
def test_batched_decode_equals_one_at_a_time(device, fmt):
    model = LlamaModel(TINY, dtype=torch.float32, device=device)
    model.init_random(seed=1)
    g = torch.Generator().manual_seed(2)
    lengths = [5, 8, 14, 1]        # tails of 5, 8 (full: the first step opens a page), 6 and 1 tokens
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in lengths]
    steps = [torch.randint(1, 97, (len(prompts),), generator=g).tolist() for _ in range(11)]
    alone, stored_alone = run(model, fmt, prompts, steps, together=False)
    batched, stored_batched = run(model, fmt, prompts, steps, together=True)
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)
    for (pages_a, tail_a), (pages_b, tail_b) in zip(stored_alone, stored_batched):
        torch.testing.assert_close(pages_b, pages_a, rtol=1e-3, atol=1e-3)
        # bf16 tails: a batched matmul may round a K/V element one bf16 step differently
        torch.testing.assert_close(tail_b, tail_a, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("broken", ["_eager", "DecodeBatch"])
def test_a_step_that_fails_before_it_runs_frees_its_new_pages(broken, monkeypatch):
    """A step allocates its new pages first; a failure while building it (out of device memory, faked
    here) before the old try block leaked those pages for good: the caller frees only committed ones."""
    import kvwire.runner

    model = LlamaModel(TINY, dtype=torch.float32, device="cpu")
    model.init_random(seed=2)
    engine = Engine(model, EngineConfig(kv_format="fp8-token", page_size=8, chunk_size=16),
                    calibration_ids=list(range(1, 60)))
    seq = SequenceKV()
    engine.prefill(seq, list(range(1, 17)))             # two full pages and an empty tail: a step takes a page
    held = engine.kv.pool.counters().used

    def oom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (faked)")

    if broken == "_eager":
        monkeypatch.setattr(engine.runner, "_eager", oom)
    else:
        monkeypatch.setattr(kvwire.runner.DecodeBatch, "of", oom)
    with pytest.raises(RuntimeError, match="faked"):
        engine.runner.forward([Segment(seq, [5], None)])
    assert engine.kv.pool.counters().used == held
    engine.runner.release(seq)
    assert engine.kv.pool.counters().used == 0
