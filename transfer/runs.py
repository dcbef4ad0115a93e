"""Page-id checks and runs: how a list of pages becomes as few transfer descriptors as possible.

A page pool is one ``[num_pages, page_bytes]`` byte tensor, so consecutive page ids are one
contiguous byte range and one descriptor. A transfer pairs local with remote pages, so a
descriptor ends wherever *either* side's ids stop being consecutive.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence


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
    out: list[int] = []
    seen: set[int] = set()
    for raw in page_ids:
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
    """One Run per stretch where both local and remote ids are consecutive, in order."""
    if len(local_pages) != len(remote_pages):
        raise PageIdError(f"{len(local_pages)} local pages cannot pair with {len(remote_pages)} remote pages")
    runs: list[Run] = []
    for local, remote in zip(local_pages, remote_pages):
        last = runs[-1] if runs else None
        if last and local == last.local_first + last.count and remote == last.remote_first + last.count:
            runs[-1] = Run(last.local_first, last.remote_first, last.count + 1)
        else:
            runs.append(Run(local, remote, 1))
    return runs
