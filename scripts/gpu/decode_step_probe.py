"""Time one engine decode step (the decode worker's inner loop) on the GPU, in one run: the
decode-step path replayed from CUDA graphs (kvwire.decode_graphs), the same path eager (batched
tail writes, full tails quantised before the forward), and the general per-sequence path.

    python3 scripts/gpu/decode_step_probe.py [--shape smollm2-135m] [--batch 16] [--context 2048]

Random weights at the shape (speed does not depend on their values), B sequences prefilled to just
under the context, 0..B-1 tokens apart (so that pages complete on different steps, as in serving;
the context is not crossed while timing, so one graph serves every step), then timed
decode steps of all B together (CUDA-synchronised wall time per step, median of --steps).
"per-sequence" forces every sequence through the general store path (a handful of small ops per
sequence and layer, and chunk attention), which is what every decode step did before.
Prints a table and writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kvwire import runner as runner_mod
from kvwire.decode_graphs import DecodeGraphs
from kvwire.engine import Engine, EngineConfig
from kvwire.kv_cache import SequenceKV
from kvwire.model.registry import load_model
from kvwire.runner import Segment


def per_sequence_appends(*_args):
    """Stands in for ``DecodeBatch.of``: no decode-step path, so every sequence takes the general
    path (the behaviour before it)."""
    return None


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(engine: Engine, seqs: list[SequenceKV], steps: int) -> list[float]:
    times = []
    dev = engine.kv.device.type
    tok = 17
    for _ in range(steps):
        sync(dev)
        t0 = time.perf_counter()
        logits = engine.runner.forward([Segment(s, [tok], None) for s in seqs])
        logits.cpu()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--formats", default="bf16,nvfp4,fp8-token/nvfp4")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="decode_step.json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    model, _ = load_model(load_format="dummy", model_shape=args.shape, device=args.device)
    rows = []
    original = runner_mod.DecodeBatch.of
    for fmt in args.formats.split(","):
        engine = Engine(model, EngineConfig(kv_format=fmt, max_sequences=args.batch,
                                            num_pages=args.batch * (args.context // 16 + 8)),
                        calibration_ids=list(range(100, 400)))
        gen = torch.Generator().manual_seed(0)
        seqs = []
        for i in range(args.batch):
            s = SequenceKV()
            start = args.context - args.batch - 2 * args.steps - 8 + i
            engine.prefill(s, torch.randint(1, 40000, (start,), generator=gen).tolist())
            seqs.append(s)
        paths = [("graphs", original, True)] if args.device == "cuda" else []
        for name, of, graphs in paths + [("decode-step", original, False), ("per-sequence", per_sequence_appends, False)]:
            runner_mod.DecodeBatch.of = staticmethod(of)
            engine.runner.decode_steps = DecodeGraphs(engine.runner) if graphs else None
            time_steps(engine, seqs, 3)
            t = time_steps(engine, seqs, args.steps)
            rows.append({"shape": args.shape, "format": fmt, "batch": args.batch, "context": args.context,
                         "path": name, "median_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t)})
            print(f"{fmt:18s} {name:13s} median {rows[-1]['median_ms']:8.2f} ms  min {rows[-1]['min_ms']:8.2f} ms",
                  flush=True)
        runner_mod.DecodeBatch.of = original
        engine.runner.decode_steps = None
        for s in seqs:
            engine.runner.release(s)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
