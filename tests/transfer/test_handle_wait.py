"""TransferHandle.wait: no sleep quantum while a transfer is young, backoff sleeps after that.

A VRAM push of a 64k-token request takes a few ms on an H200; the sleeps of the old backoff (up to
2 ms) were most of its measured time (docs/benchmarks.md). A fake backend that finishes at a
given time, and a recording clock, show how wait sleeps.
"""
from __future__ import annotations

import time

import pytest

import transfer.handle as handle_module
from tests.transfer.pools import small_format
from transfer.handle import Op, TransferHandle, TransferState
from transfer.runs import Run


class _Timed(TransferHandle):
    """DONE from ``done_at`` (time.monotonic()) on; counts polls."""

    def __init__(self, done_at: float) -> None:
        super().__init__(Op.WRITE, "peer", [Run(0, 0, 1)], small_format(), 30.0, time.monotonic(),
                         TransferState.IN_PROGRESS)
        self.done_at = done_at
        self.polls = 0

    def _progress(self) -> TransferState:
        self.polls += 1
        return TransferState.DONE if time.monotonic() >= self.done_at else TransferState.IN_PROGRESS

    def _cancel(self) -> bool:
        return True


class _Clock:
    """Stands in for the ``time`` module inside transfer.handle: real clock, recorded sleeps."""

    def __init__(self) -> None:
        self.sleeps: list[tuple[float, float]] = []   # (when, seconds asked)

    monotonic = staticmethod(time.monotonic)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append((time.monotonic(), seconds))
        time.sleep(seconds)


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(handle_module, "time", c)
    return c


def test_wait_sees_a_short_transfer_without_a_sleep_quantum(clock) -> None:
    h = _Timed(time.monotonic() + 3e-3)
    assert h.wait(5) is TransferState.DONE
    assert clock.sleeps and all(s == 0 for _, s in clock.sleeps)  # only GIL yields while young


def test_wait_backs_off_after_the_spin_and_honours_timeout(clock) -> None:
    h = _Timed(time.monotonic() + 60)
    start = time.monotonic()
    assert h.wait(0.1, spin_s=0.02) is TransferState.IN_PROGRESS
    assert 0.1 <= time.monotonic() - start < 2.0
    naps = [(when, s) for when, s in clock.sleeps if s > 0]
    assert naps and naps[0][0] >= start + 0.02       # no sleep quantum during the spin
    assert naps[0][1] == pytest.approx(50e-6)        # then backoff from 50 us ...
    assert max(s for _, s in naps) <= 1e-3           # ... capped at 1 ms
