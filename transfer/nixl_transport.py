"""NIXL (UCX backend) transport: DRAM pools on CPU, VRAM pools on CUDA tensors.

The whole pool is registered once, so the handshake's agent metadata covers every page and a
transfer is just a list of (address, length) descriptors, one per run of pages that are
consecutive on both sides. WRITE is push, READ is pull.

Notifications are sent by us with ``send_notif`` once NIXL reports the request DONE, instead of
being attached to the request. NIXL would send an attached one at the same moment (when the
initiator polls a completed request), but it may also send it inside ``transfer()`` when the data
moved synchronously -- before an abort could suppress it. Sending it ourselves keeps one rule: a
notification means all bytes landed and the transfer was not aborted.

UCX cannot cancel RMA operations already handed to a transport (``ucp_request_cancel`` does not
apply to them; releasing the request just stops *reporting* them). So abort drains: it waits,
with backoff sleeps, for the request to finish (bounded by ``abort_grace_s``) before releasing it.

NIXL's UCX progress thread (it completes transfers on transports that need the passive side to
progress, TCP above all) sleeps in ``poll()`` on the UCX workers' event fds with a timeout of the
agent's ``pthrDelay``. NIXL's Python wrapper hard-codes that to 0, which makes the thread spin: a
whole core per agent while idle (on a 2-core CPU host two idle agents took 195% CPU; with 1 ms,
3%: docs/benchmarks.md). So the agent is built with ``progress_delay_us`` (``_new_agent``); a
transfer still wakes the thread at once through the event fds, the delay only bounds how late it
can notice one without them.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

import numpy as np
import torch

from transfer.base import PeerError, TransferError, Transport
from transfer.handle import Op, TransferHandle, TransferState
from transfer.handshake import Handshake, MemoryType, TransportKind
from transfer.runs import Run

log = logging.getLogger(__name__)

_BACKEND = "UCX"
_UNKNOWN = "UNKNOWN"   # check()'s answer, with the reason after it, when NIXL could not say where a request is
# What NIXL raises (its binding throws on an error status) when a request has ended with an error: the
# backend failed it, or the peer's endpoint failed, which flushes its operations. Anything else (the peer's
# metadata gone, an unknown error) leaves the request's state unknown.
_ENDED_ERRORS = ("nixlBackendError", "nixlRemoteDisconnectError", "nixlCancelledError")


def _import_nixl() -> Any:
    try:
        from nixl import _api
    except ImportError as exc:
        raise ImportError(
            f"the NIXL transport needs nixl ({exc}): pip install nixl-cu12==1.5.1 (nixl-cu13 with a "
            "CUDA 13 torch) && pip install --no-deps nixl==1.5.1 (plain `pip install nixl` pulls a CUDA "
            "torch); or use make_transport('inprocess', ...) for single-process runs") from exc
    return _api


def _new_agent(api: Any, name: str, progress_delay_us: int) -> tuple[Any, int]:
    """A ``nixl_agent`` (no backend yet) whose progress thread sleeps ``progress_delay_us`` between
    polls instead of NIXL's 0 (a spin). ``nixl_agent`` gives its C++ agent no way to set the delay,
    and with no backends it uses that agent only to list plugins, so it gets a new one, configured
    as ``nixl_agent_config(backends=[])`` configures it but for the delay, before any backend is
    created. Where this NIXL's wrapper lacks what that needs, the agent is kept as NIXL made it,
    with a warning. Returns the agent and the delay in effect (0: NIXL's spin)."""
    agent = api.nixl_agent(name, api.nixl_agent_config(backends=[]))
    bind = getattr(api, "nixlBind", None)
    try:
        if not hasattr(agent, "agent"):
            raise AttributeError("nixl_agent keeps no C++ agent in .agent")
        config = bind.nixlAgentConfig()
        config.useProgThread = True
        config.useListenThread = False
        config.syncMode = api.nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE.value
        config.pthrDelay = progress_delay_us
        config.lthrDelay = 100000
        config.captureTelemetry = False
        replacement = bind.nixlAgent(name, config)
    except Exception as exc:
        log.warning("NIXL agent %r keeps NIXL's progress-thread delay of 0 (the thread spins on a "
                    "core): this nixl cannot set it (%s)", name, exc)
        return agent, 0
    agent.agent = replacement
    return agent, progress_delay_us


class NixlHandle(TransferHandle):
    def __init__(self, transport: "NixlTransport", op: Op, peer: str, runs: list[Run], xfer: Any,
                 deadline_s: float, notify: bytes | None, started: float) -> None:
        super().__init__(op, peer, runs, transport.page_format, deadline_s, started,
                         TransferState.PENDING if xfer is None else TransferState.IN_PROGRESS)
        self._transport = transport
        self._xfer = xfer            # None for an empty transfer
        self._notify_msg = notify

    def _progress(self) -> TransferState:
        if self._xfer is not None:
            status = self._transport.check(self._xfer)
            if status == "PROC":
                return TransferState.IN_PROGRESS
            self._release()
            if status != "DONE":
                self.error = f"NIXL reported {status} for {self.op.value} with peer {self.peer!r}"
                self._quiesced = not status.startswith(_UNKNOWN)
                return TransferState.FAILED
        if self._notify_msg is not None:
            self._transport.notify_peer(self.peer, self._notify_msg)
        return TransferState.DONE

    def _cancel(self) -> bool:
        if self._xfer is None:
            return True
        end = time.monotonic() + self._transport.abort_grace_s
        delay = 50e-6
        status = self._transport.check(self._xfer)
        while status == "PROC" and time.monotonic() < end:
            time.sleep(delay)
            delay = min(delay * 2, 2e-3)
            status = self._transport.check(self._xfer)
        if status == "PROC":
            log.warning("abort of %s gave up after %.1fs with the request still in flight; its pages "
                        "must not be reused", self, self._transport.abort_grace_s)
        self._release()
        return status != "PROC" and not status.startswith(_UNKNOWN)

    def _release(self) -> None:
        xfer, self._xfer = self._xfer, None
        if xfer is not None:
            self._transport.release(xfer)


class NixlTransport(Transport):
    """``ucx_config``: UCX settings without the ``UCX_`` prefix, e.g. ``{"TLS": "tcp"}`` to force
    TCP (values must not contain commas: NIXL splits the list on them). ``progress_delay_us``: the
    longest the progress thread sleeps between polls when no event wakes it (module docstring);
    the attribute of that name is the delay in effect (0 where this NIXL could not set it)."""

    kind = TransportKind.NIXL

    def __init__(self, name: str, *, ucx_config: Mapping[str, str] | None = None,
                 abort_grace_s: float = 5.0, progress_delay_us: int = 1000) -> None:
        super().__init__(name)
        if not isinstance(progress_delay_us, int) or not 1 <= progress_delay_us <= 1_000_000:
            raise ValueError(f"progress_delay_us must be an int from 1 to 1000000 (1 s), "
                             f"not {progress_delay_us!r}: 0 makes NIXL's progress thread spin")
        api = _import_nixl()
        params: dict[str, str] = {}
        if ucx_config:
            bad = {k: v for k, v in ucx_config.items() if "," in f"{k}{v}" or "=" in f"{k}{v}"}
            if bad:
                raise ValueError(f"ucx_config keys and values cannot contain ',' or '=': {bad}")
            params["engine_config"] = ",".join(f"{k}={v}" for k, v in ucx_config.items())
        self.abort_grace_s = abort_grace_s
        self._agent, self.progress_delay_us = _new_agent(api, name, progress_delay_us)
        try:
            self._agent.create_backend(_BACKEND, params)
        except Exception as exc:
            raise TransferError(f"NIXL could not start its {_BACKEND} backend for {name!r} "
                                f"(params {params}): {exc}") from exc
        self._reg: Any = None
        self._memory = MemoryType.DRAM

    # ---- used by NixlHandle ----
    def check(self, xfer: Any) -> str:
        """"DONE", "PROC", "ERR[: why]" (ended with an error), or "UNKNOWN: why" when NIXL could not say
        where the request is (e.g. its peer's metadata was dropped): it may still be moving bytes, so it
        is dead to us but not quiesced."""
        with self._lock:
            try:
                return self._agent.check_xfer_state(xfer)
            except Exception as exc:
                kind = type(exc).__name__
                log.warning("NIXL state check of %r raised %s: %s", xfer, kind, exc)
                return f"{'ERR' if kind in _ENDED_ERRORS else _UNKNOWN}: {kind}: {exc}"

    def release(self, xfer: Any) -> None:
        with self._lock:
            try:
                self._agent.release_xfer_handle(xfer)
            except Exception as exc:  # a drained request should release; never mask the caller's state
                log.error("NIXL release of %r failed: %s", xfer, exc)

    def notify_peer(self, peer: str, msg: bytes) -> None:
        with self._lock:
            self._agent.send_notif(peer, msg)

    # ---- Transport ----
    def poll_notifications(self) -> list[tuple[str, bytes]]:
        with self._lock:
            self._check_open()
            notifs = self._agent.get_new_notifs()
        return [(peer, msg) for peer, msgs in notifs.items() for msg in msgs]

    def _register(self, storage: torch.Tensor) -> None:
        self._memory = MemoryType.VRAM if storage.is_cuda else MemoryType.DRAM
        try:
            self._reg = self._agent.register_memory(storage, backends=[_BACKEND])
        except Exception as exc:
            raise TransferError(f"NIXL could not register the {self._memory.value} pool of "
                                f"{self._name!r}: {exc}") from exc

    def _backend_metadata(self) -> bytes:
        return self._agent.get_agent_metadata()  # taken after registration: it carries the pool's keys

    def _connect(self, handshake: Handshake) -> str:
        try:
            name = self._agent.add_remote_agent(handshake.backend_metadata)
        except Exception as exc:
            raise PeerError(f"NIXL could not load the metadata of peer {handshake.agent_name!r}: {exc}") from exc
        name = name.decode() if isinstance(name, bytes) else name
        if name != handshake.agent_name:
            if name not in self._peers:   # never drop a connected peer's metadata for a bad handshake
                self._agent.remove_remote_agent(name)
            raise PeerError(f"handshake names agent {handshake.agent_name!r} "
                            f"but its NIXL metadata is agent {name!r}")
        return name

    def _disconnect(self, peer: str) -> None:
        self._agent.remove_remote_agent(peer)

    def _issue(self, op: Op, peer: str, runs: list[Run], deadline_s: float, notify: bytes | None,
               started: float) -> TransferHandle:
        if not runs:
            return NixlHandle(self, op, peer, runs, None, deadline_s, notify, started)
        storage, fmt = self._pool()
        pool = self._peers[peer]
        size = fmt.page_bytes
        local_dev = storage.device.index or 0
        local = np.array([(storage.data_ptr() + r.local_first * size, r.count * size, local_dev) for r in runs],
                         dtype=np.uint64)
        remote = np.array([(pool.page_address(r.remote_first), r.count * size, pool.device_id) for r in runs],
                          dtype=np.uint64)
        xfer = None
        try:
            xfer = self._agent.initialize_xfer(op.value, self._agent.get_xfer_descs(local, self._memory.value),
                                               self._agent.get_xfer_descs(remote, pool.memory_type.value), peer,
                                               backends=[_BACKEND])
            status = self._agent.transfer(xfer)
        except Exception as exc:
            status = f"{type(exc).__name__}: {exc}"
        if status not in ("DONE", "PROC"):
            if xfer is not None:
                self.release(xfer)
            raise TransferError(f"NIXL could not post the {op.value} of {len(runs)} descriptors "
                                f"to {peer!r}: {status}")
        return NixlHandle(self, op, peer, runs, xfer, deadline_s, notify, started)

    def _notify(self, peer: str, msg: bytes) -> None:
        self.notify_peer(peer, msg)

    def _shutdown(self) -> None:
        for peer in list(self._peers):
            try:
                self._agent.remove_remote_agent(peer)
            except Exception as exc:
                log.warning("NIXL could not drop peer %r: %s", peer, exc)
        self._peers.clear()
        if self._reg is not None:
            self._agent.deregister_memory(self._reg, backends=[_BACKEND])
            self._reg = None
        self._agent = None
