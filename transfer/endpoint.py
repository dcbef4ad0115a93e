"""What a prefill and a decode worker share: an engine built from the worker's config, and a transport
whose registered memory is that engine's page pool, with the handshake that connects two of them."""
from __future__ import annotations

import collections
import threading
from typing import Callable

from kvwire.worker_config import WorkerConfig, build_engine
from transfer import make_transport
from transfer.handshake import decode_handshake


class Withdrawn(RuntimeError):
    """A request's wait for pages ended because its caller withdrew it."""


class WorkerEndpoint:
    """Base of ``prefill.worker.PrefillWorker`` and ``decode.worker.DecodeWorker``."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.engine, self.tokenizer = build_engine(cfg)
        self.kv = self.engine.kv
        options = {"progress_delay_us": cfg.transfer_progress_delay_us} if cfg.transport == "nixl" else {}
        self.transport = make_transport(cfg.transport, cfg.name, **options)
        self.transport.register_pool(self.kv.pool.storage, self.engine.page_format)
        self._waiting: collections.deque[str] = collections.deque()   # requests waiting for pages, in order
        self._withdrawn: set[str] = set()     # waiting or running requests whose caller gave up (``withdraw``)
        self._busy_with: str | None = None    # the request a long step (a prefill) runs for: it may be withdrawn
        self._turns: threading.Condition | None = None     # the subclass's "pages were freed" condition

    def _wait_in_turn(self, rid: str, room: Callable[[], bool], timeout_s: float,
                      stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait (holding ``self._turns``' lock) until every request that came earlier has gone and
        ``room()`` holds, or ``stop()``; False on timeout. Arrival order, so a large request is not passed
        over forever by smaller ones that keep fitting. Raises Withdrawn if ``withdraw(rid)`` came first."""
        self._waiting.append(rid)
        try:
            ready = self._turns.wait_for(
                lambda: stop() or rid in self._withdrawn or (self._waiting[0] == rid and room()), timeout_s)
            if rid in self._withdrawn:
                raise Withdrawn(f"request {rid!r} was withdrawn by its caller while it waited for pages")
            return ready
        finally:
            self._waiting.remove(rid)
            self._withdrawn.discard(rid)
            self._turns.notify_all()                # the next waiter may be first now

    def withdraw(self, rid: str) -> bool:
        """The caller gave up on ``rid`` (cancelled, or past its deadline) while it may be waiting for pages:
        end that wait now, so a dead request does not hold up those queued behind it. A no-op (False) when
        ``rid`` is not waiting: whatever it holds is freed by the caller's cancel or release. The request a
        long step runs for (``_busy_with``) is marked without the lock, which that step holds; the step
        looks between its chunks (``_check_withdrawn``)."""
        if rid == self._busy_with:
            self._withdrawn.add(rid)
            return True
        with self._turns:
            if rid not in self._waiting:
                return False
            self._withdrawn.add(rid)
            self._turns.notify_all()
        return True

    def _check_withdrawn(self, rid: str) -> None:
        """Between the chunks of a long step for ``rid``: stop if its caller withdrew it."""
        if rid in self._withdrawn:
            raise Withdrawn(f"request {rid!r} was withdrawn by its caller while it ran")

    def remove_peer(self, name: str) -> bool:
        """Forget a peer that died (its transfer metadata and connections); False if it was not connected."""
        if name not in self.transport.peers:
            return False
        self.transport.remove_peer(name)
        return True

    def handshake(self) -> bytes:
        """This worker's transfer handshake, for a peer's ``add_peer``."""
        return self.transport.handshake().encode()

    def add_peer(self, handshake: bytes) -> str:
        """Connect to the worker whose ``handshake`` this is; returns its name."""
        return self.transport.add_peer(decode_handshake(handshake))
