"""Model runner: one forward pass over several sequences' new tokens, K/V into compact pages.

For each layer the attention callback (1) joins the sequence's bf16 tail with the new tokens'
K/V, (2) quantises every page before the newest token's page into the pool (pages allocated up
front, so a forward never fails half-way for lack of room), (3) keeps the newest token's page
as the bf16 tail and (4) attends by the page-causal rule of ``kvwire.attention``.

A decode step (one token per sequence) takes a shorter road: the full tail pages its tokens close
are quantised before the forward, all sequences and layers at once, so inside the layers every
token is an append to a tail page with room (one indexed write per layer) and the attention is one
paged-decode call. On CUDA no layer synchronises with the host: page ids go to the device once per
forward, and the non-finite count of the quantised K/V is read once, after the last layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kvwire.attention import attend_paged_reference, page_causal_mask
from kvwire.decode_batch import DecodeBatch, PageRows, append_to_tails, decode_attention
from kvwire.kv_cache import KVCache, SequenceKV
from kvwire.page_pool import OutOfPagesError, page_chain_hashes
from kvwire.quant import NonFiniteCount


def on_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on ``device``. ``torch.tensor(values, device=cuda)`` copies from
    pageable memory and then synchronises the stream; a non-blocking copy only stages the bytes
    (the CUDA driver copies pageable memory before it returns), so it leaves the queue running."""
    t = torch.tensor(values, dtype=dtype)
    return t.to(device, non_blocking=True) if device.type == "cuda" else t


@dataclass
class Segment:
    """New tokens of one sequence for this forward; they start at ``seq.num_tokens``."""

    seq: SequenceKV
    token_ids: list[int]
    # The sequence's tokens so far including these, to publish full pages in the prefix cache;
    # None: do not publish (a decode worker that never saw the prompt).
    all_token_ids: list[int] | None
    new_pages: list[int] | None = None


