"""What a prefill and a decode worker share: an engine built from the worker's config, and a transport
whose registered memory is that engine's page pool, with the handshake that connects two of them."""
from __future__ import annotations

import collections
import threading
from typing import Callable

from kvwire.worker_config import WorkerConfig, build_engine
from transfer import make_transport
from transfer.handshake import decode_handshake


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

    def _wait_in_turn(self, changed: threading.Condition, rid: str, room: Callable[[], bool], timeout_s: float,
                      stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait (holding ``changed``'s lock) until every request that came earlier has gone and ``room()``
        holds, or ``stop()``; False on timeout. Arrival order, so a large request is not passed over
        forever by smaller ones that keep fitting."""
        self._waiting.append(rid)
        try:
            return changed.wait_for(lambda: stop() or (self._waiting[0] == rid and room()), timeout_s)
        finally:
            self._waiting.remove(rid)
            changed.notify_all()                # the next waiter may be first now

    def handshake(self) -> bytes:
        """This worker's transfer handshake, for a peer's ``add_peer``."""
        return self.transport.handshake().encode()

    def add_peer(self, handshake: bytes) -> str:
        """Connect to the worker whose ``handshake`` this is; returns its name."""
        return self.transport.add_peer(decode_handshake(handshake))
