"""One request through a pool: prefill, push the compact pages to a decode worker, stream tokens.

prefill (on a worker chosen by prefix affinity) -> manifest -> the decode worker reserves pages
-> the prefill worker WRITEs into them and frees its own -> activate -> tokens. A prefill worker
that dies before the hand-over is retried on another (or its replacement) up to
``max_attempts``; once tokens flow, a failure ends the request with an error. Whatever the
exit (done, failed, cancelled by the client or its deadline), both sides free what they hold.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

import ray

from kvwire.page_pool import CapacityError, NoRoomError
from kvwire.sampling import SamplingParams
from router.pool import WorkerPool
from router.streams import StreamLost
from router.workers import Worker

log = logging.getLogger("kvwire.router")


class Failure(enum.Enum):
    """What kind of failure a RequestError is, for the status code the client gets."""

    WORKER = "worker"            # a worker failed: INTERNAL
    TOO_LARGE = "too_large"      # more pages than a worker has in all: INVALID_ARGUMENT
    NO_ROOM = "no_room"          # pages not freed within the wait: RESOURCE_EXHAUSTED


class RequestError(RuntimeError):
    """The request failed on the workers; ``retryable`` says whether another attempt may succeed."""

    def __init__(self, message: str, retryable: bool = False, failure: Failure = Failure.WORKER) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.failure = failure


def _cause(exc: BaseException) -> BaseException:
    """The exception a worker raised, from the RayTaskError that carries it (else ``exc`` itself)."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    return cause if isinstance(cause, BaseException) else exc


def _worker_error(what: str, exc: BaseException) -> RequestError:
    """A RequestError for a call a worker raised from: the worker's own message in one line, and the
    kind of failure. A worker fault's Ray traceback goes to the router's log, not to the client."""
    cause = _cause(exc)
    traceback, exc = (exc, cause) if cause is not exc else (None, exc)
    if isinstance(exc, CapacityError):
        failure = Failure.TOO_LARGE
    elif isinstance(exc, NoRoomError):
        failure = Failure.NO_ROOM
    else:
        failure = Failure.WORKER
        if traceback is not None:          # a worker's fault, not the request's: keep where it happened
            log.warning("%s: %s", what, traceback)
    return RequestError(f"{what}: {type(exc).__name__}: {exc}", failure=failure)


@dataclass
class RequestStats:
    request_id: str
    prompt_tokens: int
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    completion_tokens: int = 0
    finish_reason: str = ""
    wire_bytes: int = 0
    wire_bf16_bytes: int = 0
    prefix_pages_reused: int = 0
    prefill_worker: str = ""
    decode_worker: str = ""
    attempts: int = 0

    @property
    def ttft_s(self) -> float:
        return (self.first_token_at or time.perf_counter()) - self.started


def _dead(exc: BaseException) -> bool:
    return isinstance(exc, ray.exceptions.RayActorError)


async def _quietly(awaitable) -> None:
    """Clean-up calls: a dead worker holds nothing, so their errors are not the request's."""
    try:
        await awaitable
    except Exception:
        pass


_cleanups: set[asyncio.Task] = set()


def _after(ref, *cleanups) -> None:
    """Once the call behind ``ref`` ends (it may still be running after a cancel), run ``cleanups``.

    A cancelled request must not leave a reservation or held pages that complete after it gave
    up, nor free pages that a transfer still in flight is writing into.
    """
    async def run() -> None:
        await _quietly(ref)
        for make in cleanups:
            await _quietly(make())
    task = asyncio.get_running_loop().create_task(run())
    _cleanups.add(task)
    task.add_done_callback(_cleanups.discard)


async def _call(ref, on_cancel=(), withdraw=None):
    """Await a worker call; if the request is cancelled meanwhile, ``withdraw()`` at once (a call that
    waits for pages stops waiting and holds up no one behind it) and schedule ``on_cancel`` after it ends."""
    try:
        return await ref
    except asyncio.CancelledError:
        if withdraw is not None:
            _after(withdraw())
        _after(ref, *on_cancel)
        raise


