"""Moving compact KV pages between workers: transports, the manifest codec and the handshake.

``make_transport("nixl" | "inprocess", name)`` gives a Transport; see ``transfer.base`` for the
model (states, deadlines, aborts, notifications). NIXL is imported only when a NIXL transport is
made, so this package works without it.
"""
from __future__ import annotations

from transfer.base import PeerError, TransferError, Transport
from transfer.handle import Op, TransferHandle, TransferState, TransferStats
from transfer.handshake import (HANDSHAKE_VERSION, Handshake, HandshakeError, MemoryType, PoolInfo,
                                TransportKind, decode_handshake)
from transfer.inprocess import InProcessTransport
from transfer.manifest import MANIFEST_VERSION, Manifest, ManifestError, decode_manifest
from transfer.runs import PageIdError, Run, check_page_ids, page_runs, paired_runs

__all__ = [
    "HANDSHAKE_VERSION", "MANIFEST_VERSION", "Handshake", "HandshakeError", "InProcessTransport", "Manifest",
    "ManifestError", "MemoryType", "Op", "PageIdError", "PeerError", "PoolInfo", "Run", "TransferError",
    "TransferHandle", "TransferState", "TransferStats", "Transport", "TransportKind", "check_page_ids",
    "decode_handshake", "decode_manifest", "make_transport", "page_runs", "paired_runs",
]


def make_transport(kind: str, name: str, **options: object) -> Transport:
    """A transport of ``kind`` ("nixl" or "inprocess") for the agent ``name``.

    ``options`` go to the transport's constructor (NIXL: ``ucx_config``, ``abort_grace_s``,
    ``progress_delay_us``).
    """
    try:
        transport_kind = TransportKind(kind)
    except ValueError:
        raise ValueError(f"unknown transport kind {kind!r}; use one of "
                         f"{', '.join(k.value for k in TransportKind)}") from None
    if transport_kind is TransportKind.INPROCESS:
        return InProcessTransport(name, **options)
    from transfer.nixl_transport import NixlTransport
    return NixlTransport(name, **options)
