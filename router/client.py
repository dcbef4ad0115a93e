"""A Python client for the router (the generated stub, wrapped for the common calls).

    with RouterClient("127.0.0.1:50051") as client:
        done = client.complete("The capital of France is", max_tokens=16, kv_format="nvfp4")
        print(done.text, done.finished.wire_bytes)

Errors come back as ``grpc.RpcError`` with the router's status code and message; a value the
request message cannot carry (a negative max_tokens or seed, say) raises ValueError before sending.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import grpc

from router.api import router_pb2 as pb
from router.api import router_pb2_grpc as pb_grpc

MAX_TOKENS_LIMIT = 2**32 - 1      # max_tokens is a uint32 on the wire
SEED_LIMIT = 2**64 - 1            # seed is a uint64


@dataclass
class Completion:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: pb.Finished | None = None


class RouterClient:
    def __init__(self, target: str, timeout_s: float | None = 600.0) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target)
        self._stub = pb_grpc.RouterStub(self._channel)

    def __enter__(self) -> "RouterClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the channel connects (raises grpc.FutureTimeoutError otherwise)."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout_s)

    @staticmethod
    def request(prompt: str | None = None, prompt_ids: list[int] | None = None, *, kv_format: str = "",
                pool: str = "", max_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                seed: int | None = None, chat: bool = False, request_id: str = "",
                ignore_eos: bool = False) -> pb.GenerateRequest:
        """The request message. max_tokens must be at least 1: on the wire 0 means the router's default
        (64), which leaving max_tokens out already gives here, so an explicit 0 is a mistake, refused."""
        _check_range("max_tokens", max_tokens, 1, MAX_TOKENS_LIMIT)
        if seed is not None:
            _check_range("seed", seed, 0, SEED_LIMIT)
        req = pb.GenerateRequest(prompt=prompt or "", prompt_ids=list(prompt_ids or []), kv_format=kv_format,
                                 pool=pool, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                 chat=chat, request_id=request_id, ignore_eos=ignore_eos)
        if seed is not None:
            req.seed = seed
        return req

    def generate(self, prompt: str | None = None, prompt_ids: list[int] | None = None,
                 timeout_s: float | None = None, **kwargs) -> Iterator[pb.GenerateResponse]:
        """The raw stream: TokenDelta events, then one Finished. Cancel it with ``.cancel()``."""
        return self._stub.Generate(self.request(prompt, prompt_ids, **kwargs),
                                   timeout=timeout_s if timeout_s is not None else self.timeout_s)

    def complete(self, prompt: str | None = None, prompt_ids: list[int] | None = None,
                 timeout_s: float | None = None, **kwargs) -> Completion:
        """Run a request to the end and collect its tokens, text and final stats."""
        out = Completion()
        for event in self.generate(prompt, prompt_ids, timeout_s, **kwargs):
            if event.HasField("delta"):
                out.token_ids.extend(event.delta.token_ids)
                out.text += event.delta.text
            else:
                out.finished = event.finished
        return out

    def list_pools(self, timeout_s: float = 30.0) -> pb.ListPoolsResponse:
        return self._stub.ListPools(pb.ListPoolsRequest(), timeout=timeout_s)

    def stats(self, timeout_s: float = 30.0) -> pb.StatsResponse:
        return self._stub.Stats(pb.StatsRequest(), timeout=timeout_s)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    """Name the field and its range; protobuf alone raises a bare "Value out of range: -1"."""
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