async def _hand_over(pool: WorkerPool, rid: str, prompt_ids: list[int], params: SamplingParams,
                     stats: RequestStats, deadline: float) -> Worker:
    """Prefill and push; returns the decode worker now running ``rid``. Raises RequestError.

    Each wait (for a live worker, for pages on either side) gets what is left until ``deadline`` (event
    loop time), not the whole budget again: the stages together never outlast the request's limit."""
    loop = asyncio.get_running_loop()
    left = lambda: max(0.0, deadline - loop.time())  # noqa: E731
    prefill = await pool.choose_prefill(prompt_ids, left())
    stats.prefill_worker = prefill.name
    release = lambda: prefill.actor.release.remote(rid)  # noqa: E731 - a no-op after a push
    prefill.inflight += 1
    try:
        try:
            result = await _call(prefill.actor.prefill_request.remote(rid, prompt_ids, params, left()), [release],
                                 withdraw=lambda: prefill.actor.withdraw.remote(rid))
        except Exception as exc:
            if _dead(exc):
                pool.worker_died(prefill)
                raise RequestError(f"prefill worker {prefill.name} died during prefill", retryable=True) from exc
            raise _worker_error(f"prefill on {prefill.name} failed", exc) from exc
        stats.prefix_pages_reused = result["prefix_pages_reused"]
        try:
            decode = await pool.choose_decode(left())
            stats.decode_worker = decode.name
            cancel = lambda: decode.actor.cancel.remote(rid)  # noqa: E731
            try:
                reserved = await _call(decode.actor.reserve.remote(result["manifest"], params, left()), [cancel],
                                       withdraw=lambda: decode.actor.withdraw.remote(rid))
            except Exception as exc:
                if _dead(exc):
                    pool.worker_died(decode)
                    raise RequestError(f"decode worker {decode.name} died during admission", retryable=True) from exc
                raise _worker_error(f"admission on {decode.name} failed", exc) from exc
            try:
                pushed = await _call(prefill.actor.push.remote(rid, decode.agent, reserved["pages"]), [cancel])
            except Exception as exc:
                # an aborted WRITE that may still land: decode keeps those pages out of use for a while
                landing = not getattr(_cause(exc), "quiesced", True)
                try:
                    await decode.actor.cancel.remote(rid, quarantine=landing)
                except Exception as gone:
                    if _dead(gone):      # the push failed because decode died: no token sent, so try again
                        pool.worker_died(decode)
                        raise RequestError(f"decode worker {decode.name} died during the transfer",
                                           retryable=True) from exc
                if _dead(exc):
                    pool.worker_died(prefill)
                    raise RequestError(f"prefill worker {prefill.name} died during the transfer",
                                       retryable=True) from exc
                raise _worker_error(f"transfer {prefill.name} -> {decode.name} failed", exc) from exc
            stats.wire_bytes, stats.wire_bf16_bytes = pushed["compact_bytes"], pushed["bf16_bytes"]
            try:
                await _call(decode.actor.activate.remote(rid), [lambda: decode.actor.abort.remote(rid)])
            except Exception as exc:
                await _quietly(cancel())
                if _dead(exc):
                    pool.worker_died(decode)
                raise RequestError(f"activation on {decode.name} failed: {exc}", retryable=_dead(exc)) from exc
            return decode
        except BaseException:
            await _quietly(release())
            raise
    finally:
        prefill.inflight -= 1


async def run_request(pool: WorkerPool, request_id: str, prompt_ids: list[int], params: SamplingParams,
                      stats: RequestStats, wait_s: float, max_attempts: int) -> AsyncIterator[list[int]]:
    """Yield lists of token ids; ``stats`` is filled in as the request goes. Raises RequestError."""
    attempt = 0
    deadline = asyncio.get_running_loop().time() + wait_s
    # the workers' key: unique per run, since a cancelled run's clean-up may still hold its key on a
    # worker when the client retries under the same request_id
    run = uuid.uuid4().hex[:8]
    while True:
        attempt += 1
        stats.attempts = attempt
        rid = f"{request_id}#{run}.{attempt}"
        try:
            decode = await _hand_over(pool, rid, prompt_ids, params, stats, deadline)
            break
        except RequestError as exc:
            if not exc.retryable or attempt >= max_attempts:
                raise
            pool.totals.retries += 1
    queue = pool.open_stream(decode, rid)
    decode.inflight += 1
    finished = False
    try:
        while True:
            item = await queue.get()
            if isinstance(item, StreamLost):     # the worker may still run it: the finally aborts it there
                raise RequestError(f"{request_id} on {decode.name}: error: {item.reason}")
            if isinstance(item, str):
                finished = True
                if item.startswith("error"):
                    raise RequestError(f"{request_id} on {decode.name}: {item}")
                stats.finish_reason = item
                return
            if stats.first_token_at is None:
                stats.first_token_at = time.perf_counter()
            stats.completion_tokens += len(item)
            yield item
    finally:
        decode.inflight -= 1
        pool.close_stream(decode, rid)
        if not finished:
            await asyncio.shield(_quietly(decode.actor.abort.remote(rid)))