class _WriteState:
    """What a forward's layers share: each segment's page ids on the device, copied on first use
    and kept for every layer (a host list copied inside each layer would cost a copy per layer,
    and a synchronising one at that), and the count of non-finite K/V (read once, after the last
    layer; on CUDA: the CPU reference path checks each write at once)."""

    def __init__(self, segments: list[Segment], device: torch.device) -> None:
        self.segments, self.device = segments, device
        self.nonfinite = NonFiniteCount(device) if device.type == "cuda" else None
        self._ids: dict[tuple[int, bool], torch.Tensor] = {}

    def page_ids(self, i: int, new_only: bool) -> torch.Tensor:
        """Segment ``i``'s new pages (int64, to write) or all its pages (int32, to attend)."""
        key = (i, new_only)
        if key not in self._ids:
            s = self.segments[i]
            self._ids[key] = (on_device(s.new_pages, torch.long, self.device) if new_only else
                              on_device(s.seq.pages + s.new_pages, torch.int32, self.device))
        return self._ids[key]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv: KVCache) -> None:
        self.model = model
        self.kv = kv
        self.page_size = kv.format.page_size
        # runs decode steps instead of the eager forward when set: kvwire.decode_graphs.DecodeGraphs
        self.decode_steps: Callable[[DecodeBatch], torch.Tensor] | None = None
        self.page_rows = PageRows()

    def pages_needed(self, seq: SequenceKV, num_new_tokens: int) -> int:
        """Pages to quantise: every page before the one holding the newest token.

        The newest token's page stays the bf16 tail even when full (1..page_size tokens); it is
        quantised when the next token arrives. So a query always finds its own page in the tail,
        and every earlier page in the pool, which is what the decode kernels assume.
        """
        return (seq.num_tokens + num_new_tokens - 1) // self.page_size - len(seq.pages)

    @torch.inference_mode()
    def forward(self, segments: list[Segment]) -> torch.Tensor:
        """Run the segments; returns float32 logits of each segment's last token [S, vocab]."""
        kv = self.kv
        needed = sum(self.pages_needed(s.seq, len(s.token_ids)) for s in segments)
        if not kv.pool.can_allocate(needed):
            c = kv.pool.counters()
            raise OutOfPagesError(f"this step needs {needed} new pages, only {c.available} are available")
        if sum(s.seq.tail_slot < 0 for s in segments) > kv.tails.free_slots:
            raise RuntimeError("no free tail slot: more sequences in flight than the KV cache was sized for")
        try:   # from the first page taken: a step that fails anywhere (e.g. out of device memory) frees them
            for s in segments:
                if s.seq.tail_slot < 0:
                    s.seq.tail_slot = kv.tails.allocate()
                s.new_pages = kv.pool.allocate(self.pages_needed(s.seq, len(s.token_ids)))
            batch = DecodeBatch.of(segments, self.page_size, self.page_rows)
            writes = _WriteState(segments, kv.device)
            if batch is not None and self.decode_steps is not None:
                decode_steps = self.decode_steps

                def run() -> torch.Tensor:
                    return decode_steps(batch)
            else:
                run = self._eager(segments, batch, writes)
            if batch is not None:
                self._complete_tails(segments, writes)
            logits = run()
            if writes.nonfinite is not None:
                writes.nonfinite.raise_if_any()         # one sync for the whole forward, before any commit
        except BaseException:
            for s in segments:
                kv.pool.release(s.new_pages or [])
                s.new_pages = None
            raise
        for s in segments:
            self._commit(s)
        return logits

    def _eager(self, segments: list[Segment], batch: DecodeBatch | None,
               writes: _WriteState) -> Callable[[], torch.Tensor]:
        """The forward as a call of the model with this step's attention callback."""
        kv, dev, p = self.kv, self.kv.device, self.page_size
        on_gpu = dev.type == "cuda"
        ids = on_device([t for s in segments for t in s.token_ids], torch.long, dev)
        pos = torch.cat([torch.arange(s.seq.num_tokens, s.seq.num_tokens + len(s.token_ids), device=dev)
                         for s in segments])
        bounds, row = [], 0
        for s in segments:
            bounds.append((row, row + len(s.token_ids)))
            row += len(s.token_ids)
        step = batch.tensors().to(dev) if batch is not None else None
        if on_gpu and step is not None:
            attn = decode_attention(kv, step)
        else:
            # (start, length) of each segment's open (bf16) region: after a decode step's append, its
            # tail page; else the old tail plus the new tokens, whose full pages this forward quantises
            opens = ([(len(x) * p, o + 1) for x, o in zip(batch.pages, batch.offsets)] if batch is not None else
                     [(len(s.seq.pages) * p, s.seq.tail_len(p) + len(s.token_ids)) for s in segments])
            masks = [None if on_gpu else self._mask(s, pos[r0:r1], *o)
                     for s, (r0, r1), o in zip(segments, bounds, opens)]

            def attn(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                if step is not None:
                    append_to_tails(kv, step, layer, k, v)
                out = torch.empty_like(q)
                for i, (s, (r0, r1), mask, (start, n)) in enumerate(zip(segments, bounds, masks, opens)):
                    if step is not None:
                        opened = (kv.read_tail(layer, 0, s.seq, n), kv.read_tail(layer, 1, s.seq, n))
                    else:
                        opened = self._store(layer, s, writes, i, k[r0:r1], v[r0:r1])
                    out[r0:r1] = self._attend_chunk(layer, writes.page_ids(i, False), start, q[r0:r1], pos[r0:r1],
                                                    opened, mask)
                return out

        indices = on_device([b[1] - 1 for b in bounds], torch.long, dev)
        return lambda: self.model(ids, pos, attn, logits_indices=indices)

    def _mask(self, s: Segment, pos: torch.Tensor, open_start: int, open_len: int) -> torch.Tensor:
        num_pages = len(s.seq.pages) + len(s.new_pages)
        return page_causal_mask(pos, num_pages * self.page_size, open_start, open_len, self.page_size)

    def _complete_tails(self, segments: list[Segment], writes: _WriteState) -> None:
        """Before a decode step: quantise the full tail page of every segment whose new token opens
        a page, into the page allocated for it; one call for K and one for V covers every layer of
        all of them.

        The page holds earlier tokens only, so it is final before the forward runs, and it is the
        page the general path would write during the forward. A failed forward returns it like any
        other new page.
        """
        done = [i for i, s in enumerate(segments) if s.new_pages]
        if not done:
            return
        kv = self.kv
        slots = on_device([segments[i].seq.tail_slot for i in done], torch.long, kv.device)
        ids = on_device([page for i in done for page in segments[i].new_pages], torch.long, kv.device)
        tails = kv.tails.data[slots]                                  # [n, layers, 2, H, P, D] bf16
        for part in (0, 1):
            kv.write_page_layers(part, ids, tails[:, :, part].transpose(2, 3), writes.nonfinite)

    def _store(self, layer: int, s: Segment, writes: _WriteState, i: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantise the pages this forward completes; keep the newest page as the bf16 tail.

        Returns the open region's K and V (old tail + new tokens, bf16 precision) for attention.
        """
        kv, p, seq = self.kv, self.page_size, s.seq
        n_full = len(s.new_pages) * p
        opened = []
        for part, new in ((0, k), (1, v)):
            x = torch.cat((kv.read_tail(layer, part, seq), new.to(torch.bfloat16)))
            if n_full:
                kv.write_pages(layer, part, writes.page_ids(i, True), x[:n_full].reshape(-1, p, *x.shape[1:]),
                               writes.nonfinite)
            kv.write_tail(layer, part, seq.tail_slot, x[n_full:])
            opened.append(x)
        return opened[0], opened[1]

    def _attend_chunk(self, layer: int, page_ids: torch.Tensor, open_start: int, q: torch.Tensor, pos: torch.Tensor,
                      opened: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of one segment's queries over its pages ``page_ids`` and its open region."""
        kv = self.kv
        if kv.device.type == "cuda":
            from kvwire.kernels.chunk_attention import paged_chunk_attention
            from kvwire.kernels.chunk_gathered import gathered_chunk_attention
            from kvwire.kernels.chunk_plan import gathered_prefix_pays
            gathered = gathered_prefix_pays(q.shape[0], q.shape[1], open_start, kv.format, kv.device)
            attend = gathered_chunk_attention if gathered else paged_chunk_attention
            return attend(q, pos, kv.pool.storage, kv.format, layer, page_ids, opened[0], opened[1], open_start,
                          kv.static_scales)
        pages = page_ids.tolist()
        k_pages = kv.read_pages(layer, 0, pages)
        v_pages = kv.read_pages(layer, 1, pages)
        return attend_paged_reference(q, pos, k_pages, v_pages, opened[0], opened[1], open_start, self.page_size, mask)

    def _commit(self, s: Segment) -> None:
        """After a successful forward: the new pages join the sequence and the prefix cache."""
        seq = s.seq
        seq.pages.extend(s.new_pages)
        seq.num_tokens += len(s.token_ids)
        if s.new_pages and s.all_token_ids is not None:
            done = len(seq.chain_hashes)
            hashes = page_chain_hashes(self.kv.format.hash, s.all_token_ids[:len(seq.pages) * self.page_size],
                                       self.page_size, seq.chain_hashes[-1] if done else None, done)
            for page, h in zip(seq.pages[done:], hashes):
                self.kv.pool.publish(page, h)
            seq.chain_hashes.extend(hashes)
        s.new_pages = None

    def release(self, seq: SequenceKV) -> None:
        """Free everything a sequence holds (finished, failed or aborted)."""
        self.kv.pool.release(seq.pages)
        seq.pages = []
        seq.chain_hashes = []
        if seq.tail_slot >= 0:
            self.page_rows.forget(seq.tail_slot)
            self.kv.tails.release(seq.tail_slot)
            seq.tail_slot = -1
        seq.num_tokens = 0
