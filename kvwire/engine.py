"""Single-process engine: chunked prefill into compact pages, then decode on them.

One request at a time (the disaggregated workers batch); the prefix cache persists across
requests, so a prompt that shares full pages with an earlier one skips their prefill.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from kvwire.calibration import calibrate_static_scales, reduce_for_granularity
from kvwire.formats import Granularity, KVFormat, PageFormat
from kvwire.kv_cache import KVCache, SequenceKV
from kvwire.page_pool import page_chain_hashes
from kvwire.runner import ModelRunner, Segment
from kvwire.sampling import Sampler, SamplingParams, sample_rows

DEFAULT_KV_BUDGET_BYTES = 4 << 30


class InvalidRequestError(ValueError):
    """A request the engine cannot serve as given; the message says what is allowed."""


@dataclass(frozen=True)
class EngineConfig:
    kv_format: str = "bf16"
    page_size: int = 16
    chunk_size: int = 512          # prefill tokens per forward; a multiple of page_size
    num_pages: int | None = None   # default: two full contexts, within DEFAULT_KV_BUDGET_BYTES
    max_sequences: int = 8
    cuda_graphs: bool = True       # decode steps replayed from CUDA graphs (kvwire.decode_graphs); GPU only

    def __post_init__(self) -> None:
        KVFormat.parse(self.kv_format)
        if self.page_size < 1:
            raise ValueError(f"page_size must be at least 1 token, got {self.page_size}")
        if self.chunk_size < self.page_size or self.chunk_size % self.page_size:
            raise ValueError(f"chunk_size ({self.chunk_size}) must be a positive multiple of page_size ({self.page_size})")


@dataclass
class RequestSummary:
    prompt_tokens: int
    completion_tokens: int = 0
    pages_written: int = 0
    prefix_pages_reused: int = 0
    kv_bytes: int = 0
    kv_bf16_bytes: int = 0
    finish_reason: str = ""
    ttft_s: float = 0.0
    total_s: float = 0.0

    def line(self, fmt_name: str) -> str:
        ratio = self.kv_bytes / self.kv_bf16_bytes if self.kv_bf16_bytes else 0.0
        tps = self.completion_tokens / self.total_s if self.total_s else 0.0
        return (f"[kvwire] format {fmt_name} | prompt tokens {self.prompt_tokens} | completion tokens "
                f"{self.completion_tokens} ({self.finish_reason}) | pages written {self.pages_written} | "
                f"prefix pages reused {self.prefix_pages_reused} | KV held {self.kv_bytes:,} B vs bf16 "
                f"{self.kv_bf16_bytes:,} B ({ratio:.3f}) | TTFT {self.ttft_s:.2f} s | {tps:.1f} tok/s")


@dataclass
class Generation:
    """Iterate for token ids as they are sampled; ``summary`` is complete once exhausted."""

    tokens: Iterator[int]
    summary: RequestSummary
    token_ids: list[int] = field(default_factory=list)

    def __iter__(self) -> Iterator[int]:
        for t in self.tokens:
            self.token_ids.append(t)
            yield t

    def close(self) -> None:
        """Abort: stop generating and free the request's pages now."""
        self.tokens.close()


