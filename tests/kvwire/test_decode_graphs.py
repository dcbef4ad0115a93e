"""Decode steps in fixed shapes (kvwire.decode_graphs): padded to a batch bucket and a page-table
width, they must give the plain forward's logits and leave the same pages and tails, and touch
nothing else: not an idle sequence's tail, not a page outside the step. On the CPU the fixed-shape
step runs eagerly (what a graph would replay); on CUDA it is captured and replayed."""
import dataclasses

import pytest
import torch

from kvwire.decode_graphs import DecodeGraphs, batch_bucket, width_bucket
from kvwire.engine import Engine, EngineConfig
from kvwire.kv_cache import SequenceKV
from kvwire.model.llama import LlamaModel
from kvwire.runner import Segment

from .test_runner_batch import TINY

PAGE = 8
# head_dim 64 and pages of 16: the shapes the CUDA decode kernel takes (the TINY ones go to Triton)
SHAPES = {"triton": (TINY, PAGE), "cuda": (dataclasses.replace(TINY, name="tiny-d64", head_dim=64), 16)}


def run(device: str, fmt: str, graphs: str | None, steps: int = 11, shape: str = "triton", alternate: bool = False):
    """``steps`` decode steps of three sequences (with ``alternate``, every other step of one only:
    two buckets, replayed in turn) next to an idle one; returns each step's logits, the active
    sequences' pages and tails, the pages used and the runner's decode steps."""
    config, page = SHAPES[shape]
    layers = range(config.num_layers)
    model = LlamaModel(config, dtype=torch.float32, device=device)
    model.init_random(seed=1)
    engine = Engine(model, EngineConfig(kv_format=fmt, page_size=page, chunk_size=16),
                    calibration_ids=list(range(1, 60)))
    engine.kv.pool.storage.random_(0, 256, generator=torch.Generator(device).manual_seed(5))
    engine.kv.tails.data.normal_(generator=torch.Generator(device).manual_seed(6))
    if graphs is not None:
        engine.runner.decode_steps = DecodeGraphs(engine.runner, capture=graphs == "captured")
    g = torch.Generator().manual_seed(2)
    seqs = [SequenceKV() for _ in range(4)]
    for seq, n in zip(seqs, (5, 8, 14, 30)):                  # tails of 5, 8 (full), 6 and 6 tokens
        engine.prefill(seq, torch.randint(1, 97, (n,), generator=g).tolist())
    idle, active = seqs[3], seqs[:3]                          # 3 rows: padded to a bucket of 4
    idle_tail = engine.kv.tails.data[idle.tail_slot].clone()
    idle_pages = torch.stack([engine.kv.read_pages(layer, part, idle.pages) for layer in layers for part in (0, 1)])
    logits = []
    for i in range(steps):
        rows = active[:1] if alternate and i % 2 else active
        toks = torch.randint(1, 97, (len(rows),), generator=g).tolist()
        logits.append(engine.runner.forward([Segment(s, [t], None) for s, t in zip(rows, toks)]).float().cpu())
    kv = engine.kv
    stored = [(torch.stack([kv.read_pages(layer, part, s.pages) for layer in layers for part in (0, 1)]).cpu(),
               kv.tails.data[s.tail_slot].float().cpu()[..., :s.tail_len(page), :]) for s in active]
    assert torch.equal(kv.tails.data[idle.tail_slot], idle_tail), "a padded step wrote into an idle tail"
    assert torch.equal(idle_pages, torch.stack([kv.read_pages(layer, part, idle.pages)
                                                for layer in layers for part in (0, 1)]))
    used = kv.pool.counters().used
    for s in seqs:
        engine.runner.release(s)
    assert kv.pool.counters().used == 0
    return logits, stored, used, engine.runner.decode_steps


