import pytest
import torch

from kvwire.formats import KVFormat, PageFormat
from kvwire.page_pool import OutOfPagesError, PagePool, page_chain_hashes

FMT = PageFormat(KVFormat.parse("fp8-token/nvfp4"), 4, 2, 2, 32)


def test_allocate_release_counters():
    pool = PagePool(FMT, 6)
    a = pool.allocate(4)
    assert sorted(a) == [0, 1, 2, 3]
    c = pool.counters()
    assert (c.used, c.free, c.cached) == (4, 2, 0)
    with pytest.raises(OutOfPagesError, match="need 3 pages, only 2"):
        pool.allocate(3)
    pool.release(a)
    assert pool.counters().free == 6
    with pytest.raises(ValueError, match="not allocated"):
        pool.release([a[0]])
    for bad in (-1, 6):
        with pytest.raises(ValueError, match="not allocated"):
            pool.release([bad])


def test_a_page_twice_in_one_release_needs_two_references():
    """release([p, p]) of a page holding one reference took its count to -1: a page two sequences share
    could then be evicted and handed out while still in use."""
    pool = PagePool(FMT, 4)
    (page,) = pool.allocate(1)
    with pytest.raises(ValueError, match="released 2 times but holds 1"):
        pool.release([page, page])
    assert pool.counters().used == 1                     # refused whole: nothing was dropped
    pool.release([page])
    assert pool.counters().free == 4


def test_a_tail_slot_out_of_range_is_refused():
    from kvwire.kv_cache import TailPool

    tails = TailPool(FMT, 3)
    slot = tails.allocate()
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="does not exist"):
            tails.release(bad)
    tails.release(slot)
    assert tails.free_slots == 3


def test_prefix_cache_hit_refcount_and_lru_eviction():
    pool = PagePool(FMT, 3)
    toks = list(range(12))
    hashes = page_chain_hashes(FMT.hash, toks, 4)
    assert len(hashes) == 3
    pages = pool.allocate(3)
    for p, h in zip(pages, hashes):
        pool.publish(p, h)
    # A second sequence shares the first two pages.
    shared = pool.acquire_prefix(hashes[:2])
    assert shared == pages[:2]
    pool.release(pages)
    c = pool.counters()
    assert (c.used, c.cached, c.evictable) == (2, 3, 1)
    pool.release(shared)
    assert pool.counters().evictable == 3
    # Allocating evicts the least recently released first (page 2), cached content of others stays.
    new = pool.allocate(1)
    assert new == [pages[2]]
    assert pool.cached_prefix_length(hashes) == 2
    assert pool.acquire_prefix(hashes) == pages[:2]


def test_chain_hash_depends_on_format_prefix_and_continues():
    toks = list(range(40))
    h = page_chain_hashes(FMT.hash, toks, 4)
    other = PageFormat(KVFormat.parse("bf16"), 4, 2, 2, 32)
    assert page_chain_hashes(other.hash, toks, 4)[0] != h[0]
    changed = [99] + toks[1:]
    assert all(a != b for a, b in zip(page_chain_hashes(FMT.hash, changed, 4), h))
    assert page_chain_hashes(FMT.hash, toks, 4, h[3], 4) == h[4:]


def test_pages_are_contiguous_byte_ranges():
    pool = PagePool(FMT, 4)
    view = pool.section(1, 1, "global_scale")
    view[2] = torch.tensor([1.5, 2.5])
    sec = FMT.section(1, 1, "global_scale")
    raw = pool.storage[2, sec.offset:sec.offset + 8].view(torch.float32)
    assert raw.tolist() == [1.5, 2.5]
    assert pool.storage.stride() == (FMT.page_bytes, 1)
