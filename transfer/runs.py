"""Page-id checks and runs: how a list of pages becomes as few transfer descriptors as possible.

A page pool is one ``[num_pages, page_bytes]`` byte tensor, so consecutive page ids are one
contiguous byte range and one descriptor. A transfer pairs local with remote pages, so a
descriptor ends wherever *either* side's ids stop being consecutive.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence

import numpy as np


class PageIdError(ValueError):
    """Page ids that must not be used for a transfer (out of range, duplicated, mismatched)."""


@dataclass(frozen=True)
class Run:
    """``count`` pages from ``local_first`` on, paired with ``count`` pages from ``remote_first`` on."""

    local_first: int
    remote_first: int
    count: int


def check_page_ids(page_ids: Sequence[int], num_pages: int, what: str) -> list[int]:
    """``page_ids`` as plain ints, each in ``[0, num_pages)`` and none twice, or PageIdError.

    Duplicates are refused on both sides: two writes to one destination page race, and a repeated
    source page is almost always a bookkeeping bug upstream.
    """
    ids = list(page_ids)
    # Fast path for plain ints (what workers pass): C-speed checks, ~20x cheaper per page than
    # the loop below, which stays for everything else and for naming the offending id.
    if all(type(p) is int for p in ids) and (not ids or (min(ids) >= 0 and max(ids) < num_pages)) \
            and len(set(ids)) == len(ids):
        return ids
    out: list[int] = []
    seen: set[int] = set()
    for raw in ids:
        if isinstance(raw, bool):
            raise PageIdError(f"{what}: page id {raw!r} is a bool, not an integer")
        try:
            page = operator.index(raw)
        except TypeError:
            raise PageIdError(f"{what}: page id {raw!r} is not an integer") from None
        if not 0 <= page < num_pages:
            raise PageIdError(f"{what}: page id {page} is outside [0, {num_pages})")
        if page in seen:
            raise PageIdError(f"{what}: page id {page} appears more than once")
        seen.add(page)
        out.append(page)
    return out


def page_runs(page_ids: Sequence[int]) -> list[tuple[int, int]]:
    """``(first_page, count)`` for each run of consecutive ids, in the given order."""
    runs: list[tuple[int, int]] = []
    for page in page_ids:
        if runs and page == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((page, 1))
    return runs


def paired_runs(local_pages: Sequence[int], remote_pages: Sequence[int]) -> list[Run]:
    """One Run per stretch where both local and remote ids are consecutive, in order.

    Runs on the issuing path of every transfer (a 64k-token request is ~4k pages): vectorised,
    a Run built once per stretch (per page in Python it cost milliseconds, the size of the transfer).
    """
    if len(local_pages) != len(remote_pages):
        raise PageIdError(f"{len(local_pages)} local pages cannot pair with {len(remote_pages)} remote pages")
    n = len(local_pages)
    if n == 0:
        return []
    local = np.fromiter(local_pages, np.int64, n)
    remote = np.fromiter(remote_pages, np.int64, n)
    breaks = (np.flatnonzero((np.diff(local) != 1) | (np.diff(remote) != 1)) + 1).tolist()
    return [Run(int(local[a]), int(remote[a]), b - a) for a, b in zip([0, *breaks], [*breaks, n])]
