"""The transfer interface: a Transport moves runs of compact pages between registered page pools.

Model (SGLang-style sender/receiver, explicit states):

- Each worker owns one Transport with one registered pool (``register_pool``), publishes its
  ``handshake()`` and ``add_peer``\\ s the handshakes of the workers it talks to. A peer whose page
  format hash differs is refused there, before any page can move.
- ``write_pages`` (push: our pages into the peer's) and ``read_pages`` (pull: the peer's pages into
  ours) check every page id against both pools, then issue one descriptor per run of ids that are
  consecutive on both sides, and return a ``TransferHandle``.
- A handle moves through PENDING -> IN_PROGRESS -> DONE | FAILED | ABORTED | TIMED_OUT. Progress,
  the deadline and the completion notification happen when the handle is polled (``poll`` or
  ``wait``): a caller that never polls never completes.
- ``notify`` is delivered to the peer, as ``(our name, notify)`` from its ``poll_notifications``,
  only after *all* of the transfer's bytes are in the destination pages, and never for a transfer
  that was aborted, timed out or failed. That is the protocol's only proof of delivery: a sender
  frees pages after the receiver's notice (pull) or its own DONE (push), never before.
"""
from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from typing import ClassVar, Sequence

import torch

from kvwire.formats import PageFormat
from transfer._codec import describe
from transfer.handle import Op, TransferHandle, TransferState, TransferStats
from transfer.handshake import Handshake, MemoryType, PoolInfo, TransportKind
from transfer.runs import PageIdError, Run, check_page_ids, page_runs, paired_runs

__all__ = ["Op", "PageIdError", "PeerError", "Run", "TransferError", "TransferHandle", "TransferState",
           "TransferStats", "Transport", "page_runs", "paired_runs"]


class TransferError(RuntimeError):
    """The transport could not do what was asked (closed, not registered, backend refused), or a transfer
    failed. ``quiesced`` False: an aborted transfer may still write into its destination pages for a while
    (``TransferHandle.quiesced``), so the side that owns them must quarantine them, not reuse them."""

    def __init__(self, message: str, quiesced: bool = True) -> None:
        super().__init__(message)
        self.quiesced = quiesced


class PeerError(ValueError):
    """An unknown peer, or one this transport must not talk to (other format, other transport)."""


