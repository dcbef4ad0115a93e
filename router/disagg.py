"""Drive one request through a prefill worker and a decode worker (Ray actor handles).

prefill -> manifest -> the decode worker reserves pages -> push: the prefill worker WRITEs
into them and frees its own (pull: the decode worker READs them and its notice frees them on
the prefill side) -> tokens stream from the decode worker. Any failure frees what each side holds.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterator

import ray

from kvwire.sampling import SamplingParams


class RequestFailed(RuntimeError):
    """The request ended with an error on a worker (dead actor, failed transfer, failed step)."""


class TransferMode(enum.Enum):
    """Push (prefill WRITEs into pages decode reserved) is the default: without RDMA, pulls ran
    0.35 vs 0.8 GB/s over TCP here and 0.47 vs 171 GB/s VRAM-to-VRAM on the H200 (transfer/bench.py)."""

    PUSH = "push"
    PULL = "pull"


@dataclass(frozen=True)
class Pair:
    """A connected prefill and decode actor; ``decode_agent`` is the push target's agent name."""

    prefill: Any
    decode: Any
    decode_agent: str


def connect(prefill, decode) -> Pair:
    """Exchange transfer handshakes between a prefill and a decode actor."""
    p_hs, d_hs = ray.get([prefill.handshake.remote(), decode.handshake.remote()])
    decode_agent, _ = ray.get([prefill.add_peer.remote(d_hs), decode.add_peer.remote(p_hs)])
    return Pair(prefill, decode, decode_agent)


def _admit(pair: Pair, request_id: str, manifest: bytes, params: SamplingParams,
           mode: TransferMode, report: dict | None) -> None:
    prefill, decode = pair.prefill, pair.decode
    if mode is TransferMode.PULL:
        if not ray.get(prefill.claim.remote(request_id)):      # expired: its pages may be another's now
            raise RequestFailed(f"{request_id}: the prefill worker no longer holds its pages (hold expired)")
        ray.get(decode.admit.remote(manifest, params))
        return
    pages = ray.get(decode.reserve.remote(manifest, params))["pages"]
    try:
        stats = ray.get(prefill.push.remote(request_id, pair.decode_agent, pages))
    except BaseException:
        ray.get(decode.cancel.remote(request_id))
        raise
    if report is not None:
        report.update(stats, manifest_bytes=len(manifest))
    ray.get(decode.activate.remote(request_id))


def generate(pair: Pair, request_id: str, prompt_ids: list[int], params: SamplingParams,
             mode: TransferMode = TransferMode.PUSH, poll_s: float = 1.0,
             report: dict | None = None) -> Iterator[int]:
    """Yield the request's tokens; closing the iterator aborts the request on the decode side.

    ``report`` receives a push's transfer stats (compact and bf16-equivalent bytes, descriptors).
    """
    prefill, decode = pair.prefill, pair.decode
    try:
        manifest = ray.get(prefill.prefill.remote(request_id, prompt_ids, params))
    except ray.exceptions.RayActorError as exc:
        raise RequestFailed(f"prefill worker died during {request_id}: {exc}") from exc
    try:
        _admit(pair, request_id, manifest, params, mode, report)
    except BaseException:
        try:
            ray.get(prefill.release.remote(request_id))
        except ray.exceptions.RayActorError:
            pass  # a dead prefill worker holds nothing any more
        raise
    finished = False
    try:
        while True:
            batch = ray.get(decode.next_tokens.remote(request_id, poll_s))
            yield from batch.tokens
            if batch.finished:
                finished = True
                if batch.finished.startswith("error"):
                    raise RequestFailed(f"{request_id}: {batch.finished}")
                return
    finally:
        if not finished:
            try:
                ray.get(decode.abort.remote(request_id))
            except ray.exceptions.RayActorError:
                pass
