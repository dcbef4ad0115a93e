"""A decode step's inputs: one new token per sequence, each an append to a tail page with room.

A decode step is the serving loop's inner step, so it gets its own uniform shape. The model
runner quantises a full tail page before the step (``ModelRunner._complete_tails``), so every
token of the step lands in a tail page with room, and the whole step is, per layer, one indexed
write of the new K/V into the tail pool and one paged-decode call. ``DecodeBatch`` holds that on
the host; ``DecodeTensors`` on a device, in the dtypes the kernels take; ``decode_attention`` is
the step's attention callback. Nothing in it depends on the values of the batch but its size and
the page-table width, which is what lets ``kvwire.decode_graphs`` capture it once per shape.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import torch

from kvwire.kv_cache import KVCache

AttnFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DecodeBatch:
    """One decode step on the host, a row per sequence."""

    token_ids: list[int]
    positions: list[int]         # of the new tokens
    tail_slots: list[int]
    offsets: list[int]           # where each new token goes in its tail page (0 after a page closed)
    pages: list[torch.Tensor]    # int32 page ids of each sequence once the step's closed page is quantised

    @staticmethod
    def of(segments: list, page_size: int, rows: "PageRows | None" = None) -> "DecodeBatch | None":
        """The step of ``kvwire.runner.Segment`` s with pages allocated, or None if one has several
        tokens. ``rows`` keeps the page rows between steps (``PageRows``)."""
        if not segments or not all(len(s.token_ids) == 1 for s in segments):
            return None
        rows = PageRows() if rows is None else rows
        pages = [rows.row(s.seq, s.new_pages) for s in segments]
        return DecodeBatch([s.token_ids[0] for s in segments], [s.seq.num_tokens for s in segments],
                           [s.seq.tail_slot for s in segments],
                           [s.seq.num_tokens - len(x) * page_size for s, x in zip(segments, pages)], pages)

    def __len__(self) -> int:
        return len(self.token_ids)

    def padded(self, rows: int) -> "DecodeBatch":
        """``rows`` rows; those past ``len(self)`` repeat row 0 exactly. A repeated row computes row
        0's K/V again and writes the same bytes to the same tail position, so padding touches
        nothing that row 0 does not."""
        if rows < len(self):
            raise ValueError(f"cannot pad {len(self)} rows to {rows}")
        extra = rows - len(self)
        return DecodeBatch(*(getattr(self, f.name) + [getattr(self, f.name)[0]] * extra for f in fields(self)))

    def tensors(self, width: int | None = None) -> "DecodeTensors":
        """On the host; ``width``: page-table columns (default: the longest row's page count)."""
        width = max(1, max(len(x) for x in self.pages)) if width is None else width
        if any(len(x) > width for x in self.pages):
            raise ValueError(f"a sequence has more than {width} pages")
        table = torch.zeros((len(self), width), dtype=torch.int32)
        for i, x in enumerate(self.pages):
            table[i, :len(x)] = x

        def i64(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long)

        return DecodeTensors(i64(self.token_ids), i64(self.positions), i64(self.tail_slots), i64(self.offsets),
                             table, torch.tensor([len(x) for x in self.pages], dtype=torch.int32),
                             torch.tensor(self.tail_slots, dtype=torch.int32),
                             torch.tensor([o + 1 for o in self.offsets], dtype=torch.int32))


class PageRows:
    """Each in-flight sequence's page ids as an int32 row, kept between decode steps and extended
    by the pages a step adds. Converting the Python lists afresh every step costs O(batch x pages):
    6.6 ms per step for 64 sequences of 2,048 pages on this project's CPU machine, more than a
    whole graphed decode step. A row mirrors one ``SequenceKV.pages`` list (the same object,
    which the runner only ever extends); a new list (a new sequence in the slot, a prefix hit, an
    admitted manifest) or one that changed under it is converted again."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[list[int], int, torch.Tensor]] = {}   # slot -> (list, length mirrored, buffer)

    def row(self, seq, new_pages: list[int]) -> torch.Tensor:
        """``seq.pages + new_pages`` as int32 (a view of the kept buffer: read it before the next call)."""
        pages, n, k = seq.pages, len(seq.pages), len(new_pages)
        kept = self._rows.get(seq.tail_slot)
        done, buf = 0, torch.empty(0, dtype=torch.int32)
        if kept is not None and kept[0] is pages and 0 < kept[1] <= n:
            if int(kept[2][kept[1] - 1]) == pages[kept[1] - 1]:        # not changed under the row
                _, done, buf = kept
        if buf.numel() < n + k:
            grown = torch.empty(max(2 * buf.numel(), n + k, 64), dtype=torch.int32)
            grown[:done] = buf[:done]
            buf = grown
        if n > done:
            buf[done:n] = torch.tensor(pages[done:n], dtype=torch.int32)
        if k:
            buf[n:n + k] = torch.tensor(new_pages, dtype=torch.int32)
        self._rows[seq.tail_slot] = (pages, n, buf)
        return buf[:n + k]

    def forget(self, slot: int) -> None:
        self._rows.pop(slot, None)


@dataclass(frozen=True)
class DecodeTensors:
    """A decode step's inputs as tensors: int64 for the model and the tail writes, int32 for the
    paged-decode kernels (``kvwire.kernels.paged_decode.paged_decode_attention``)."""

    ids: torch.Tensor
    pos: torch.Tensor
    slots: torch.Tensor
    offsets: torch.Tensor
    table: torch.Tensor          # [rows, width] page ids
    num_pages: torch.Tensor
    tail_slot: torch.Tensor
    tail_len: torch.Tensor       # tokens in the tail page after the append: offsets + 1

    def to(self, device: torch.device) -> "DecodeTensors":
        """A copy on ``device``; non-blocking from the host (pageable memory is staged by the driver
        before the copy returns, so the stream is not drained)."""
        return DecodeTensors(*(getattr(self, f.name).to(device, non_blocking=device.type == "cuda")
                               for f in fields(self)))

    def copy_into(self, dst: "DecodeTensors") -> None:
        """Fill ``dst``'s tensors (same shapes) with these values."""
        for f in fields(self):
            getattr(dst, f.name).copy_(getattr(self, f.name), non_blocking=True)


def append_to_tails(kv: KVCache, t: DecodeTensors, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """The step's new K and V [rows, H, D] of ``layer`` into their tail pages: one indexed write each."""
    for part, x in ((0, k), (1, v)):
        kv.tails.data[t.slots, layer, part, :, t.offsets] = x.to(torch.bfloat16)


def decode_attention(kv: KVCache, t: DecodeTensors) -> AttnFn:
    """The step's attention callback: the new K/V into the tail pages, then paged decode over pages + tail."""
    def attn(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from kvwire.kernels.paged_decode import paged_decode_attention
        append_to_tails(kv, t, layer, k, v)
        return paged_decode_attention(q, kv.pool.storage, kv.format, layer, t.table, t.num_pages, kv.tails.data,
                                      t.tail_slot, t.tail_len, kv.static_scales)
    return attn
