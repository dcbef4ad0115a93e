"""`kvwire bench decode-step`: one engine decode step, replayed from CUDA graphs vs run eagerly.

What a decode worker's inner loop costs per step: B sequences each add one token (the runner's
decode-step path: closed tail pages quantised before the forward, then per layer one tail write
and one paged-decode call). Random weights at ``--model-shape`` (speed does not depend on their
values). The sequences are prefilled to just under ``--context``, 0..B-1 tokens apart, so their
pages close on different steps as in serving; no sequence crosses a page-table width bucket
while timed, so one graph serves every timed step. Paths, measured in one run per format:

- ``eager``: the decode-step path launched op by op (the baseline; also what the CPU runs);
- ``graphs``: the same step replayed from ``kvwire.decode_graphs`` (CUDA only).

Time is wall time per step with the device synchronised, median of ``--steps`` after 3 warm-up
steps (the first of which captures the graph). ``graphs_speedup`` = eager median / graphs median.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-shape", default="smollm2-135m", help="model shape with random weights "
                        "(kvwire.model.config.SHAPES; default smollm2-135m)")
    parser.add_argument("--formats", default="bf16,fp8-token,nvfp4,fp8-token/nvfp4",
                        help="comma-separated KV formats (KEYS/VALUES for mixed)")
    parser.add_argument("--batch", type=int, default=16, help="sequences decoded together (default 16)")
    parser.add_argument("--context", type=int, default=2048, help="tokens per sequence, about (default 2048)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per path (default 20)")
    parser.add_argument("--device", default="auto", help="auto (cuda if visible), cuda or cpu")


def _step_times(engine, seqs: list, steps: int) -> list[float]:
    from kvwire.runner import Segment

    times = []
    for _ in range(steps):
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.runner.forward([Segment(s, [17], None) for s in seqs]).cpu()
        times.append(time.perf_counter() - t0)
    return times


def run(args) -> dict:
    from kvwire.commands.model_args import resolve_device
    from kvwire.decode_graphs import DecodeGraphs
    from kvwire.engine import Engine, EngineConfig
    from kvwire.errors import UsageError
    from kvwire.formats import KVFormat
    from kvwire.kv_cache import SequenceKV
    from kvwire.model.config import SHAPES
    from kvwire.model.registry import load_model

    if args.model_shape not in SHAPES:
        raise UsageError(f"unknown --model-shape {args.model_shape!r}; known: {', '.join(SHAPES)}")
    device = resolve_device(args.device)
    if args.batch < 1 or args.steps < 1:
        raise UsageError("--batch and --steps must be at least 1")
    max_context = SHAPES[args.model_shape].max_context     # positions past it have no RoPE entry
    if args.context > max_context:
        raise UsageError(f"--context {args.context} is longer than {args.model_shape}'s maximum context "
                         f"({max_context} tokens)")
    warmup = 3
    start = args.context - args.batch - warmup - args.steps
    if start < 1:
        raise UsageError(f"--context {args.context} is too short for --batch {args.batch} and --steps {args.steps}")
    for fmt in args.formats.split(","):     # all checked before the model loads and the first format runs
        KVFormat.parse(fmt)
    model, _ = load_model(load_format="dummy", model_shape=args.model_shape, device=device)
    paths = ["eager"] + (["graphs"] if device.type == "cuda" else [])
    rows = []
    for fmt in args.formats.split(","):
        engine = Engine(model, EngineConfig(kv_format=fmt, max_sequences=args.batch, cuda_graphs=False,
                                            num_pages=args.batch * (args.context // EngineConfig.page_size + 4)),
                        calibration_ids=list(range(100, 400)))
        gen = torch.Generator().manual_seed(0)
        seqs = []
        for i in range(args.batch):
            seqs.append(SequenceKV())
            engine.prefill(seqs[-1], torch.randint(1, model.config.vocab_size, (start + i,), generator=gen).tolist())
        row = {"format": fmt}
        for path in paths:
            engine.runner.decode_steps = DecodeGraphs(engine.runner) if path == "graphs" else None
            _step_times(engine, seqs, warmup)
            t = _step_times(engine, seqs, args.steps)
            row[f"{path}_ms"] = 1e3 * statistics.median(t)
            row[f"{path}_min_ms"] = 1e3 * min(t)
            print(f"  {fmt} {path}: {row[f'{path}_ms']:.2f} ms per step", flush=True)
        if "graphs" in paths:
            row["graphs_speedup"] = row["eager_ms"] / row["graphs_ms"]
        rows.append(row)
        engine.runner.decode_steps = None
        for s in seqs:
            engine.runner.release(s)
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "model_shape": args.model_shape, "batch": args.batch, "context": args.context, "steps": args.steps,
            "rows": rows}


def format_table(result: dict) -> str:
    graphs = any("graphs_ms" in r for r in result["rows"])
    head = (f"decode step, {result['model_shape']} (random weights), {result['batch']} sequences of about "
            f"{result['context']} tokens, {result['device']}; median of {result['steps']} steps")
    lines = [head, "", "| KV format | eager ms |" + (" graphs ms | graphs speedup |" if graphs else ""),
             "|---|---:|" + ("---:|---:|" if graphs else "")]
    for r in result["rows"]:
        line = f"| {r['format']} | {r['eager_ms']:.2f} |"
        if graphs:
            line += f" {r['graphs_ms']:.2f} | {r['graphs_speedup']:.1f}x |"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    from kvwire.bench import module_main

    module_main(sys.modules[__name__])
