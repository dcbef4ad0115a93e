"""Token streams from one decode worker, fetched for all of its requests in one call per round.

A long poll per request would pin one actor thread per stream (64 streams, 64 threads, and
admissions starved behind them); instead one pump per decode worker asks
``poll_streams(rids)`` and hands each request's tokens to its asyncio queue. When the worker
dies (whoever notices first), every stream on it ends with an error at once.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

import ray

from router.workers import Worker

POLL_S = 0.5
log = logging.getLogger("kvwire.router")


async def awaited(ref):
    """A Ray ObjectRef as a coroutine, for ``asyncio.wait_for`` (which needs an awaitable it can wrap)."""
    return await ref


@dataclass(frozen=True)
class StreamLost:
    """Put in a stream's queue when the router loses it (worker died, poll failed, router stopping).
    Not a finish reason of the worker's, which may still be running the request: the reader aborts it."""

    reason: str


class StreamPump:
    def __init__(self, worker: Worker, on_death: Callable[[Worker], None], hung_s: float = 60.0) -> None:
        """``hung_s``: a poll (which itself returns within POLL_S) unanswered this long means the worker is
        stuck (stopped, a hung GPU): it is treated as dead, so its streams end and a replacement starts."""
        self.worker = worker
        self._on_death = on_death
        self._hung_s = hung_s
        self._queues: dict[str, asyncio.Queue] = {}
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"pump-{worker.name}")

    def open(self, rid: str) -> asyncio.Queue:
        """The queue of ``rid``'s output: lists of token ids, then a finish-reason string or StreamLost."""
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        self._wake.set()
        return q

    def close(self, rid: str) -> None:
        self._queues.pop(rid, None)

    def stop(self, reason: str) -> None:
        """Stop polling; every open stream ends now with ``reason`` (none is left waiting for output)."""
        self._task.cancel()
        self._fail_all(reason)

    async def _run(self) -> None:
        while True:
            if not self._queues:
                self._wake.clear()
                await self._wake.wait()
                continue
            rids = list(self._queues)
            try:
                batches = await asyncio.wait_for(awaited(self.worker.actor.poll_streams.remote(rids, POLL_S)),
                                                 POLL_S + self._hung_s)
            except ray.exceptions.RayActorError as exc:
                self._fail_all(f"decode worker {self.worker.name} died: {exc.__class__.__name__}")
                self._on_death(self.worker)
                return
            except asyncio.TimeoutError:
                log.error("decode worker %s answered no stream poll in %.0f s: taken as hung and replaced",
                          self.worker.name, POLL_S + self._hung_s)
                self._fail_all(f"decode worker {self.worker.name} hung (no answer in {self._hung_s:.0f} s)")
                self._on_death(self.worker)
                return
            except Exception as exc:  # a failed poll fails its streams, never the pump silently
                self._fail_all(f"polling {self.worker.name} failed: {exc}")
                await asyncio.sleep(POLL_S)
                continue
            for rid, batch in batches.items():
                q = self._queues.get(rid)
                if q is None:
                    continue
                if batch.tokens:
                    q.put_nowait(list(batch.tokens))
                if batch.finished:
                    q.put_nowait(batch.finished)
                    self._queues.pop(rid, None)

    def _fail_all(self, reason: str) -> None:
        for q in self._queues.values():
            q.put_nowait(StreamLost(reason))
        self._queues.clear()
