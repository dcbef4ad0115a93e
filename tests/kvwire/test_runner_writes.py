"""What a forward's page writes cost and what a failed one leaves behind.

Non-finite K/V (a NaN in any layer) must fail the whole forward before anything is committed: the
pages it allocated go back to the pool, the sequence keeps its pages and token count. On CUDA the
non-finite count is read once after the last layer, so the model's layers run without a single
host sync (page ids are on the device before the first layer); the GPU test checks that with
torch's sync debug mode.
"""
import pytest
import torch

from kvwire.engine import Engine, EngineConfig
from kvwire.kv_cache import SequenceKV
from kvwire.model.config import ModelConfig
from kvwire.model.llama import LlamaModel
from kvwire.quant import NonFiniteInputError
from kvwire.runner import Segment

TINY = ModelConfig(name="tiny", vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=3,
                   num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rope_scaling=None,
                   rms_norm_eps=1e-5, max_context=512, tie_embeddings=True, bos_token_id=None)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PAGE = 8


def engine_on(device: str, fmt: str, seed: int = 1) -> Engine:
    model = LlamaModel(TINY, dtype=torch.float32, device=device)
    model.init_random(seed=seed)
    return Engine(model, EngineConfig(kv_format=fmt, page_size=PAGE, chunk_size=16),
                  calibration_ids=list(range(1, 60)))


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def poison_keys(model: LlamaModel, layer: int) -> None:
    """NaN key projection weights in one layer: its K (and every later layer's input) turn NaN."""
    c = model.config
    with torch.no_grad():
        model.layers[layer].qkv_proj[c.q_size:c.q_size + c.kv_size].fill_(float("nan"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8-token/nvfp4", "fp8-tensor"])
@pytest.mark.parametrize("new_tokens", [12, 5])
def test_non_finite_kv_fails_the_forward_and_commits_nothing(device, fmt, new_tokens):
    """(A decode step's one token cannot be in the page it completes: that page is the old tail.)"""
    engine = engine_on(device, fmt)
    seq = SequenceKV()
    engine.prefill(seq, tokens(20, seed=3))
    pool = engine.kv.pool
    used, pages, num_tokens = pool.counters().used, list(seq.pages), seq.num_tokens
    segment = Segment(seq, tokens(new_tokens, seed=4), None)
    assert engine.runner.pages_needed(seq, new_tokens) >= 1, "the forward must quantise a page"
    poison_keys(engine.runner.model, 1)
    with pytest.raises(NonFiniteInputError, match="non-finite"):
        engine.runner.forward([segment])
    assert pool.counters().used == used, "the failed forward's new pages were not returned"
    assert (seq.pages, seq.num_tokens, segment.new_pages) == (pages, num_tokens, None)
    engine.runner.release(seq)
    assert pool.counters().used == 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_forward_after_a_failed_one_is_unaffected(device):
    """The failure is per forward: afterwards the engine prefills exactly as a fresh one does."""
    engine, fresh = engine_on(device, "fp8-token/nvfp4"), engine_on(device, "fp8-token/nvfp4")
    weights = engine.runner.model.layers[2].qkv_proj
    saved = weights.clone()
    poison_keys(engine.runner.model, 2)
    bad = SequenceKV()
    with pytest.raises(NonFiniteInputError):
        engine.prefill(bad, tokens(20, seed=5))
    engine.runner.release(bad)
    with torch.no_grad():
        weights.copy_(saved)
    got = engine.prefill(SequenceKV(), tokens(27, seed=6))
    want = fresh.prefill(SequenceKV(), tokens(27, seed=6))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt, gathered", [("bf16", False), ("fp8-token", False), ("nvfp4", False),
                                           ("fp8-token/nvfp4", False), ("nvfp4", True)])
def test_cuda_forward_runs_its_layers_without_a_host_sync(fmt, gathered, monkeypatch):
    if gathered:       # every chunk's prefix through chunk_gathered (cuDNN), as wide chunks on Hopper
        from kvwire.kernels import chunk_plan
        monkeypatch.setattr(chunk_plan, "gathered_prefix_pays", lambda *a: True)
    engine = engine_on("cuda", fmt)
    warm = SequenceKV()
    engine.prefill(warm, tokens(37, seed=7))                  # compiles every kernel the forwards below use
    engine.runner.forward([Segment(warm, [5], None)])
    model = engine.runner.model

    def no_sync(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return model(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    engine.runner.model = no_sync
    seqs = [SequenceKV(), SequenceKV()]
    engine.prefill(seqs[0], tokens(37, seed=8))              # chunked prefill: pages quantised per layer
    engine.prefill(seqs[1], tokens(12, seed=9))
    for step in range(PAGE):                                   # decode steps; some complete a page
        engine.runner.forward([Segment(s, [step + 1], None) for s in seqs + [warm]])
    assert all(len(s.pages) >= 2 for s in seqs)
