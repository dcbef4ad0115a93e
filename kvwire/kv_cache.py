"""Per-worker KV storage: the compact page pool, the bf16 tail pages and the static scales.

A sequence's K/V lives in its full pages (compact, in the pool, possibly shared through the
prefix cache) plus one open *tail* page kept in bf16 in a tail slot: the page of the newest
token, holding 1..page_size tokens. When a token arrives beyond a full tail, the tail is
quantised in one shot into a fresh pool page, so page-resident scales never need rewriting and
the most recent tokens keep full precision.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvwire.formats import PageFormat
from kvwire.kernels.device_support import check_device
from kvwire.page_pool import PagePool
from kvwire.quant import NonFiniteCount, dequantize_pages, quantize_pages

@dataclass
class SequenceKV:
    """Where one sequence's K/V is: full pages in order, plus a tail slot."""

    pages: list[int] = field(default_factory=list)
    tail_slot: int = -1
    num_tokens: int = 0           # tokens whose K/V is stored (pages + tail)
    chain_hashes: list[bytes] = field(default_factory=list)  # of the full pages
    prefix_pages_reused: int = 0

    def tail_len(self, page_size: int) -> int:
        return self.num_tokens - len(self.pages) * page_size


class TailPool:
    """bf16 open pages: ``[slots, layers, 2, kv_heads, page_size, head_dim]``."""

    def __init__(self, fmt: PageFormat, num_slots: int, device: str | torch.device = "cpu") -> None:
        self.data = torch.empty((num_slots, fmt.num_layers, 2, fmt.num_kv_heads, fmt.page_size, fmt.head_dim),
                                dtype=torch.bfloat16, device=device)
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free tail slot: too many sequences in flight")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.data.shape[0]:
            raise ValueError(f"tail slot {slot} does not exist (0..{self.data.shape[0] - 1})")
        if slot in self._free:
            raise ValueError(f"tail slot {slot} is already free")
        self._free.append(slot)


class KVCache:
    def __init__(self, fmt: PageFormat, num_pages: int, max_sequences: int,
                 device: str | torch.device = "cpu", static_scales: torch.Tensor | None = None) -> None:
        check_device(fmt, torch.device(device))            # before any allocation: a too-old GPU fails here
        self.format = fmt
        self.pool = PagePool(fmt, num_pages, device)
        self.tails = TailPool(fmt, max_sequences, device)
        self.device = torch.device(device)
        # [layers, 2 (K/V), kv_heads] fp32; only read by tensor/head granularities.
        self.static_scales: torch.Tensor | None = None
        if static_scales is not None:
            self.set_static_scales(static_scales)

    def needs_static_scales(self) -> bool:
        return self.format.kv.key.has_static_scales or self.format.kv.value.has_static_scales

    def set_static_scales(self, scales: torch.Tensor) -> None:
        f = self.format
        if scales.shape != (f.num_layers, 2, f.num_kv_heads):
            raise ValueError(f"static scales must be [{f.num_layers}, 2, {f.num_kv_heads}], got {tuple(scales.shape)}")
        if not bool(torch.isfinite(scales).all() and (scales > 0).all()):
            raise ValueError("static scales must be finite and > 0 (a zero scale stores NaN codes)")
        self.static_scales = scales.to(device=self.device, dtype=torch.float32)

    def _static(self, layer: int, part: int) -> torch.Tensor | None:
        if not self.format.part_format(part).has_static_scales:
            return None
        if self.static_scales is None:
            raise RuntimeError(f"format {self.format.name} needs static scales: calibrate or give them first")
        return self.static_scales[layer, part]

    # ---- pages ----
    def write_pages(self, layer: int, part: int, page_ids: list[int] | torch.Tensor, x: torch.Tensor,
                    nonfinite: NonFiniteCount | None = None) -> None:
        """Quantise full pages ``x`` [n, P, H, D] of one layer's K (part 0) or V (part 1) into the pool.

        Non-finite input raises ``NonFiniteInputError``; on CUDA, with ``nonfinite`` given, the
        count goes there instead and the caller raises later (no host sync here). ``page_ids`` as a
        device tensor avoids the synchronising copy of a host list.
        """
        idx = torch.as_tensor(page_ids, dtype=torch.long, device=self.device)
        if self.device.type == "cuda":
            from kvwire.kernels.quantize import write_pages
            write_pages(self.pool.storage, self.format, layer, part, idx, x, self._static(layer, part),
                        nonfinite=nonfinite)
            return
        sections = quantize_pages(x, self.format.part_format(part), self._static(layer, part))
        for name, t in sections.items():
            self.pool.section(layer, part, name)[idx] = t

    def write_page_layers(self, part: int, page_ids: torch.Tensor, x: torch.Tensor,
                          nonfinite: NonFiniteCount | None = None) -> None:
        """Quantise every layer of full pages ``x`` [n, layers, P, H, D] (K: part 0, V: 1) at once."""
        if self.device.type == "cuda":
            from kvwire.kernels.quantize import write_page_layers
            write_page_layers(self.pool.storage, self.format, part, page_ids, x, self.static_scales,
                              nonfinite=nonfinite)
            return
        for layer in range(self.format.num_layers):
            self.write_pages(layer, part, page_ids, x[:, layer])

    def read_pages(self, layer: int, part: int, page_ids: list[int]) -> torch.Tensor:
        """Pages as stored, decoded to float32 ``[n * P, H, D]``."""
        fmt = self.format.part_format(part)
        f = self.format
        if not page_ids:
            return torch.empty((0, f.num_kv_heads, f.head_dim), dtype=torch.float32, device=self.device)
        idx = torch.tensor(page_ids, dtype=torch.long, device=self.device)
        sections = {name: self.pool.section(layer, part, name)[idx]
                    for name, _, _ in fmt.sections(f.page_size, f.num_kv_heads, f.head_dim)}
        x = dequantize_pages(sections, fmt, self._static(layer, part))
        return x.reshape(-1, f.num_kv_heads, f.head_dim)

    def read_tail(self, layer: int, part: int, seq: SequenceKV, n: int | None = None) -> torch.Tensor:
        """The tail's first ``n`` tokens (default: those stored), ``[n, H, D]`` bf16."""
        n = seq.tail_len(self.format.page_size) if n is None else n
        return self.tails.data[seq.tail_slot, layer, part, :, :n].transpose(0, 1)

    def write_tail(self, layer: int, part: int, seq_slot: int, x: torch.Tensor) -> None:
        """Set the first ``len(x)`` tail tokens of a slot from ``x`` [n, H, D]."""
        self.tails.data[seq_slot, layer, part, :, :x.shape[0]] = x.transpose(0, 1).to(torch.bfloat16)

    def pages_bytes(self, num_pages: int) -> int:
        return num_pages * self.format.page_bytes
