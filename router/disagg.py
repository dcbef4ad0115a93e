"""Drive one request through a prefill worker and a decode worker (Ray actor handles).

prefill -> manifest -> decode admits (pulls the pages; its notice frees them on the prefill
side) -> tokens stream from the decode worker. Any failure frees what each side holds.
"""
from __future__ import annotations

from typing import Iterator

import ray

from kvwire.sampling import SamplingParams


class RequestFailed(RuntimeError):
    """The request ended with an error on a worker (dead actor, failed transfer, failed step)."""


def connect(prefill, decode) -> None:
    """Exchange transfer handshakes between a prefill and a decode actor."""
    p_hs, d_hs = ray.get([prefill.handshake.remote(), decode.handshake.remote()])
    ray.get([prefill.add_peer.remote(d_hs), decode.add_peer.remote(p_hs)])


def generate(prefill, decode, request_id: str, prompt_ids: list[int], params: SamplingParams,
             poll_s: float = 1.0) -> Iterator[int]:
    """Yield the request's tokens; closing the iterator aborts the request on the decode side."""
    try:
        manifest = ray.get(prefill.prefill.remote(request_id, prompt_ids, params))
    except ray.exceptions.RayActorError as exc:
        raise RequestFailed(f"prefill worker died during {request_id}: {exc}") from exc
    try:
        ray.get(decode.admit.remote(manifest, params))
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
