"""The router's Prometheus metrics (text format at http://HOST:METRICS_PORT/metrics).

Each router has its own registry, so two routers in one process (tests) do not collide.
Names: kvwire_ttft_seconds, kvwire_tpot_seconds (histograms, per pool), kvwire_requests_total
{pool, outcome=ok|failed|cancelled|rejected|invalid}, kvwire_wire_bytes_total and
kvwire_wire_bf16_bytes_total (compact KV bytes moved prefill -> decode, and their bf16
equivalent), kvwire_prefix_pages_reused_total, kvwire_prefix_hits_total (requests that reused
any page), kvwire_kv_pages_in_use {pool, worker, role}, kvwire_requests_inflight, kvwire_requests_queued.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("kvwire_ttft_seconds", "Time to first token", ["pool"], registry=r,
                              buckets=LATENCY_BUCKETS)
        self.tpot = Histogram("kvwire_tpot_seconds", "Time per output token after the first", ["pool"],
                              registry=r, buckets=LATENCY_BUCKETS)
        self.requests = Counter("kvwire_requests", "Requests by outcome", ["pool", "outcome"], registry=r)
        self.wire_bytes = Counter("kvwire_wire_bytes", "Compact KV bytes sent prefill -> decode", ["pool"],
                                  registry=r)
        self.wire_bf16_bytes = Counter("kvwire_wire_bf16_bytes", "bf16-equivalent of the KV bytes sent",
                                       ["pool"], registry=r)
        self.prefix_pages = Counter("kvwire_prefix_pages_reused", "Prompt pages found in a prefix cache",
                                    ["pool"], registry=r)
        self.prefix_hits = Counter("kvwire_prefix_hits", "Requests that reused at least one cached page",
                                   ["pool"], registry=r)
        self.pages_in_use = Gauge("kvwire_kv_pages_in_use", "KV pages in use per worker",
                                  ["pool", "worker", "role"], registry=r)
        self.inflight = Gauge("kvwire_requests_inflight", "Requests on the workers", registry=r)
        self.queued = Gauge("kvwire_requests_queued", "Requests waiting for a slot", registry=r)
        self._server = None

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint; returns the port it listens on."""
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