class Engine:
    def __init__(self, model: torch.nn.Module, config: EngineConfig = EngineConfig(),
                 calibration_ids: list[int] | None = None) -> None:
        mc = model.config
        self.model = model
        self.config = config
        self.device = model.device
        self.page_format = PageFormat(KVFormat.parse(config.kv_format), config.page_size,
                                      mc.num_layers, mc.num_kv_heads, mc.head_dim)
        num_pages = config.num_pages or min(math.ceil(2 * mc.max_context / config.page_size),
                                            max(1, DEFAULT_KV_BUDGET_BYTES // self.page_format.page_bytes))
        self.kv = KVCache(self.page_format, num_pages, config.max_sequences, self.device)
        if self.kv.needs_static_scales():
            kvf = self.page_format.kv
            scales = calibrate_static_scales(model, calibration_ids)
            self.kv.set_static_scales(reduce_for_granularity(
                scales, kvf.key.granularity is Granularity.TENSOR, kvf.value.granularity is Granularity.TENSOR))
        self.runner = ModelRunner(model, self.kv)
        if config.cuda_graphs and self.device.type == "cuda":
            from kvwire.decode_graphs import DecodeGraphs
            self.runner.decode_steps = DecodeGraphs(self.runner)

    @property
    def max_context(self) -> int:
        return self.model.config.max_context

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty: give at least one token of text")
        if len(prompt_ids) >= self.max_context:
            raise InvalidRequestError(f"the prompt has {len(prompt_ids)} tokens; this model allows at most "
                                      f"{self.max_context - 1} (context {self.max_context}, one left to generate)")
        vocab = self.model.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise InvalidRequestError(f"token ids must be in [0, {vocab})")

    def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams()) -> Generation:
        """Start a request; tokens are computed lazily as the returned Generation is iterated."""
        self.validate(prompt_ids, params)
        summary = RequestSummary(prompt_tokens=len(prompt_ids))
        return Generation(self._run(list(prompt_ids), params, summary), summary)

    def prefill(self, seq: SequenceKV, ids: list[int], between_chunks: Callable[[], None] = lambda: None
                ) -> torch.Tensor:
        """Fill an empty ``seq`` with the prompt's K/V, reusing cached prefix pages.

        Returns the float32 logits of the last prompt token. On failure the caller releases ``seq``.
        ``between_chunks`` runs before every chunk after the first: it raises to stop a prompt nobody
        waits for any more (a long one holds the worker for seconds per chunk on a CPU).
        """
        p = self.config.page_size
        hashes = page_chain_hashes(self.page_format.hash, ids, p)
        # Keep at least one prompt token to run, so the last position yields logits.
        reused = self.kv.pool.acquire_prefix(hashes[:(len(ids) - 1) // p])
        seq.pages, seq.chain_hashes = list(reused), hashes[:len(reused)]
        seq.num_tokens = len(reused) * p
        seq.prefix_pages_reused = len(reused)
        logits = None
        while seq.num_tokens < len(ids):
            if logits is not None:
                between_chunks()
            chunk = ids[seq.num_tokens:seq.num_tokens + self.config.chunk_size]
            logits = self.runner.forward([Segment(seq, chunk, ids[:seq.num_tokens + len(chunk)])])
        return logits[0]

    def finish_reason(self, token: int, generated: int, total_tokens: int, params: SamplingParams) -> str | None:
        """Why a request stops after sampling ``token`` (None: it goes on)."""
        if params.stop_at_eos and token in self.model.config.eos_token_ids:
            return "eos"
        if generated >= params.max_tokens or total_tokens >= self.max_context:
            return "length"
        return None

    def _run(self, ids: list[int], params: SamplingParams, summary: RequestSummary) -> Iterator[int]:
        p = self.config.page_size
        start = time.perf_counter()
        seq = SequenceKV()
        sampler = Sampler(params)
        try:
            logits = self.prefill(seq, ids)
            summary.prefix_pages_reused = seq.prefix_pages_reused
            summary.pages_written = len(seq.pages) - seq.prefix_pages_reused
            while True:
                token = sample_rows([sampler], logits[None])[0]      # greedy: argmax on the device
                if summary.completion_tokens == 0:
                    summary.ttft_s = time.perf_counter() - start
                ids.append(token)
                summary.completion_tokens += 1
                yield token
                reason = self.finish_reason(token, summary.completion_tokens, len(ids), params)
                if reason:
                    summary.finish_reason = reason
                    break
                before = len(seq.pages)
                logits = self.runner.forward([Segment(seq, [token], ids)])[0]
                summary.pages_written += len(seq.pages) - before
            tail = seq.tail_len(p)
            summary.kv_bytes = len(seq.pages) * self.page_format.page_bytes + tail * self.page_format.bf16_bytes_per_token
            summary.kv_bf16_bytes = seq.num_tokens * self.page_format.bf16_bytes_per_token
        finally:
            summary.total_s = time.perf_counter() - start
            if not summary.finish_reason:
                summary.finish_reason = "aborted"
            self.runner.release(seq)
