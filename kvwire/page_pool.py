"""The page pool: fixed-size compact pages with reference counts and a prefix cache.

Storage is one byte tensor ``[num_pages, page_bytes]`` laid out by a ``PageFormat`` (every layer,
K and V, data and scales of a page contiguous), so a run of consecutive page ids is one
contiguous byte range: one registration for a transport, one descriptor per run.

Life of a page: ``allocate`` (refcount 1) -> written by prefill -> ``publish`` puts a *full* page
in the prefix cache under its chain hash -> sequences that share the prefix ``acquire_prefix`` it
(refcount +1) -> ``release`` (refcount -1). At refcount 0 a cached page becomes *evictable*: it
keeps its contents for future hits until ``allocate`` needs the room (least recently used
first); an uncached page goes straight back to the free list.

The chain hash of page i covers the format hash, the hash of page i-1 and page i's token ids, so
a hit means "same format, same tokens from position 0".
"""
from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from dataclasses import dataclass

import torch

from kvwire.formats import PageFormat

_DTYPES = {"bfloat16": torch.bfloat16, "uint8": torch.uint8, "float32": torch.float32}


class OutOfPagesError(RuntimeError):
    """Not enough free or evictable pages for an allocation."""


class NoRoomError(OutOfPagesError):
    """A worker's pages were not freed for a request within its wait (the pool is busy, not too small)."""


class CapacityError(ValueError):
    """A request needs more pages than the whole pool holds: waiting for pages to be freed cannot
    help, so it is refused at once with both numbers (a caller's error, not the worker's)."""


@dataclass(frozen=True)
class PoolCounters:
    total: int
    used: int        # referenced by at least one sequence
    cached: int      # in the prefix cache (referenced or not)
    evictable: int   # cached and unreferenced: reusable on demand
    free: int        # never written or released uncached

    @property
    def available(self) -> int:
        return self.free + self.evictable


def page_chain_hashes(format_hash: str, token_ids: list[int], page_size: int,
                      prev: bytes | None = None, first_page: int = 0) -> list[bytes]:
    """Chain hash of every *full* page of ``token_ids`` from page ``first_page`` on.

    ``prev`` is the hash of page ``first_page - 1`` (ignored for page 0), so a growing sequence
    hashes each page once.
    """
    hashes = []
    if first_page == 0:
        prev = format_hash.encode()
    elif prev is None:
        raise ValueError("continuing a hash chain needs the previous page's hash")
    for start in range(first_page * page_size, len(token_ids) - page_size + 1, page_size):
        h = hashlib.sha256(prev)
        h.update(b",".join(str(t).encode() for t in token_ids[start:start + page_size]))
        prev = h.digest()
        hashes.append(prev)
    return hashes


class PagePool:
    def __init__(self, fmt: PageFormat, num_pages: int, device: str | torch.device = "cpu") -> None:
        if num_pages < 1:
            raise ValueError("a page pool needs at least one page")
        self.format = fmt
        self.num_pages = num_pages
        self.storage = torch.empty((num_pages, fmt.page_bytes), dtype=torch.uint8, device=device)
        self._refcount = [0] * num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() yields low ids first
        self._page_of_hash: dict[bytes, int] = {}
        self._hash_of_page: dict[int, bytes] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # LRU order: oldest first

    # ---- views ----
    def section(self, layer: int, part: int, name: str) -> torch.Tensor:
        """A typed view ``[num_pages, *shape]`` of one section of every page (no copy)."""
        sec = self.format.section(layer, part, name)
        raw = self.storage[:, sec.offset:sec.offset + sec.nbytes]
        return raw.view(_DTYPES[sec.dtype]).view(self.num_pages, *sec.shape)

    # ---- allocation ----
    def counters(self) -> PoolCounters:
        used = sum(1 for r in self._refcount if r > 0)
        return PoolCounters(self.num_pages, used, len(self._hash_of_page), len(self._evictable), len(self._free))

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free) + len(self._evictable)

    def allocate(self, n: int) -> list[int]:
        """``n`` pages with refcount 1; evicts least recently used cached pages if needed."""
        if not self.can_allocate(n):
            c = self.counters()
            raise OutOfPagesError(f"need {n} pages, only {c.available} available "
                                  f"({c.free} free, {c.evictable} evictable, {c.used} in use)")
        out = []
        for _ in range(n):
            if self._free:
                page = self._free.pop()
            else:
                page, _ = self._evictable.popitem(last=False)
                del self._page_of_hash[self._hash_of_page.pop(page)]
            self._refcount[page] = 1
            out.append(page)
        return out

    def release(self, pages: list[int]) -> None:
        """Drop one reference from each page; unreferenced pages become evictable or free."""
        for page, n in Counter(pages).items():   # a page twice in one call must hold two references
            held = self._refcount[page] if 0 <= page < self.num_pages else 0
            if held <= 0:
                raise ValueError(f"page {page} is not allocated")
            if held < n:
                raise ValueError(f"page {page} is released {n} times but holds {held} reference(s)")
        for page in pages:
            self._refcount[page] -= 1
            if self._refcount[page] == 0:
                if page in self._hash_of_page:
                    self._evictable[page] = None
                else:
                    self._free.append(page)

    # ---- prefix cache ----
    def publish(self, page: int, chain_hash: bytes) -> None:
        """Make a full, written page findable by its chain hash (first writer wins)."""
        if self._refcount[page] <= 0:
            raise ValueError(f"page {page} is not allocated")
        if chain_hash in self._page_of_hash or page in self._hash_of_page:
            return
        self._page_of_hash[chain_hash] = page
        self._hash_of_page[page] = chain_hash

    def acquire_prefix(self, chain_hashes: list[bytes]) -> list[int]:
        """Pages of the longest cached prefix of ``chain_hashes``, each with a new reference."""
        pages = []
        for h in chain_hashes:
            page = self._page_of_hash.get(h)
            if page is None:
                break
            pages.append(page)
        for page in pages:
            if self._refcount[page] == 0:
                del self._evictable[page]
            self._refcount[page] += 1
        return pages

    def cached_prefix_length(self, chain_hashes: list[bytes]) -> int:
        """How many leading pages are cached, without taking references (for routing)."""
        n = 0
        for h in chain_hashes:
            if h not in self._page_of_hash:
                break
            n += 1
        return n