def fixed_against_plain(device: str, fmt: str, mode: str, tol: float, shape: str = "triton",
                        alternate: bool = False) -> dict:
    """Run the same steps plainly and in fixed shapes; return the fixed run's steps by bucket."""
    (la, sa, ua, _), (lb, sb, ub, fixed) = (run(device, fmt, None, shape=shape, alternate=alternate),
                                            run(device, fmt, mode, shape=shape, alternate=alternate))
    assert len(lb) == len(la)
    for step_b, step_a in zip(lb, la):
        torch.testing.assert_close(step_b, step_a, rtol=tol, atol=tol)
    assert ub == ua
    for (pa, ta), (pb, tb) in zip(sa, sb):
        assert_close_but_rare_roundings(pb, pa, tol, "pages")
        assert_close_but_rare_roundings(tb, ta, tol, "tails")
    return fixed.steps


def assert_close_but_rare_roundings(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    """Equal within ``tol`` but for at most 0.1% of the elements. A fixed-shape step pads the
    batch, which changes GEMM and attention shapes, so K/V can differ in their last fp32 bits and
    now and then round to the other bf16 tail value or FP8/E2M1 code (seen in CI: 1 of 4,608). A
    write to the wrong place would change whole token rows."""
    bad = ~torch.isclose(got, want, rtol=tol, atol=tol)
    assert int(bad.sum()) <= 1e-3 * bad.numel(), f"{what}: {int(bad.sum())} of {bad.numel()} elements differ"


@pytest.mark.parametrize("fmt", ["bf16", "fp8-token/nvfp4", "fp8-tensor"])
def test_fixed_shape_decode_steps_equal_the_plain_forward(fmt):
    steps = fixed_against_plain("cpu", fmt, "eager", 1e-5)
    assert set(steps) == {(4, 16)} and all(s.graph is None for s in steps.values())


def test_fixed_shape_steps_in_the_cuda_kernels_shape():
    steps = fixed_against_plain("cpu", "fp8-token/nvfp4", "eager", 1e-5, shape="cuda")
    assert set(steps) == {(4, 16)}


def test_two_buckets_in_turn():
    steps = fixed_against_plain("cpu", "fp8-token/nvfp4", "eager", 1e-5, alternate=True)
    assert set(steps) == {(4, 16), (1, 16)}


def test_buckets():
    assert [batch_bucket(n) for n in (1, 3, 4, 5, 17, 256)] == [1, 4, 4, 8, 24, 256]
    with pytest.raises(ValueError, match="largest bucket"):
        batch_bucket(257)
    assert [width_bucket(n) for n in (0, 1, 16, 17, 100)] == [16, 16, 16, 32, 128]


def test_a_step_past_the_largest_bucket_runs_at_its_own_size(monkeypatch):
    monkeypatch.setattr("kvwire.decode_graphs.BATCH_BUCKETS", (1, 2))
    steps = fixed_against_plain("cpu", "nvfp4", "eager", 1e-5)
    assert not steps, "three sequences fit no bucket: nothing is kept"


def test_capture_needs_cuda():
    model = LlamaModel(TINY, dtype=torch.float32, device="cpu")
    engine = Engine(model, EngineConfig(page_size=PAGE, chunk_size=16))
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        DecodeGraphs(engine.runner)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "fp8-token/nvfp4"])
@pytest.mark.parametrize("shape", ["triton", "cuda"])
def test_captured_decode_steps_equal_eager_ones(fmt, shape):
    steps = fixed_against_plain("cuda", fmt, "captured", 2e-3, shape=shape)
    assert steps and all(s.graph is not None for s in steps.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_buckets_in_turn_share_one_output():
    """Two graphs replayed in turn write their logits into the one shared buffer: each step must
    still return its own logits (a stale or overwritten output would not match the plain run)."""
    steps = fixed_against_plain("cuda", "fp8-token/nvfp4", "captured", 2e-3, shape="cuda", alternate=True)
    assert set(steps) == {(4, 16), (1, 16)} and all(s.graph is not None for s in steps.values())
    a, b = (steps[k].logits for k in ((4, 16), (1, 16)))
    assert a.data_ptr() == b.data_ptr(), "the buckets' logits are not the shared buffer"
