"""Page runs and descriptor splitting: one descriptor per stretch consecutive on both sides."""
from __future__ import annotations

import numpy as np
import pytest

from transfer import PageIdError, Run, check_page_ids, page_runs, paired_runs


def test_page_runs() -> None:
    assert page_runs([]) == []
    assert page_runs([7]) == [(7, 1)]
    assert page_runs([3, 4, 5, 9, 10, 2]) == [(3, 3), (9, 2), (2, 1)]
    assert page_runs([5, 4, 3]) == [(5, 1), (4, 1), (3, 1)]  # descending is not contiguous in order


def test_paired_runs_split_where_either_side_breaks() -> None:
    assert paired_runs([3, 4, 5, 9], [10, 11, 20, 21]) == [Run(3, 10, 2), Run(5, 20, 1), Run(9, 21, 1)]
    assert paired_runs([0, 1, 2, 3], [8, 9, 10, 11]) == [Run(0, 8, 4)]
    assert paired_runs([0, 1, 5, 6], [8, 9, 10, 11]) == [Run(0, 8, 2), Run(5, 10, 2)]
    assert paired_runs([], []) == []


def test_paired_runs_need_equal_lengths() -> None:
    with pytest.raises(PageIdError, match="3 local pages cannot pair with 2 remote pages"):
        paired_runs([1, 2, 3], [1, 2])


def test_check_page_ids() -> None:
    assert check_page_ids([np.int64(3), 0], 4, "x") == [3, 0]
    assert check_page_ids((np.int64(i) for i in (2, 1)), 4, "x") == [2, 1]   # one pass: it was [] for an iterator
    with pytest.raises(PageIdError, match=r"remote: page id 4 is outside \[0, 4\)"):
        check_page_ids([1, 4], 4, "remote")
    with pytest.raises(PageIdError, match="page id 1 appears more than once"):
        check_page_ids([1, 2, 1], 4, "local")
    with pytest.raises(PageIdError, match="is a bool"):
        check_page_ids([True], 4, "local")
    with pytest.raises(PageIdError, match="is not an integer"):
        check_page_ids([1.0], 4, "local")


def test_paired_runs_match_the_per_page_rule_on_long_lists() -> None:
    """The vectorised split (a 64k-token request is ~4k pages) against the rule, page by page."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        local = sorted(rng.permutation(230)[:200].tolist())  # long runs, broken at random places
        remote = sorted(rng.permutation(220)[:200].tolist())
        want: list[Run] = []
        for a, b in zip(local, remote):
            last = want[-1] if want else None
            if last and a == last.local_first + last.count and b == last.remote_first + last.count:
                want[-1] = Run(last.local_first, last.remote_first, last.count + 1)
            else:
                want.append(Run(a, b, 1))
        got = paired_runs(local, remote)
        assert got == want and all(type(x) is int for r in got for x in (r.local_first, r.remote_first, r.count))
    assert paired_runs(list(range(4095)), list(range(1, 4096))) == [Run(0, 1, 4095)]
    assert check_page_ids(range(3), 4, "x") == [0, 1, 2]
