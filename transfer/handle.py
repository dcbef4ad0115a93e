"""A transfer in flight: its states, deadline, abort and stats, independent of the backend.

Backends subclass TransferHandle with two hooks (advance, cancel); this module owns the state
machine so every transport has the same semantics for deadlines, aborts and notifications.
"""
from __future__ import annotations

import enum
import math
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from kvwire.formats import PageFormat
from transfer.runs import Run

# wait(): poll without sleeping for the first _SPIN_S (a VRAM transfer of a 64k-token request takes
# a few ms, and a sleep quantum there was most of its measured time), then sleep between polls,
# doubling from _FIRST_BACKOFF_S up to _MAX_BACKOFF_S (an overshoot of at most ~10% of anything
# that outlives the spin).
_SPIN_S = 10e-3
_FIRST_BACKOFF_S = 50e-6
_MAX_BACKOFF_S = 1e-3


class TransferState(enum.Enum):
    """PENDING: issued, the backend has not started it. IN_PROGRESS: posted to the backend.
    DONE: every byte is in the destination (and the notification, if any, was sent). FAILED: the
    backend reported an error (``handle.error`` says which). ABORTED / TIMED_OUT: stopped by
    ``abort`` / by the deadline, with the guarantees ``TransferHandle.abort`` lists."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    FAILED = "failed"
    ABORTED = "aborted"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        return self not in (TransferState.PENDING, TransferState.IN_PROGRESS)


class Op(enum.Enum):
    WRITE = "WRITE"   # push: local pages -> peer pages
    READ = "READ"     # pull: peer pages -> local pages


@dataclass(frozen=True)
class TransferStats:
    """What one transfer moved. ``compact_bytes`` counts the descriptors actually issued."""

    compact_bytes: int
    bf16_bytes: int          # what the same tokens would have cost as bf16 K/V
    num_pages: int
    num_descriptors: int
    seconds: float           # issue to terminal state (so far, while in flight)

    @property
    def ratio_to_bf16(self) -> float:
        return self.compact_bytes / self.bf16_bytes if self.bf16_bytes else 0.0

    @property
    def gbytes_per_s(self) -> float:
        return self.compact_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class TransferHandle(ABC):
    """One issued transfer. Thread-safe; ``abort`` may be called from any thread at any time.

    Subclasses implement ``_progress`` (advance the backend; on completion release it and send
    the notification) and ``_cancel`` (stop it and release it); this class owns states, the
    deadline, idempotence and stats.
    """

    def __init__(self, op: Op, peer: str, runs: Sequence[Run], page_format: PageFormat, deadline_s: float,
                 started: float, state: TransferState = TransferState.PENDING) -> None:
        self.op = op
        self.peer = peer
        self.runs = tuple(runs)
        self.error: str | None = None          # why, when FAILED
        self._format = page_format
        self._state = state
        self._quiesced = True
        self._lock = threading.Lock()
        self._started = started              # time.monotonic() when issuing began: backends may
        self._deadline = started + deadline_s  # move data before the handle exists
        self._ended: float | None = None

    @property
    def state(self) -> TransferState:
        return self._state

    @property
    def quiesced(self) -> bool:
        """False only if an abort gave up waiting for the backend: see ``abort``."""
        return self._quiesced

    @property
    def stats(self) -> TransferStats:
        pages = sum(r.count for r in self.runs)
        end = self._ended if self._ended is not None else time.monotonic()
        return TransferStats(pages * self._format.page_bytes,
                             pages * self._format.page_size * self._format.bf16_bytes_per_token,
                             pages, len(self.runs), end - self._started)

    def poll(self) -> TransferState:
        """Advance without blocking. Past the deadline a transfer not yet seen DONE is aborted
        (drained, no notification) and TIMED_OUT, even if its bytes landed meanwhile: only a
        DONE seen in time counts as delivered."""
        with self._lock:
            if self._state.terminal:
                return self._state
            if time.monotonic() >= self._deadline:
                self._stop(TransferState.TIMED_OUT)
                return self._state
            try:
                state = self._progress()
            except Exception as exc:  # a backend error must end in FAILED, not escape as a crash
                self.error = f"{type(exc).__name__}: {exc}"
                self._quiesced = self._cancel()
                state = TransferState.FAILED
            if state.terminal:
                self._ended = time.monotonic()
            self._state = state
            return state

    def wait(self, timeout: float | None = None, spin_s: float = _SPIN_S) -> TransferState:
        """Poll until terminal, the deadline, or ``timeout`` s: back to back (yielding the GIL,
        not the CPU) for the first ``spin_s``, then with exponential backoff sleeps.

        Returns the state: non-terminal only when ``timeout`` ran out first (the transfer goes on).
        """
        start = time.monotonic()
        end = math.inf if timeout is None else start + timeout
        spin_end = start + spin_s
        delay = _FIRST_BACKOFF_S
        while True:
            state = self.poll()
            now = time.monotonic()
            if state.terminal or now >= end:
                return state
            if now < spin_end:
                time.sleep(0)  # lets other Python threads run; no sleep quantum
                continue
            time.sleep(max(0.0, min(delay, end - now, self._deadline - now)))
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def abort(self) -> TransferState:
        """Stop the transfer; a no-op on a finished one. Returns the final state.

        When abort returns ABORTED, the caller may assume: no notification was or will be sent for
        this transfer; the destination pages hold undefined bytes (anything from untouched to fully
        written); and the transport has released the request and will not start any further data
        movement for it. Backends that cannot cancel in-flight operations (UCX RMA) are first
        drained -- abort blocks until the backend reports the request finished -- so both pools'
        pages may be reused. Only if that drain times out is ``quiesced`` False: then the pages may
        still be touched for a while and must be quarantined rather than reused.
        """
        with self._lock:
            if not self._state.terminal:
                self._stop(TransferState.ABORTED)
            return self._state

    def _stop(self, state: TransferState) -> None:
        self._quiesced = self._cancel()
        self._state = state
        self._ended = time.monotonic()

    @abstractmethod
    def _progress(self) -> TransferState:
        """IN_PROGRESS, or DONE/FAILED after releasing the request (and, on DONE, notifying)."""

    @abstractmethod
    def _cancel(self) -> bool:
        """Stop and release the request without notifying; True if the backend is quiet."""

    def __repr__(self) -> str:
        s = self.stats
        return (f"{type(self).__name__}({self.op.value} peer={self.peer!r} pages={s.num_pages} "
                f"descriptors={s.num_descriptors} state={self._state.value})")


