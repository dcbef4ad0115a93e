"""The sweep as a Ray job: for each format in turn, start a router with one pool of that format
on the cluster (prefill and decode workers as Ray actors, pages over NIXL), run its cells through
the gRPC client, stop it.

One pool at a time keeps the cluster's footprint to one prefill and one decode worker whatever
the number of formats (a dozen pools at once would hold two dozen model copies), and a fresh
pool per format means the first question of each haystack is really cold.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from kvwire.validate.backends import Answer, BackendError, RouterBackend
from kvwire.validate.probe import ProbeResult


@dataclass(frozen=True)
class PoolTemplate:
    """The pool settings the sweep gives every format's pool."""

    model: str = "smollm2"
    page_size: int = 16
    chunk_size: int = 512
    transport: str = "nixl"
    device: str = "auto"
    num_pages: int | None = None
    prefill_resource: str | None = None   # custom Ray resources pinning the roles to node groups
    decode_resource: str | None = None    # (the KubeRay RayJob's prefill / decode worker groups)


class RayRouterBackend:
    supports_cold = False
    supports_probe = False

    def __init__(self, ray_address: str | None, template: PoolTemplate, bytes_per_token) -> None:
        self.ray_address = ray_address
        self.template = template
        self._bytes_per_token = bytes_per_token     # fmt -> float, from the model config (no pool needed)
        self.description = f"router + Ray pools (cluster {ray_address or 'local'}, transport {template.transport})"
        self._running = None
        self._inner: RouterBackend | None = None

    def open_format(self, fmt: str) -> None:
        from router.config import PoolConfig, RouterConfig, ServeConfig
        from router.serve import StartError, start_router

        self.close_format(fmt)
        t = self.template
        name = "validate-" + fmt.replace("/", "-")
        pool = PoolConfig(name, model=t.model, kv_format=fmt, page_size=t.page_size, chunk_size=t.chunk_size,
                          transport=t.transport, device=t.device, num_pages=t.num_pages,
                          prefill_resource=t.prefill_resource, decode_resource=t.decode_resource)
        config = ServeConfig(router=RouterConfig(port=0, metrics_port=0, default_pool=name), pools=(pool,))
        try:
            self._running = start_router(config, ray_address=self.ray_address, progress=_say)
        except StartError as exc:
            raise BackendError(str(exc)) from exc
        self._inner = RouterBackend(self._running.target)
        self._inner.open_format(fmt)

    def close_format(self, fmt: str) -> None:
        if self._inner is not None:
            self._inner.close()
            self._inner = None
        if self._running is not None:
            self._running.stop()
            self._running = None

    def bytes_per_token(self, fmt: str) -> float:
        return self._bytes_per_token(fmt)

    def complete(self, fmt: str, prompt_ids: list[int], max_tokens: int,
                 probe: list[int] | None = None) -> tuple[Answer, ProbeResult | None]:
        if self._inner is None:
            raise BackendError(f"format {fmt} is not open")
        return self._inner.complete(fmt, prompt_ids, max_tokens, probe)

    def complete_cold(self, fmt: str, prompt_ids: list[int], max_tokens: int) -> Answer:
        raise BackendError("a running router cannot forget its prefix cache; only first asks are cold")

    def close(self) -> None:
        self.close_format("")


def _say(message: str) -> None:
    """Start-up progress (a job's log otherwise shows nothing while workers load, or wait for a node)."""
    print(f"[kvwire validate] {message}", file=sys.stderr, flush=True)
