"""Decode steps replayed from CUDA graphs, one per (batch bucket, page-table width).

Why: a decode step of a small model is bound by kernel launches, not by the kernels. SmolLM2 at
batch 16 spent ~22 ms per step on the H200 against about a millisecond of kernel time
(docs/benchmarks.md, "Decode step"). A graph replays the step's few hundred launches as one.

What makes a step capturable (``kvwire.decode_batch``): every decode step is, per layer, one
indexed write into the tail pool and one paged-decode call; the tail pages a step closes are
quantised before it, eagerly; and nothing inside the layers synchronises with the host
(``kvwire.runner``). So a step depends on its batch only through the inputs' sizes.

Shapes: a step of B sequences whose longest has N pages runs in the bucket (B', W): B' the
smallest of ``BATCH_BUCKETS`` >= B, W the smallest power of two >= N (at least ``MIN_WIDTH``).
Rows B..B'-1 repeat row 0 (``DecodeBatch.padded``); columns past a row's page count are never
read. The split-KV plan of the paged-decode kernel depends only on (B', W), so it is fixed in
the graph. A bucket is captured on first use, with that step's real inputs in its buffers: the
warm-up runs and the capture's own replay write the same K/V to the same tail positions, so
capturing changes nothing a plain step would not.

Memory: the graphs share one memory pool, and each graph copies its logits into one output
buffer shared by all (sized for the largest bucket the tail pool allows) instead of keeping its
own. A graph's intermediates are free once it ends, so the next capture reuses them; what every
extra bucket keeps is its few input buffers. Without the shared output, each of the up to 14 x
(widths) buckets would hold its own [rows, vocab] fp32 logits (by arithmetic, about 1 GB at 8k
context for SmolLM2's vocabulary).

``capture=False`` runs the same padded, fixed-shape step eagerly: what the tests check on the CPU
against the plain forward, and a fallback where capture is unavailable.
"""
from __future__ import annotations

import logging
import time

import torch

from kvwire.decode_batch import DecodeBatch, DecodeTensors, decode_attention

log = logging.getLogger(__name__)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MIN_WIDTH = 16          # pages; 256 tokens at page size 16


def batch_bucket(rows: int) -> int:
    for b in BATCH_BUCKETS:
        if b >= rows:
            return b
    raise ValueError(f"a decode step of {rows} sequences is larger than the largest bucket ({BATCH_BUCKETS[-1]})")


def width_bucket(pages: int) -> int:
    width = MIN_WIDTH
    while width < pages:
        width *= 2
    return width


class StaticDecodeStep:
    """One bucket: fixed input buffers on the device, the step over them, and its graph if captured."""

    def __init__(self, runner, rows: int, width: int) -> None:
        self.runner, self.rows, self.width = runner, rows, width
        none = torch.empty(0, dtype=torch.int32)
        self.inputs = DecodeBatch([0] * rows, [0] * rows, [0] * rows, [0] * rows, [none] * rows).tensors(width).to(
            runner.kv.device)
        self.indices = torch.arange(rows, device=runner.kv.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None        # the shared output's first ``rows`` rows once captured

    def load(self, batch: DecodeBatch) -> None:
        batch.padded(self.rows).tensors(self.width).copy_into(self.inputs)

    def forward(self) -> torch.Tensor:
        t: DecodeTensors = self.inputs
        return self.runner.model(t.ids, t.pos, decode_attention(self.runner.kv, t), logits_indices=self.indices)

    def capture(self, pool, out: torch.Tensor) -> None:
        """Warm up on a side stream (compiles kernels, builds the model's caches), then capture the
        step with its logits copied into ``out`` (the output shared by every bucket)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a decode worker's admission threads copy scales and receive pages on other
        # streams meanwhile; in the default (global) mode their CUDA calls would invalidate the capture
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            out[:self.rows].copy_(self.forward())
        self.graph, self.logits = graph, out[:self.rows]

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


class DecodeGraphs:
    """``ModelRunner.decode_steps``: runs each decode step in its bucket, from a graph if ``capture``.

    A step larger than the largest bucket runs eagerly at its own size. A bucket whose capture
    fails (a warning says why) runs eagerly in its fixed shape from then on: the warm-up has run the
    step, and running it again writes the same bytes.
    """

    def __init__(self, runner, capture: bool = True) -> None:
        if capture and runner.kv.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the KV cache is on {runner.kv.device}")
        self.runner, self.capture = runner, capture
        self.steps: dict[tuple[int, int], StaticDecodeStep] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.out: torch.Tensor | None = None      # logits of every captured bucket (one step at a time)

    def _output(self) -> torch.Tensor:
        """The shared logits buffer: rows for the largest bucket the tail pool can fill."""
        if self.out is None:
            kv, model = self.runner.kv, self.runner.model
            rows = batch_bucket(min(kv.tails.data.shape[0], BATCH_BUCKETS[-1]))
            self.out = torch.empty((rows, model.config.vocab_size), dtype=torch.float32, device=kv.device)
        return self.out

    def __call__(self, batch: DecodeBatch) -> torch.Tensor:
        """Float32 logits [len(batch), vocab] of the step (a copy: the graphs share one output buffer)."""
        if len(batch) > BATCH_BUCKETS[-1]:
            t = batch.tensors().to(self.runner.kv.device)
            rows = torch.arange(len(batch), device=self.runner.kv.device)
            return self.runner.model(t.ids, t.pos, decode_attention(self.runner.kv, t), logits_indices=rows)
        key = (batch_bucket(len(batch)), width_bucket(max(len(x) for x in batch.pages)))
        step = self.steps.get(key)
        fresh = step is None
        if fresh:
            step = self.steps[key] = StaticDecodeStep(self.runner, *key)
        step.load(batch)
        if self.capture and fresh:
            try:
                t0 = time.perf_counter()
                step.capture(self.pool, self._output())
                log.info("decode step bucket %s (sequences, page-table width): CUDA graph captured in %.0f ms",
                         key, 1e3 * (time.perf_counter() - t0))
            except RuntimeError as exc:
                log.warning("decode step %s: CUDA graph capture failed, running it eagerly: %s", key, exc)
        if step.graph is None:
            return step.forward()[:len(batch)]
        return step.replay()[:len(batch)].clone()
