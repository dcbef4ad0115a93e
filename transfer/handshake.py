"""The handshake: what one transfer agent tells a peer so the peer can address its page pool.

It is exchanged once per peer pair (through Ray, the router, or any side channel) before pages
move. It carries the backend's connection metadata (for NIXL: the agent metadata blob, which holds
the pool's registration) and a description of the pool: where it starts, how many pages of how
many bytes, in which memory, and the page format with its hash, so a peer whose pages this side
cannot read is refused at connection time rather than at the first garbled attention.

Wire form: a msgpack map with an explicit ``version``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from kvwire.formats import PageFormat
from transfer._codec import check_keys, check_version, format_from_wire, pack, take, take_enum, unpack

HANDSHAKE_VERSION = 1
_WHAT = "handshake"
_FIELDS = {"version", "agent_name", "transport", "backend_metadata", "pool"}
_POOL_FIELDS = {"base_address", "num_pages", "page_bytes", "page_format", "format_hash", "memory_type", "device_id"}


class HandshakeError(ValueError):
    """A malformed handshake blob; the message says which field and what was expected."""


class TransportKind(enum.Enum):
    NIXL = "nixl"
    INPROCESS = "inprocess"


class MemoryType(enum.Enum):
    """Where a pool lives; the names are NIXL's segment types."""

    DRAM = "DRAM"
    VRAM = "VRAM"


@dataclass(frozen=True)
class PoolInfo:
    """A registered page pool as a peer sees it: enough to compute any page's address."""

    base_address: int
    num_pages: int
    page_bytes: int
    page_format: PageFormat
    memory_type: MemoryType
    device_id: int

    def __post_init__(self) -> None:
        for name in ("base_address", "num_pages", "page_bytes", "device_id"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 0:
                raise HandshakeError(f"pool {name} must be a non-negative integer, got {getattr(self, name)!r}")
        if self.num_pages < 1:
            raise HandshakeError("pool num_pages must be at least 1")
        if self.page_bytes != self.page_format.page_bytes:
            raise HandshakeError(f"pool page_bytes {self.page_bytes} does not match its format "
                                 f"{self.page_format.name}, whose pages are {self.page_format.page_bytes} bytes")

    @property
    def format_hash(self) -> str:
        return self.page_format.hash

    def page_address(self, page: int) -> int:
        return self.base_address + page * self.page_bytes

    def to_wire(self) -> dict:
        return {"base_address": self.base_address, "num_pages": self.num_pages, "page_bytes": self.page_bytes,
                "page_format": self.page_format.to_dict(), "format_hash": self.format_hash,
                "memory_type": self.memory_type.value, "device_id": self.device_id}

    @classmethod
    def from_wire(cls, d: dict) -> "PoolInfo":
        what = "handshake pool"
        check_keys(d, _POOL_FIELDS, what, HandshakeError)
        memory_type = take_enum(d, "memory_type", MemoryType, what, HandshakeError)
        fmt = format_from_wire(take(d, "page_format", dict, what, HandshakeError),
                               take(d, "format_hash", str, what, HandshakeError), what, HandshakeError)
        return cls(take(d, "base_address", int, what, HandshakeError), take(d, "num_pages", int, what, HandshakeError),
                   take(d, "page_bytes", int, what, HandshakeError), fmt, memory_type,
                   take(d, "device_id", int, what, HandshakeError))


@dataclass(frozen=True)
class Handshake:
    agent_name: str
    transport: TransportKind
    backend_metadata: bytes
    pool: PoolInfo
    version: int = HANDSHAKE_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.agent_name, str) or not self.agent_name:
            raise HandshakeError(f"agent_name must be a non-empty string, got {self.agent_name!r}")
        if not isinstance(self.transport, TransportKind):
            raise HandshakeError(f"transport must be a TransportKind, got {self.transport!r}")

    def encode(self) -> bytes:
        return pack({"version": self.version, "agent_name": self.agent_name, "transport": self.transport.value,
                     "backend_metadata": self.backend_metadata, "pool": self.pool.to_wire()})


def decode_handshake(blob: bytes) -> Handshake:
    """Parse and validate a handshake; raises HandshakeError naming the bad field."""
    payload = unpack(blob, _WHAT, HandshakeError)
    check_version(payload, HANDSHAKE_VERSION, _WHAT, HandshakeError)
    check_keys(payload, _FIELDS, _WHAT, HandshakeError)
    transport = take_enum(payload, "transport", TransportKind, _WHAT, HandshakeError)
    return Handshake(take(payload, "agent_name", str, _WHAT, HandshakeError), transport,
                     take(payload, "backend_metadata", bytes, _WHAT, HandshakeError),
                     PoolInfo.from_wire(take(payload, "pool", dict, _WHAT, HandshakeError)))
