"""Decode worker: admits manifests, pulls their pages, decodes in a continuous batch.

Admission: the manifest is fully validated (format hash, page ids, lengths) before a byte
moves; then pages and a tail slot are reserved (waiting, not failing, while the pool or the
batch is full). A request is admitted only when the pool can also hold every page it may grow
to (prompt + ``max_tokens``, within the context) on top of what the admitted requests may still
grow to, so a running batch never runs out of pages mid-stream (TensorRT-LLM calls this policy
"guaranteed no evict"); a request that could not fit in the whole pool is refused at once.

Push (the default, measured faster: docs/benchmarks.md): the prefill worker WRITEs into the
reserved pages, then ``activate``. Pull: ``admit`` READs them from the prefill worker's pool, and
the transport's notice tells the prefill side it may free them. Every step decodes one token for
every running request; requests join and leave between steps. Finished, failed and aborted requests free
their pages at once.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from kvwire.kv_cache import SequenceKV
from kvwire.page_pool import CapacityError, NoRoomError
from kvwire.runner import Segment
from kvwire.sampling import Sampler, SamplingParams, sample_rows
from kvwire.worker_config import WorkerConfig
from transfer.base import PeerError, TransferError
from transfer.endpoint import WorkerEndpoint
from transfer.handle import TransferState, TransferStats
from transfer.manifest import Manifest, ManifestError, decode_manifest, done_notice


FINISHED_KEPT = 4096   # finished requests whose final message is kept until read, at most
# Pages an aborted transfer may still write into (its abort could not confirm the transfer stopped) stay
# out of the pool this long: far past any transfer deadline, so no later request is admitted into them.
QUARANTINE_S = 60.0


class AdmissionError(RuntimeError):
    """A manifest was valid but its pages could not be brought in (transfer failed, timed out).
    ``quiesced`` as for TransferError: False if the aborted READ may still land in the reserved pages."""

    def __init__(self, message: str, quiesced: bool = True) -> None:
        super().__init__(message)
        self.quiesced = quiesced


@dataclass
class TokenBatch:
    tokens: list[int]
    finished: str | None = None     # finish reason once done: eos, length, aborted, error: ...


@dataclass
class _Request:
    rid: str
    seq: SequenceKV
    params: SamplingParams
    sampler: Sampler
    last_token: int
    generated: int
    max_pages: int                  # pages it holds once at max_tokens or the context (admission)
    out: "queue.Queue[int | str]" = field(default_factory=queue.Queue)   # tokens, then a finish reason


class DecodeWorker(WorkerEndpoint):
    def __init__(self, cfg: WorkerConfig) -> None:
        super().__init__(cfg)
        self._running: dict[str, _Request] = {}
        self._finished: dict[str, _Request] = {}     # done, final reason not yet read (insertion order)
        self._reserved: dict[str, tuple] = {}      # rid -> (manifest, pages, tail slot, params, max pages)
        self._lock = threading.Lock()              # pool, tails, runner and the request maps
        self._changed = threading.Condition(self._lock)
        self._turns = self._changed
        # Token output has its own condition: pollers must not queue for the lock the decode loop
        # holds through every step (they starved behind it on the GPU, where steps follow back to back).
        self._output = threading.Condition()
        self._stop = False
        self._quarantined = 0                       # pages out of the pool until an aborted transfer is surely over
        self._thread = threading.Thread(target=self._loop, name=f"{cfg.name}-decode", daemon=True)
        self._thread.start()

    # ---- admission ----
    def admit(self, manifest_blob: bytes, params: SamplingParams, timeout_s: float = 60.0) -> str:
        """Pull mode: reserve, READ the pages from the sender, start decoding. Returns the request id.

        Raises ManifestError before any transfer; AdmissionError (pages freed) if the pull fails.
        """
        rid = self.reserve(manifest_blob, params, timeout_s)["request_id"]
        m = self._reserved[rid][0]
        try:
            self._pull(m, self._reserved[rid][1])
        except BaseException as exc:
            self.cancel(rid, quarantine=not getattr(exc, "quiesced", True))
            raise
        self.activate(rid)
        return rid

    def reserve(self, manifest_blob: bytes, params: SamplingParams, timeout_s: float = 60.0) -> dict:
        """Validate a manifest and set aside pages for it (waiting while full).

        Push mode: the caller then has the prefill worker WRITE into ``pages`` and calls
        ``activate`` (or ``cancel``). Returns {"request_id", "pages"}.
        """
        m = decode_manifest(manifest_blob, self.engine.page_format)
        self._check_scales(m)
        self._check_payload(m)
        if m.sender not in self.transport.peers:
            raise ManifestError(f"manifest sender {m.sender!r} is not a connected peer of {self.cfg.name}")
        max_pages = self._max_pages(m.num_tokens, len(m.page_ids), params)
        return {"request_id": m.request_id, "pages": self._reserve(m, params, max_pages, timeout_s)}

    def _check_payload(self, m: Manifest) -> None:
        """What the format contract cannot check: a first token this model has, and a finite tail.
        Either would otherwise fail the first decode step of every request batched with this one."""
        vocab = self.engine.model.config.vocab_size
        if not 0 <= m.first_token < vocab:
            raise ManifestError(f"manifest {m.request_id}: first_token {m.first_token} is not a token id of "
                                f"this model (vocabulary {vocab})")
        if m.tail_len and not torch.isfinite(m.tail_tensor()).all():
            raise ManifestError(f"manifest {m.request_id}: the bf16 tail holds non-finite values (NaN or inf)")

    def cancel(self, rid: str, quarantine: bool = False) -> bool:
        """Drop a reservation (its transfer failed or the request was cancelled). ``quarantine``: its
        transfer was aborted without confirmation that it stopped, so the pages return to the pool only
        after QUARANTINE_S (a request admitted into them meanwhile could have its K/V overwritten)."""
        with self._lock:
            res = self._reserved.pop(rid, None)
            if res is None:
                return False
            if quarantine:   # no transfer writes the tail slot (the tail comes in the manifest): free it now
                self.engine.runner.release(SequenceKV(tail_slot=res[2]))
                self._quarantined += len(res[1])
            else:
                self.engine.runner.release(SequenceKV(pages=res[1], tail_slot=res[2]))
            self._notify()
        if quarantine:
            timer = threading.Timer(QUARANTINE_S, self._end_quarantine, (res[1],))
            timer.daemon = True
            timer.start()
        return True

    def _end_quarantine(self, pages: list[int]) -> None:
        with self._lock:
            self._quarantined -= len(pages)
            if not self._stop:
                self.engine.runner.release(SequenceKV(pages=pages))
                self._notify()

    def activate(self, rid: str) -> None:
        """The reserved pages hold the request's K/V now: add the tail and start decoding."""
        with self._lock:
            res = self._reserved.pop(rid, None)
        if res is None:
            raise KeyError(f"no reservation {rid!r} on {self.cfg.name}")
        m, pages, slot, params, max_pages = res
        seq = SequenceKV(pages=pages, tail_slot=slot, num_tokens=m.num_tokens)
        try:    # no longer reserved and not yet running: a failure here must free the pages itself
            tail = m.tail_tensor().to(self.kv.device)
            req = _Request(m.request_id, seq, params, Sampler(params, first_index=1), m.first_token, 1,
                           max_pages)
            req.out.put(m.first_token)
            reason = self.engine.finish_reason(m.first_token, 1, m.num_tokens + 1, params)
        except BaseException:
            with self._lock:
                self.engine.runner.release(seq)
                self._notify()
            raise
        with self._lock:
            self.kv.tails.data[slot, :, :, :, :m.tail_len] = tail
            if reason:
                self._finish(req, reason)
            else:
                self._running[m.request_id] = req
            self._notify()

    def _pull(self, m, pages: list[int]) -> TransferStats | None:
        """READ the manifest's pages into ``pages``; the transport's notice frees them at the sender."""
        notice = done_notice(m.request_id)
        try:
            if not pages:
                self.transport.send_notification(m.sender, notice)
                return None
            handle = self.transport.read_pages(m.sender, list(m.page_ids), pages, self.cfg.transfer_deadline_s,
                                               notify=notice)
        except (TransferError, PeerError) as exc:
            raise AdmissionError(f"pulling {len(pages)} pages of {m.request_id} from {m.sender} failed: {exc}") from exc
        state = handle.wait(self.cfg.transfer_deadline_s + 1.0)
        if state is not TransferState.DONE:
            handle.abort()
            raise AdmissionError(f"pulling {len(pages)} pages of {m.request_id} from {m.sender} ended {state.value}"
                                 f"{': ' + str(handle.error) if handle.error else ''}", quiesced=handle.quiesced)
        return handle.stats

    def _check_scales(self, m) -> None:
        theirs = m.static_scales_tensor()
        if theirs is None:
            return
        ours = self.kv.static_scales.cpu()
        if not torch.equal(ours, theirs):
            raise ManifestError(f"manifest {m.request_id} carries static scales that differ from "
                                f"{self.cfg.name}'s calibration: pools of one format must share scales")

    def _max_pages(self, num_tokens: int, num_pages: int, params: SamplingParams) -> int:
        """Pages a request holds at its longest: the K/V of prompt + max_tokens - 1 tokens (the last
        sampled token is never written), capped by the context, by the runner's page rule."""
        longest = min(num_tokens + params.max_tokens - 1, self.engine.max_context)
        return max(num_pages, self.engine.runner.pages_needed(SequenceKV(), longest))

    def _growth_promised(self) -> int:
        """Pages the admitted requests may still take (caller holds the lock)."""
        running = sum(max(0, r.max_pages - len(r.seq.pages)) for r in self._running.values())
        return running + sum(res[4] - len(res[1]) for res in self._reserved.values())

    def _reserve(self, m, params: SamplingParams, max_pages: int, timeout_s: float) -> list[int]:
        """Set aside the manifest's pages and a tail slot, waiting while the pool or the batch is full
        (module docstring). Waiters are served in arrival order, so a large request is not passed
        over forever by smaller ones that keep fitting. Returns the pages."""
        rid = m.request_id
        if max_pages > self.kv.pool.num_pages:
            raise CapacityError(f"request {rid} may grow to {max_pages} pages (prompt and max_tokens); "
                                f"{self.cfg.name} has {self.kv.pool.num_pages} in all (num_pages)")
        with self._lock:
            if rid in self._running or rid in self._reserved or rid in self._waiting:
                raise ValueError(f"request {rid!r} is already running on {self.cfg.name}")
            if not self._wait_in_turn(rid, lambda: self._has_room(max_pages), timeout_s,
                                      stop=lambda: self._stop) or self._stop:
                raise NoRoomError(f"{self.cfg.name} had no room for {max_pages} pages (prompt and "
                                  f"max_tokens) within {timeout_s:.0f} s")
            pages, slot = self.kv.pool.allocate(len(m.page_ids)), self.kv.tails.allocate()
            self._reserved[rid] = (m, pages, slot, params, max_pages)
            return pages

    def _has_room(self, max_pages: int) -> bool:
        """Room for one more request that may grow to ``max_pages`` (caller holds the lock)."""
        return (self.kv.pool.can_allocate(max_pages + self._growth_promised()) and self.kv.tails.free_slots > 0
                and len(self._running) + len(self._reserved) < self.cfg.max_batch)

    # ---- streaming ----
    def next_tokens(self, rid: str, timeout_s: float = 1.0) -> TokenBatch:
        """Tokens produced since the last call (blocking up to ``timeout_s`` for the first)."""
        with self._lock:
            req = self._running.get(rid) or self._finished.get(rid)
        if req is None:
            raise KeyError(f"no request {rid!r} on {self.cfg.name}")
        out = TokenBatch([])
        try:
            item = req.out.get(timeout=timeout_s)
            while True:
                if isinstance(item, str):
                    out.finished = item
                    with self._lock:
                        self._finished.pop(rid, None)
                    break
                out.tokens.append(item)
                item = req.out.get_nowait()
        except queue.Empty:
            pass
        return out

    def _notify(self) -> None:
        """State changed (caller holds the lock): wake admissions and the loop, and token pollers."""
        self._changed.notify_all()
        with self._output:
            self._output.notify_all()

    def poll_streams(self, rids: list[str], timeout_s: float = 1.0) -> dict[str, TokenBatch]:
        """Output of many requests in one call (the router polls each decode worker once per round).

        Waits up to ``timeout_s`` until one of ``rids`` has output; unknown ids come back as
        finished with "error: unknown request" so a poller never waits on them forever.
        """
        deadline = time.monotonic() + timeout_s
        with self._output:
            while True:
                reqs = {rid: self._running.get(rid) or self._finished.get(rid) for rid in rids}
                if any(r is not None and not r.out.empty() for r in reqs.values()) or self._stop:
                    break
                if any(r is None for r in reqs.values()):
                    break      # maybe between the running and finished maps: looked up under the lock below
                left = deadline - time.monotonic()
                if left <= 0:
                    return {}
                self._output.wait(left)
        missing = [rid for rid, r in reqs.items() if r is None]
        if missing:
            with self._lock:
                for rid in missing:
                    reqs[rid] = self._running.get(rid) or self._finished.get(rid)
        out: dict[str, TokenBatch] = {}
        for rid, req in reqs.items():
            if req is None:
                out[rid] = TokenBatch([], finished=f"error: unknown request {rid!r} on {self.cfg.name}")
            elif not req.out.empty():
                out[rid] = self._drain(req)
        return out

    def _drain(self, req: _Request) -> TokenBatch:
        """Everything in a request's output queue now, without waiting."""
        out = TokenBatch([])
        while True:
            try:
                item = req.out.get_nowait()
            except queue.Empty:
                return out
            if isinstance(item, str):
                out.finished = item
                with self._lock:
                    self._finished.pop(req.rid, None)
                return out
            out.tokens.append(item)

    def abort(self, rid: str) -> bool:
        with self._lock:
            req = self._running.pop(rid, None)
            if req is not None:
                self._finish(req, "aborted")
                self._notify()
        return req is not None

    def counters(self) -> dict:
        with self._lock:
            c = self.kv.pool.counters()
            return {"worker": self.cfg.name, "role": "decode", "format": self.engine.page_format.name,
                    "pages_in_use": c.used, "pages_free": c.free + c.evictable,
                    "running": len(self._running), "reserved": len(self._reserved),
                    "pages_quarantined": self._quarantined}

    def shutdown(self) -> None:
        with self._lock:
            self._stop = True
            for req in list(self._running.values()):
                self._finish(req, "aborted")
            self._running.clear()
            for _m, pages, slot, _p, _max in self._reserved.values():
                self.engine.runner.release(SequenceKV(pages=pages, tail_slot=slot))
            self._reserved.clear()
            self._notify()
        self._thread.join(timeout=10)
        self.transport.close()

    # ---- the decode loop ----
    def _finish(self, req: _Request, reason: str) -> None:
        """Caller holds the lock: free the request's pages and close its stream."""
        self.engine.runner.release(req.seq)
        req.out.put(reason)
        self._finished[req.rid] = req
        while len(self._finished) > FINISHED_KEPT:      # streams nobody reads (aborted by their caller)
            self._finished.pop(next(iter(self._finished)))

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._running and not self._stop:
                    self._changed.wait()
                if self._stop:
                    return
                batch = list(self._running.values())
                try:
                    logits = self.engine.runner.forward([Segment(r.seq, [r.last_token], None) for r in batch])
                except Exception as exc:  # a failed step fails its batch, never the worker
                    for r in batch:
                        self._running.pop(r.rid, None)
                        self._finish(r, f"error: {type(exc).__name__}: {exc}")
                    self._notify()
                    continue
                for r, token in zip(batch, sample_rows([r.sampler for r in batch], logits)):
                    r.generated += 1
                    r.last_token = token
                    r.out.put(token)
                    reason = self.engine.finish_reason(token, r.generated, r.seq.num_tokens + 1, r.params)
                    if reason:
                        self._running.pop(r.rid, None)
                        self._finish(r, reason)
                self._notify()
            time.sleep(0)   # let admissions and aborts take the lock between steps