class Transport(ABC):
    """Moves pages between this worker's registered pool and its peers' pools."""

    kind: ClassVar[TransportKind]

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a transport needs a non-empty agent name, got {name!r}")
        self._name = name
        self._storage: torch.Tensor | None = None
        self._format: PageFormat | None = None
        self._peers: dict[str, PoolInfo] = {}
        # Strong references until terminal: a handle the caller dropped is still drained by close().
        self._live: set[TransferHandle] = set()
        self._leaving: set[str] = set()              # peers remove_peer is draining
        self._closed = False
        self._lock = threading.RLock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def storage(self) -> torch.Tensor:
        """The registered pool tensor."""
        return self._pool()[0]

    @property
    def page_format(self) -> PageFormat:
        return self._pool()[1]

    @property
    def num_pages(self) -> int:
        return self._pool()[0].shape[0]

    @property
    def peers(self) -> dict[str, PoolInfo]:
        return dict(self._peers)

    def register_pool(self, storage: torch.Tensor, page_format: PageFormat) -> None:
        """Register the whole pool, once: ``uint8 [num_pages, page_bytes]``, CPU or CUDA, contiguous."""
        with self._lock:
            self._check_open()
            if self._storage is not None:
                raise TransferError(f"transport {self._name!r} already has a registered pool")
            if not isinstance(storage, torch.Tensor) or storage.dtype != torch.uint8 or storage.dim() != 2:
                got = f"{getattr(storage, 'dtype', type(storage).__name__)} {tuple(getattr(storage, 'shape', ()))}"
                raise ValueError(f"the pool storage must be a uint8 tensor [num_pages, page_bytes], got {got}")
            if storage.shape[0] < 1 or storage.shape[1] != page_format.page_bytes or not storage.is_contiguous():
                raise ValueError(f"the pool storage must be a contiguous [num_pages >= 1, {page_format.page_bytes}] "
                                 f"tensor for format {page_format.name}, got {tuple(storage.shape)}")
            self._register(storage)
            self._storage, self._format = storage, page_format

    def handshake(self) -> Handshake:
        """What a peer needs to reach this pool; valid until close (addresses are raw pointers)."""
        with self._lock:
            self._check_open()
            storage, fmt = self._pool()
            memory = MemoryType.VRAM if storage.is_cuda else MemoryType.DRAM
            pool = PoolInfo(storage.data_ptr(), storage.shape[0], fmt.page_bytes, fmt, memory,
                            storage.device.index or 0)
            return Handshake(self._name, self.kind, self._backend_metadata(), pool)

    def add_peer(self, handshake: Handshake) -> str:
        """Connect to a peer; refuses another transport kind, another page format, or a duplicate."""
        with self._lock:
            self._check_open()
            fmt = self._pool()[1]
            name = handshake.agent_name
            if handshake.transport is not self.kind:
                raise PeerError(f"peer {name!r} speaks {handshake.transport.value}, "
                                f"this transport is {self.kind.value}")
            if name == self._name:
                raise PeerError(f"transport {name!r} cannot add itself as a peer")
            if name in self._peers:
                raise PeerError(f"peer {name!r} is already connected; remove_peer it first to reconnect")
            if handshake.pool.format_hash != fmt.hash:
                raise PeerError(f"refusing peer {name!r}: its pages are {describe(handshake.pool.page_format)}, "
                                f"but this pool's are {describe(fmt)}")
            connected = self._connect(handshake)
            self._peers[connected] = handshake.pool
            return connected

    def remove_peer(self, peer: str) -> None:
        """Disconnect a peer (it died, or hangs). Its live transfers are aborted first, each drained as
        ``abort`` does: dropped under them, they would end FAILED as if stopped while bytes still land."""
        with self._lock:
            self._peer(peer)
            self._leaving.add(peer)     # no new transfer to it from here on (``_peer`` refuses it)
            handles = [h for h in self._live if h.peer == peer and not h.state.terminal]
        try:
            for handle in handles:  # outside our lock, as in close()
                handle.abort()
        finally:
            with self._lock:
                self._leaving.discard(peer)
                if peer in self._peers:
                    self._disconnect(peer)
                    del self._peers[peer]

    def write_pages(self, peer: str, local_pages: Sequence[int], remote_pages: Sequence[int],
                    deadline_s: float, notify: bytes | None = None) -> TransferHandle:
        """Push: WRITE our ``local_pages`` into the peer's ``remote_pages`` (pairwise, in order)."""
        return self._transfer(Op.WRITE, peer, local_pages, remote_pages, deadline_s, notify)

    def read_pages(self, peer: str, remote_pages: Sequence[int], local_pages: Sequence[int],
                   deadline_s: float, notify: bytes | None = None) -> TransferHandle:
        """Pull: READ the peer's ``remote_pages`` into our ``local_pages`` (pairwise, in order)."""
        return self._transfer(Op.READ, peer, local_pages, remote_pages, deadline_s, notify)

    def send_notification(self, peer: str, msg: bytes) -> None:
        """A standalone message, e.g. "pages received" or "request cancelled"."""
        if not isinstance(msg, bytes):
            raise TypeError(f"a notification must be bytes, got {type(msg).__name__}")
        with self._lock:
            self._check_open()
            self._peer(peer)
            self._notify(peer, msg)

    def close(self) -> None:
        """Abort live transfers (draining them), then release the pool and the backend. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # refuses new work from here on
            handles = list(self._live)
        for handle in handles:  # outside our lock: a handle being polled elsewhere holds its own
            handle.abort()
        with self._lock:
            self._shutdown()

    def __repr__(self) -> str:
        pages = self._storage.shape[0] if self._storage is not None else None
        state = "closed" if self._closed else f"pages={pages} peers={sorted(self._peers)}"
        return f"{type(self).__name__}({self._name!r} {state})"

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _transfer(self, op: Op, peer: str, local_pages: Sequence[int], remote_pages: Sequence[int],
                  deadline_s: float, notify: bytes | None) -> TransferHandle:
        with self._lock:
            self._check_open()
            storage, fmt = self._pool()
            pool = self._peer(peer)
            local = check_page_ids(local_pages, storage.shape[0], f"local pages (pool of {self._name!r})")
            remote = check_page_ids(remote_pages, pool.num_pages, f"remote pages (pool of peer {peer!r})")
            if len(local) != len(remote):
                raise PageIdError(f"{len(local)} local pages cannot pair with {len(remote)} remote pages")
            if not isinstance(deadline_s, (int, float)) or not deadline_s >= 0:
                raise ValueError(f"deadline_s must be seconds >= 0 (math.inf for none), got {deadline_s!r}")
            if notify is not None and not isinstance(notify, bytes):
                raise TypeError(f"notify must be bytes or None, got {type(notify).__name__}")
            started = time.monotonic()
            handle = self._issue(op, peer, paired_runs(local, remote), float(deadline_s), notify, started)
            self._live = {h for h in self._live if not h.state.terminal}
            self._live.add(handle)
            return handle

    def _pool(self) -> tuple[torch.Tensor, PageFormat]:
        if self._storage is None or self._format is None:
            raise TransferError(f"transport {self._name!r} has no registered pool: call register_pool first")
        return self._storage, self._format

    def _peer(self, peer: str) -> PoolInfo:
        if peer in self._leaving:
            raise PeerError(f"peer {peer!r} is being removed")
        try:
            return self._peers[peer]
        except KeyError:
            raise PeerError(f"unknown peer {peer!r}; connected peers: {sorted(self._peers) or 'none'}") from None

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError(f"transport {self._name!r} is closed")

    # ---- backend hooks ----
    @abstractmethod
    def _register(self, storage: torch.Tensor) -> None: ...

    @abstractmethod
    def _backend_metadata(self) -> bytes: ...

    @abstractmethod
    def _connect(self, handshake: Handshake) -> str:
        """Connect and return the peer's name as the backend knows it."""

    @abstractmethod
    def _disconnect(self, peer: str) -> None: ...

    @abstractmethod
    def _issue(self, op: Op, peer: str, runs: list[Run], deadline_s: float, notify: bytes | None,
               started: float) -> TransferHandle:
        """Post the transfer; the handle's clock and deadline run from ``started``."""

    @abstractmethod
    def _notify(self, peer: str, msg: bytes) -> None: ...

    @abstractmethod
    def poll_notifications(self) -> list[tuple[str, bytes]]:
        """Notifications received since the last call, as ``(sender name, message)``."""

    @abstractmethod
    def _shutdown(self) -> None: ...
