"""PageRows keeps each sequence's page ids between decode steps; the rows must always equal
``seq.pages + new_pages`` however the sequence's pages changed since the last step."""
import random

import torch

from kvwire.decode_batch import DecodeBatch, PageRows
from kvwire.kv_cache import SequenceKV


class Seg:
    def __init__(self, seq: SequenceKV, new_pages: list[int]) -> None:
        self.seq, self.new_pages, self.token_ids = seq, new_pages, [7]


def test_rows_follow_pages_through_steps_failures_and_reused_slots():
    rng = random.Random(0)
    rows = PageRows()
    seqs = [SequenceKV(pages=[rng.randrange(10**6) for _ in range(n)], tail_slot=slot, num_tokens=16 * n + 1)
            for slot, n in enumerate((0, 3, 70, 200))]
    for step in range(60):
        segs = [Seg(s, [rng.randrange(10**6)] if rng.random() < 0.3 else []) for s in seqs]
        for s in segs:
            assert rows.row(s.seq, s.new_pages).tolist() == s.seq.pages + s.new_pages
        if step % 7 == 3:
            continue                                        # a failed forward: nothing committed
        for s in segs:
            s.seq.pages.extend(s.new_pages)
        if step % 11 == 5:                                  # slot 1 freed and taken by a new sequence
            seqs[1] = SequenceKV(pages=[rng.randrange(10**6) for _ in range(rng.randrange(5))], tail_slot=1)
        if step % 13 == 6:                                  # a prefix hit replaces the list
            seqs[2].pages = seqs[2].pages[:10]
        if step % 17 == 8:                                  # changed in place under the kept row
            seqs[3].pages[-1] += 1


def test_tables_equal_the_lists():
    rows = PageRows()
    seqs = [SequenceKV(pages=list(range(100 * i, 100 * i + n)), tail_slot=i, num_tokens=t)
            for i, (n, t) in enumerate(((5, 16 * 5 + 2), (0, 33), (33, 16 * 33 + 2)))]
    batch = DecodeBatch.of([Seg(s, [9, 8] if i == 1 else []) for i, s in enumerate(seqs)], 16, rows)
    t = batch.padded(4).tensors(64)
    want = torch.zeros((4, 64), dtype=torch.int32)
    for i, x in enumerate([seqs[0].pages, [9, 8], seqs[2].pages, seqs[0].pages]):
        want[i, :len(x)] = torch.tensor(x, dtype=torch.int32)
    assert torch.equal(t.table, want)
    assert t.num_pages.tolist() == [5, 2, 33, 5] and t.tail_slot.tolist() == [0, 1, 2, 0]
    assert t.offsets.tolist() == [2, 1, 2, 2] and t.tail_len.tolist() == [3, 2, 3, 3]


def test_a_new_sequence_in_a_slot_is_not_mistaken_for_the_old_one():
    """Page 30 at the same index, freed and allocated again, under different earlier pages."""
    rows = PageRows()
    old = SequenceKV(pages=[10, 20, 30], tail_slot=4)
    assert rows.row(old, []).tolist() == [10, 20, 30]
    new = SequenceKV(pages=[11, 21, 30, 40], tail_slot=4)
    assert rows.row(new, [50]).tolist() == [11, 21, 30, 40, 50]
