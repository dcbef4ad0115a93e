"""A transport between pools in one process: same interface and semantics as NIXL, no network.

Serves single-process runs (prefill and decode workers in one Python process) and tests. Peers
find each other in a process-wide registry keyed by agent name; the handshake carries the pid, so
a handshake from another process is refused rather than silently resolved to a local namesake.

A transfer is one ``copy_`` per run, done on the first poll (not at issue), so an abort or a
deadline that comes first leaves the destination untouched, as a slow network would.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections import deque

import torch

from transfer.base import PeerError, TransferError, Transport
from transfer.handle import Op, TransferHandle, TransferState
from transfer.handshake import Handshake, TransportKind
from transfer.runs import Run

_registry: "weakref.WeakValueDictionary[str, InProcessTransport]" = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


class InProcessHandle(TransferHandle):
    def __init__(self, transport: "InProcessTransport", peer: "InProcessTransport", op: Op,
                 runs: list[Run], deadline_s: float, notify: bytes | None, started: float) -> None:
        super().__init__(op, peer.name, runs, transport.page_format, deadline_s, started)
        self._transport = transport
        self._target = peer
        self._notify_msg = notify

    def _progress(self) -> TransferState:
        if self._target.closed:
            self.error = f"peer {self.peer!r} closed before the transfer ran"
            return TransferState.FAILED
        local, remote = self._transport.storage, self._target.storage
        for run in self.runs:
            mine = local[run.local_first:run.local_first + run.count]
            theirs = remote[run.remote_first:run.remote_first + run.count]
            if self.op is Op.WRITE:
                theirs.copy_(mine)
            else:
                mine.copy_(theirs)
        if self._notify_msg is not None:
            self._target.deliver(self._transport.name, self._notify_msg)
        return TransferState.DONE

    def _cancel(self) -> bool:
        return True  # nothing runs between polls


class InProcessTransport(Transport):
    kind = TransportKind.INPROCESS

    def __init__(self, name: str) -> None:
        super().__init__(name)
        with _registry_lock:
            if name in _registry:
                raise PeerError(f"an in-process transport named {name!r} already exists in this process")
            _registry[name] = self
        self._inbox: deque[tuple[str, bytes]] = deque()
        self._connected: dict[str, InProcessTransport] = {}

    @property
    def closed(self) -> bool:
        return self._closed

    def deliver(self, sender: str, msg: bytes) -> None:
        """Called by a peer in this process; deque appends are thread-safe."""
        self._inbox.append((sender, msg))

    def poll_notifications(self) -> list[tuple[str, bytes]]:
        out = []
        while self._inbox:
            out.append(self._inbox.popleft())
        return out

    def _register(self, storage: torch.Tensor) -> None:
        pass

    def _backend_metadata(self) -> bytes:
        return str(os.getpid()).encode()

    def _connect(self, handshake: Handshake) -> str:
        if handshake.backend_metadata != self._backend_metadata():
            raise PeerError(f"peer {handshake.agent_name!r} lives in process {handshake.backend_metadata.decode()!r}, "
                            f"not this one ({os.getpid()}): the in-process transport cannot reach it")
        with _registry_lock:
            peer = _registry.get(handshake.agent_name)
        if peer is None or peer.closed:
            raise PeerError(f"no open in-process transport named {handshake.agent_name!r} in this process")
        if peer.storage.data_ptr() != handshake.pool.base_address:
            raise PeerError(f"peer {handshake.agent_name!r} re-registered its pool since this handshake was made")
        self._connected[peer.name] = peer
        return peer.name

    def _disconnect(self, peer: str) -> None:
        self._connected.pop(peer, None)

    def _issue(self, op: Op, peer: str, runs: list[Run], deadline_s: float, notify: bytes | None,
               started: float) -> TransferHandle:
        target = self._connected[peer]
        if target.closed:
            raise TransferError(f"peer {peer!r} is closed")
        return InProcessHandle(self, target, op, runs, deadline_s, notify, started)

    def _notify(self, peer: str, msg: bytes) -> None:
        target = self._connected[peer]
        if target.closed:
            raise TransferError(f"peer {peer!r} is closed")
        target.deliver(self._name, msg)

    def _shutdown(self) -> None:
        self._connected.clear()
        with _registry_lock:
            if _registry.get(self._name) is self:
                del _registry[self._name]
