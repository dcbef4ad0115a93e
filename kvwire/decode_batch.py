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
    pages: list[list[int]]       # each sequence's pages once the step's closed page is quantised

    @staticmethod
    def of(segments: list, page_size: int) -> "DecodeBatch | None":
        """The step of ``kvwire.runner.Segment`` s with pages allocated, or None if one has several tokens."""
        if not segments or not all(len(s.token_ids) == 1 for s in segments):
            return None
        pages = [s.seq.pages + s.new_pages for s in segments]
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
            table[i, :len(x)] = torch.tensor(x, dtype=torch.int32)

        def i64(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long)

        return DecodeTensors(i64(self.token_ids), i64(self.positions), i64(self.tail_slots), i64(self.offsets),
                             table, torch.tensor([len(x) for x in self.pages], dtype=torch.int32),
                             torch.tensor(self.tail_slots, dtype=torch.int32),
                             torch.tensor([o + 1 for o in self.offsets], dtype=torch.int32))


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
