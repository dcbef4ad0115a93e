"""Test helpers: a small mixed page format, random pools, unique agent names, and waiting for a
transport's notifications."""
from __future__ import annotations

import time
import uuid

import torch

from kvwire.formats import KVFormat, PageFormat


def small_format(kind: str = "fp8-token/nvfp4") -> PageFormat:
    """A few KB per page: fast to fill and compare, still every section of a real page."""
    return PageFormat(KVFormat.parse(kind), page_size=16, num_layers=2, num_kv_heads=2, head_dim=64)


def big_format() -> PageFormat:
    """256 KiB bf16 pages: enough bytes per transfer to still be in flight when polled."""
    return PageFormat(KVFormat.parse("bf16"), page_size=16, num_layers=4, num_kv_heads=8, head_dim=128)


def random_pool(fmt: PageFormat, num_pages: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_pages, fmt.page_bytes), dtype=torch.uint8, generator=gen)


def unique(prefix: str) -> str:
    """Agent names are process-wide keys: never reuse one across tests."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def notifications(t, want: int = 1, timeout: float = 2.0) -> list[tuple[str, bytes]]:
    """Collect transport ``t``'s notifications until ``want`` arrived or ``timeout``; sleeps with
    backoff between polls."""
    got: list[tuple[str, bytes]] = []
    end, delay = time.monotonic() + timeout, 1e-3
    while len(got) < want and time.monotonic() < end:
        got += t.poll_notifications()
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return got + t.poll_notifications()
