"""Prefill worker: runs prompts into compact pages and hands them over by manifest.

A request's pages stay held after ``prefill`` returns, until the decode side's notice says it
has them (``transfer.manifest.done_notice``, delivered by the transport after the last byte landed), an
explicit ``release``, or expiry: ``hold_timeout_s``, or the caller's ``wait_s`` if longer (a decode worker
that died never answers). A transfer reading them extends that: our push until it ends (it frees them
itself), a decode worker's pull, which the caller ``claim``s first (expired pages may already hold
another request's K/V), for the transfer deadline plus ``CLAIM_GRACE_S`` (a caller that died after
claiming must not hold them for good).

A prompt waits (up to ``wait_s``, in arrival order) while the pool is short of pages that held
requests will free; one that needs more pages than the pool has is refused at once
(``CapacityError``). The lock is held through a whole prefill (seconds for a long prompt), so the
probes the router sends meanwhile (``counters``, ``cached_prefix_pages``) read without it.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

from kvwire.kv_cache import SequenceKV
from kvwire.page_pool import CapacityError, NoRoomError, page_chain_hashes
from kvwire.sampling import Sampler, SamplingParams
from kvwire.worker_config import WorkerConfig
from transfer.base import TransferError
from transfer.endpoint import WorkerEndpoint
from transfer.handle import TransferState
from transfer.manifest import Manifest, is_done_notice, parse_done_notice

log = logging.getLogger(__name__)
CLAIM_GRACE_S = 60.0      # a claimed pull's hold lasts the transfer deadline plus this


@dataclass
class _Held:
    seq: SequenceKV
    expires: float            # monotonic time after which nobody is coming for it (``_expire``); inf: a push reads it


class PrefillWorker(WorkerEndpoint):
    def __init__(self, cfg: WorkerConfig) -> None:
        super().__init__(cfg)
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)     # pages were released: waiting prompts look again
        self._turns = self._freed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch_notices, name=f"{cfg.name}-notices", daemon=True)
        self._thread.start()

    # ---- requests ----
    def cached_prefix_pages(self, prompt_ids: list[int]) -> int:
        """How many of the prompt's leading full pages this worker's prefix cache holds (routing affinity)."""
        p = self.cfg.page_size
        hashes = page_chain_hashes(self.engine.page_format.hash, list(prompt_ids), p)[:(len(prompt_ids) - 1) // p]
        return self.kv.pool.cached_prefix_length(hashes)    # no lock: a probe must not wait out a prefill

    def prefill(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> bytes:
        """Prefill, sample the first token, and return the manifest (msgpack bytes)."""
        return self.prefill_request(request_id, prompt_ids, params)["manifest"]

    def prefill_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                        wait_s: float = 60.0) -> dict:
        """Prefill and sample the first token: {"manifest": bytes, "prefix_pages_reused": int}.

        Waits up to ``wait_s`` for the pages; raises CapacityError if the pool can never hold them,
        NoRoomError if they were not freed in time.
        """
        self.engine.validate(prompt_ids, params)
        needed = self.engine.runner.pages_needed(SequenceKV(), len(prompt_ids))    # the tail page stays bf16
        if needed > self.kv.pool.num_pages:
            raise CapacityError(f"a prompt of {len(prompt_ids)} tokens needs {needed} pages; {self.cfg.name} "
                                f"has {self.kv.pool.num_pages} in all (num_pages)")
        seq = SequenceKV()
        try:
            with self._lock:  # one forward at a time: the runner is not thread-safe
                if request_id in self._held or request_id in self._waiting:
                    raise ValueError(f"request {request_id!r} is already held by {self.cfg.name}")
                self._wait_for_room(request_id, needed, wait_s)
                self._busy_with = request_id           # withdraw() now stops it between chunks
                try:
                    logits = self.engine.prefill(seq, list(prompt_ids),
                                                 between_chunks=lambda: self._check_withdrawn(request_id))
                finally:
                    self._busy_with = None
                    self._withdrawn.discard(request_id)
                first = Sampler(params)(logits)
                manifest = Manifest.from_tensors(
                    request_id=request_id, page_format=self.engine.page_format, page_ids=seq.pages,
                    tail=self.kv.tails.data[seq.tail_slot, :, :, :, :seq.tail_len(self.cfg.page_size)].cpu(),
                    first_token=first, sender=self.transport.name, sender_num_pages=self.kv.pool.num_pages,
                    static_scales=self.kv.static_scales.cpu() if self.kv.needs_static_scales() else None)
                # held at least as long as the caller may still take to hand it over (its own wait for a
                # decode worker's room can be minutes): expiring sooner fails a request that is on its way
                self._held[request_id] = _Held(seq, time.monotonic() + max(self.cfg.hold_timeout_s, wait_s))
        except BaseException:
            with self._lock:
                self.engine.runner.release(seq)
                self._freed.notify_all()
            raise
        return {"manifest": manifest.encode(), "prefix_pages_reused": seq.prefix_pages_reused}

    def _wait_for_room(self, request_id: str, pages: int, wait_s: float) -> None:
        """Wait in turn (caller holds the lock) until ``pages`` and a tail slot are free."""
        room = lambda: self.kv.pool.can_allocate(pages) and self.kv.tails.free_slots > 0  # noqa: E731
        if not self._wait_in_turn(request_id, room, wait_s):
            raise NoRoomError(f"{self.cfg.name} had no room for {pages} pages and a tail page within "
                              f"{wait_s:.0f} s ({len(self._held)} requests hold pages awaiting their transfer)")

    def push(self, request_id: str, peer: str, remote_pages: list[int], deadline_s: float | None = None) -> dict:
        """Push mode: WRITE a held request's pages into ``peer``'s reserved pages, then free ours.

        Returns the transfer's stats (compact bytes from the descriptors issued, the bf16 bytes
        they stand for, descriptors, seconds). Ours are freed whatever the outcome: a failed push
        fails the request, and the caller cancels the peer's reservation, quarantining its pages when
        the TransferError says the aborted WRITE may still land there (``quiesced`` False).
        """
        held = self._claim(request_id, math.inf)     # the finally below frees it, whatever happens
        if held is None:
            raise KeyError(f"request {request_id!r} is not held by {self.cfg.name} (expired or released)")
        deadline = self.cfg.transfer_deadline_s if deadline_s is None else deadline_s
        try:
            handle = self.transport.write_pages(peer, held.seq.pages, remote_pages, deadline)
            state = handle.wait(deadline + 1.0)
            if state is not TransferState.DONE:
                handle.abort()
                raise TransferError(f"pushing {len(remote_pages)} pages of {request_id} to {peer} ended "
                                    f"{state.value}{': ' + handle.error if handle.error else ''}",
                                    quiesced=handle.quiesced)
        finally:
            self.release(request_id)
        st = handle.stats
        return {"compact_bytes": st.compact_bytes, "bf16_bytes": st.bf16_bytes, "pages": st.num_pages,
                "descriptors": st.num_descriptors, "seconds": st.seconds}

    def claim(self, request_id: str) -> bool:
        """A pull is about to read a held request's pages: they stay held for the transfer deadline plus
        CLAIM_GRACE_S (the notice or ``release`` frees them sooner). False if they are no longer held,
        expired or released: the pull must not start then, since the pages may hold another request's K/V."""
        until = time.monotonic() + self.cfg.transfer_deadline_s + CLAIM_GRACE_S
        return self._claim(request_id, until) is not None

    def _claim(self, request_id: str, until: float) -> _Held | None:
        with self._lock:
            held = self._held.get(request_id)
            if held is not None:
                held.expires = max(held.expires, until)
        return held

    def release(self, request_id: str) -> bool:
        """Free a request's pages (decode has them, or the request died). False if not held."""
        with self._lock:
            held = self._held.pop(request_id, None)
            if held is not None:
                self.engine.runner.release(held.seq)
                self._freed.notify_all()
        return held is not None

    def counters(self) -> dict:
        """A snapshot read without the lock (module docstring), so it answers during a prefill."""
        c = self.kv.pool.counters()
        return {"worker": self.cfg.name, "role": "prefill", "format": self.engine.page_format.name,
                "pages_in_use": c.used, "pages_cached": c.cached, "pages_free": c.free + c.evictable,
                "requests_held": len(self._held)}

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.transport.close()

    # ---- background ----
    def _watch_notices(self) -> None:
        """Free pages on decode notices, and expire holds nobody claimed.

        Transports deliver notices only when polled, so this sleeps between polls, longer while
        nothing is held. A failing round is logged and the loop goes on: were this thread to end,
        no page would ever be freed again.
        """
        idle = 0.002
        while not self._stop.is_set():
            got = False
            try:
                for peer, msg in self.transport.poll_notifications():
                    got = self._on_notice(peer, msg) or got
                self._expire()
            except Exception:
                log.exception("%s: a round of notices and expiry failed; retrying in 1 s", self.cfg.name)
                self._stop.wait(1.0)
                continue
            with self._lock:
                busy = bool(self._held)
            idle = 0.002 if got else min(idle * 2, 0.02 if busy else 0.2)
            self._stop.wait(idle)

    def _on_notice(self, peer: str, msg: bytes) -> bool:
        """Free what a done notice names (True if it freed something). A notice already taken from the
        transport is not delivered again, so a failure is logged here without losing the others."""
        rid = parse_done_notice(msg)
        if rid is None:
            if is_done_notice(msg):
                log.warning("%s: ignored a malformed done notice from %r: %r", self.cfg.name, peer, msg[:80])
            return False
        try:
            return self.release(rid)
        except Exception:
            log.exception("%s: freeing %s on its done notice failed", self.cfg.name, rid)
            return False

    def _expire(self) -> None:
        """Free holds past their expiry, checked and popped under one lock so a push cannot start between."""
        now = time.monotonic()
        with self._lock:
            stale = [rid for rid, h in self._held.items() if now > h.expires]
            for rid in stale:
                self.engine.runner.release(self._held.pop(rid).seq)
            if stale:
                self._freed.notify_all()
