"""A Ray actor holding real NIXL transports, for the cross-process tests and the benchmark.

Each actor keeps two agents: one on UCX's default transports (shared memory on one host) and one
forced onto TCP, where transfers are asynchronous and can be caught in flight. Everything crosses
the actor boundary as plain data (msgpack blobs, lists, bytes).
"""
from __future__ import annotations

import os

import torch

from kvwire.formats import PageFormat
from tests.transfer.pools import notifications
from transfer import decode_handshake
from transfer.nixl_transport import NixlTransport

UCX = {"default": None, "tcp": {"TLS": "tcp"}}


class PoolPeer:
    def __init__(self, name: str, formats: dict[str, dict], num_pages: dict[str, int], seed: int) -> None:
        self.transports: dict[str, NixlTransport] = {}
        for link, fmt_dict in formats.items():
            fmt = PageFormat.from_dict(fmt_dict)
            gen = torch.Generator().manual_seed(seed)
            pool = torch.randint(0, 256, (num_pages[link], fmt.page_bytes), dtype=torch.uint8, generator=gen)
            t = NixlTransport(f"{name}-{link}", ucx_config=UCX[link])
            t.register_pool(pool, fmt)
            self.transports[link] = t

    def handshake(self, link: str) -> bytes:
        return self.transports[link].handshake().encode()

    def add_peer(self, link: str, blob: bytes) -> str:
        return self.transports[link].add_peer(decode_handshake(blob))

    def try_add_peer(self, link: str, blob: bytes) -> str:
        """The refusal message, or "" if the peer was accepted."""
        try:
            self.transports[link].add_peer(decode_handshake(blob))
        except ValueError as exc:
            return f"{type(exc).__name__}: {exc}"
        return ""

    def transfer(self, link: str, op: str, peer: str, local: list[int], remote: list[int], deadline_s: float,
                 notify: bytes | None, abort_at_once: bool = False) -> dict:
        t = self.transports[link]
        issue = t.write_pages if op == "WRITE" else t.read_pages
        args = (peer, local, remote) if op == "WRITE" else (peer, remote, local)
        try:
            h = issue(*args, deadline_s=deadline_s, notify=notify)
        except ValueError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        in_flight = t.check(h._xfer) == "PROC" if h._xfer is not None else False
        state = h.abort() if abort_at_once else h.wait(60)
        s = h.stats
        return {"state": state.value, "in_flight": in_flight, "quiesced": h.quiesced, "seconds": s.seconds,
                "compact_bytes": s.compact_bytes, "bf16_bytes": s.bf16_bytes, "descriptors": s.num_descriptors}

    def pages(self, link: str, ids: list[int]) -> bytes:
        return self.transports[link].storage[ids].numpy().tobytes()

    def notifications(self, link: str, want: int, timeout: float) -> list[tuple[str, bytes]]:
        return notifications(self.transports[link], want, timeout)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        for t in self.transports.values():
            t.close()
