"""The kvwire.v1.Router gRPC service: validation, admission, pool choice, streaming, stats.

Status codes: INVALID_ARGUMENT for anything the caller can fix (the message says what is
allowed; also a request needing more KV pages than a worker has in all), ALREADY_EXISTS for a
request_id already in flight, RESOURCE_EXHAUSTED when the queue is full or a worker's pages were
not freed within the request's deadline, UNAVAILABLE when a pool has no live worker,
DEADLINE_EXCEEDED past the deadline, INTERNAL when a worker failed and retries ran out.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc

from kvwire.formats import KVFormat, UnknownFormatError
from kvwire.model.tokenizer import StreamDecoder, Tokenizer
from kvwire.sampling import SamplingParams
from router.api import router_pb2 as pb
from router.api import router_pb2_grpc as pb_grpc
from router.config import ServeConfig
from router.metrics import RouterMetrics
from router.pool import NoWorkerError, WorkerPool
from router.request import Failure, RequestError, RequestStats, run_request

DEFAULT_MAX_TOKENS = 64
_STATUS = {Failure.WORKER: grpc.StatusCode.INTERNAL, Failure.TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
           Failure.NO_ROOM: grpc.StatusCode.RESOURCE_EXHAUSTED}


class InvalidArgument(ValueError):
    pass


class QueueFull(RuntimeError):
    pass


class Admission:
    """At most ``max_inflight`` requests on the workers and ``max_queue`` waiting; beyond, QueueFull."""

    def __init__(self, max_inflight: int, max_queue: int, metrics: RouterMetrics) -> None:
        self.max_queue = max_queue
        self._sem = asyncio.Semaphore(max_inflight)
        self._metrics = metrics
        self.inflight = 0
        self.queued = 0

    @asynccontextmanager
    async def slot(self):
        if self._sem.locked() and self.queued >= self.max_queue:
            raise QueueFull(f"the router is at capacity ({self.inflight} running, {self.queued} queued, "
                            f"max_queue {self.max_queue}); retry later")
        self.queued += 1
        self._metrics.queued.set(self.queued)
        try:
            await self._sem.acquire()
        finally:
            self.queued -= 1
            self._metrics.queued.set(self.queued)
        self.inflight += 1
        self._metrics.inflight.set(self.inflight)
        try:
            yield
        finally:
            self.inflight -= 1
            self._metrics.inflight.set(self.inflight)
            self._sem.release()


@dataclass
class Prepared:
    pool: WorkerPool
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str


class RouterService(pb_grpc.RouterServicer):
    def __init__(self, config: ServeConfig, pools: dict[str, WorkerPool], tokenizers: dict[str, Tokenizer | None],
                 metrics: RouterMetrics) -> None:
        self.config = config
        self.pools = pools
        self.tokenizers = tokenizers          # by pool name
        self.metrics = metrics
        self.admission = Admission(config.router.max_inflight, config.router.max_queue, metrics)
        self._active: set[str] = set()       # request ids in flight: a worker keys its pages by them
        self._gauged: dict[str, set[tuple[str, str, str]]] = {}   # pool -> its kv_pages_in_use label sets

    # ---- validation ----
    def _pool(self, req: pb.GenerateRequest) -> WorkerPool:
        if req.pool:
            pool = self.pools.get(req.pool)
            if pool is None:
                raise InvalidArgument(f"unknown pool {req.pool!r}; this router serves: {', '.join(self.pools)}")
            if req.kv_format and KVFormat.parse(req.kv_format).name != pool.page_format.kv.name:
                raise InvalidArgument(f"pool {req.pool} serves {pool.page_format.kv.name}, not {req.kv_format}")
            return pool
        if not req.kv_format:
            return self.pools[self.config.default_pool]
        try:
            want = KVFormat.parse(req.kv_format).name
        except (UnknownFormatError, ValueError) as exc:
            raise InvalidArgument(f"{exc}; served formats: {self._served()}") from None
        default = self.pools[self.config.default_pool]
        for pool in [default, *self.pools.values()]:
            if pool.page_format.kv.name == want:
                return pool
        raise InvalidArgument(f"no pool serves KV format {want}; served formats: {self._served()}")

    def _served(self) -> str:
        return ", ".join(sorted({p.page_format.kv.name for p in self.pools.values()}))

    def _prepare(self, req: pb.GenerateRequest) -> Prepared:
        pool = self._pool(req)
        context = pool.model.max_context
        tokenizer = self.tokenizers.get(pool.cfg.name)
        if req.prompt_ids and (req.prompt or req.chat):
            raise InvalidArgument("give prompt (text) or prompt_ids (tokens), not both; chat needs text")
        if req.prompt_ids:
            ids = list(req.prompt_ids)
            if max(ids) >= pool.model.vocab_size:
                raise InvalidArgument(f"prompt_ids must be token ids in [0, {pool.model.vocab_size})")
        else:
            if not req.prompt.strip():
                raise InvalidArgument("the prompt is empty: give text in prompt or token ids in prompt_ids")
            if tokenizer is None:
                raise InvalidArgument(f"pool {pool.cfg.name}'s model has no tokenizer; send prompt_ids")
            text = tokenizer.apply_chat_template(req.prompt) if req.chat else req.prompt
            ids = tokenizer.encode(text)
        if len(ids) >= context:
            raise InvalidArgument(f"the prompt has {len(ids)} tokens; pool {pool.cfg.name} allows at most "
                                  f"{context - 1} (context {context}, one left to generate)")
        max_tokens = req.max_tokens or DEFAULT_MAX_TOKENS
        if not 1 <= max_tokens <= context - 1:
            raise InvalidArgument(f"max_tokens must be between 1 and {context - 1} (0 means {DEFAULT_MAX_TOKENS})")
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p or 1.0,
                                    seed=req.seed if req.HasField("seed") else None, stop_at_eos=not req.ignore_eos)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        return Prepared(pool, ids, params, req.request_id or uuid.uuid4().hex[:16])

    @property
    def inflight(self) -> int:
        """Requests admitted and not yet ended (what a drain waits for)."""
        return len(self._active)

    # ---- Generate ----
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        received = time.perf_counter()
        try:
            prep = self._prepare(request)
        except (InvalidArgument, UnknownFormatError) as exc:
            # a label per pool served, not per name a client makes up (each would be a new series)
            self.metrics.requests.labels(request.pool if request.pool in self.pools else "-", "invalid").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        pool, name = prep.pool, prep.pool.cfg.name
        if prep.request_id in self._active:
            self.metrics.requests.labels(name, "invalid").inc()
            await context.abort(grpc.StatusCode.ALREADY_EXISTS,
                                f"request_id {prep.request_id!r} is already in flight; give each request its own "
                                "(or none: the router makes one)")
        self._active.add(prep.request_id)
        outcome = "failed"
        try:
            async with self.admission.slot():
                async for event in self._stream(prep, context, received):
                    if event.HasField("finished"):
                        outcome = "ok"       # a client may close the call as soon as it has this
                    yield event
        except QueueFull as exc:
            outcome = "rejected"
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except TimeoutError:
            outcome = "cancelled"   # by its deadline, whichever side noticed first (the client's ends as a cancel)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"request {prep.request_id} passed the router's {self._timeout(context):.0f} s limit")
        except NoWorkerError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except RequestError as exc:
            if exc.failure is not Failure.WORKER:
                outcome = "rejected"
            await context.abort(_STATUS[exc.failure], str(exc))
        except (asyncio.CancelledError, GeneratorExit):   # GeneratorExit: the client closed the call mid-stream
            if outcome != "ok":
                outcome = "cancelled"
            raise
        finally:
            self._active.discard(prep.request_id)
            self.metrics.requests.labels(name, outcome).inc()
            totals = pool.totals
            setattr(totals, f"requests_{outcome}", getattr(totals, f"requests_{outcome}") + 1)

    def _timeout(self, context: grpc.aio.ServicerContext) -> float:
        left = context.time_remaining()
        limit = self.config.router.request_timeout_s
        return limit if left is None else min(left, limit)

    async def _stream(self, prep: Prepared, context: grpc.aio.ServicerContext, received: float):
        """The request's events; its times count from ``received`` (time queued in the router included)."""
        pool, name = prep.pool, prep.pool.cfg.name
        stats = RequestStats(prep.request_id, len(prep.prompt_ids), started=received)
        tokenizer = self.tokenizers.get(name)
        decoder = StreamDecoder(tokenizer) if tokenizer is not None else None
        async with asyncio.timeout(self._timeout(context)):
            async for tokens in run_request(pool, prep.request_id, prep.prompt_ids, prep.params, stats,
                                            wait_s=self._timeout(context),
                                            max_attempts=self.config.router.max_attempts):
                text = "".join(decoder.push(t) for t in tokens) if decoder else ""
                yield pb.GenerateResponse(delta=pb.TokenDelta(token_ids=tokens, text=text))
        rest = decoder.flush() if decoder else ""
        if rest:
            yield pb.GenerateResponse(delta=pb.TokenDelta(text=rest))
        total = time.perf_counter() - stats.started
        self._record(pool, stats, total)
        yield pb.GenerateResponse(finished=pb.Finished(
            request_id=prep.request_id, finish_reason=stats.finish_reason, prompt_tokens=stats.prompt_tokens,
            completion_tokens=stats.completion_tokens, ttft_s=stats.ttft_s, total_s=total,
            kv_format=pool.page_format.kv.name, pool=name, wire_bytes=stats.wire_bytes,
            wire_bf16_bytes=stats.wire_bf16_bytes, prefix_pages_reused=stats.prefix_pages_reused,
            prefill_worker=stats.prefill_worker, decode_worker=stats.decode_worker, attempts=stats.attempts))

    def _record(self, pool: WorkerPool, stats: RequestStats, total_s: float) -> None:
        name, t, m = pool.cfg.name, pool.totals, self.metrics
        t.wire_bytes += stats.wire_bytes
        t.wire_bf16_bytes += stats.wire_bf16_bytes
        t.prompt_tokens += stats.prompt_tokens
        t.completion_tokens += stats.completion_tokens
        t.prefix_pages_reused += stats.prefix_pages_reused
        m.ttft.labels(name).observe(stats.ttft_s)
        if stats.completion_tokens > 1:
            m.tpot.labels(name).observe((total_s - stats.ttft_s) / (stats.completion_tokens - 1))
        m.wire_bytes.labels(name).inc(stats.wire_bytes)
        m.wire_bf16_bytes.labels(name).inc(stats.wire_bf16_bytes)
        m.prefix_pages.labels(name).inc(stats.prefix_pages_reused)
        if stats.prefix_pages_reused:
            m.prefix_hits.labels(name).inc()

    # ---- ListPools / Stats ----
    async def _workers(self, pool: WorkerPool) -> list[pb.WorkerInfo]:
        out = []
        counted = await pool.worker_counters()
        members = {(pool.cfg.name, w.name, w.role.value) for w, _ in counted}
        gauged = self._gauged.setdefault(pool.cfg.name, set())
        for gone in gauged - members:          # a dead worker's last reading is no reading: drop its series
            self.metrics.pages_in_use.remove(*gone)
            gauged.discard(gone)
        for w, c in counted:
            if c is not None:      # no answer: leave the gauge at its last reading rather than zero it
                labels = (pool.cfg.name, w.name, w.role.value)
                self.metrics.pages_in_use.labels(*labels).set(c["pages_in_use"])
                gauged.add(labels)
            c = c or {}
            out.append(pb.WorkerInfo(name=w.name, role=w.role.value, alive=c != {} and w.alive,
                                     pages_in_use=c.get("pages_in_use", 0), pages_free=c.get("pages_free", 0),
                                     requests=c.get("running", c.get("requests_held", 0))))
        return out

    async def ListPools(self, request: pb.ListPoolsRequest, context: grpc.aio.ServicerContext) -> pb.ListPoolsResponse:
        pools = []
        for name, pool in self.pools.items():
            f = pool.page_format
            pools.append(pb.PoolInfo(name=name, model=pool.model.name, kv_format=f.kv.name,
                                     is_default=name == self.config.default_pool, max_context=pool.model.max_context,
                                     page_size=f.page_size, bytes_per_token=f.page_bytes / f.page_size,
                                     bf16_bytes_per_token=f.bf16_bytes_per_token, workers=await self._workers(pool)))
        return pb.ListPoolsResponse(pools=pools)

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        out = []
        for name, pool in self.pools.items():
            t = pool.totals
            out.append(pb.PoolStats(pool=name, kv_format=pool.page_format.kv.name, requests_ok=t.requests_ok,
                                    requests_failed=t.requests_failed, requests_cancelled=t.requests_cancelled,
                                    requests_rejected=t.requests_rejected, retries=t.retries,
                                    wire_bytes=t.wire_bytes, wire_bf16_bytes=t.wire_bf16_bytes,
                                    prompt_tokens=t.prompt_tokens, completion_tokens=t.completion_tokens,
                                    prefix_pages_reused=t.prefix_pages_reused, workers_replaced=t.workers_replaced,
                                    workers=await self._workers(pool)))
        return pb.StatsResponse(pools=out, inflight=self.admission.inflight, queued=self.admission.queued)

    async def refresh_gauges(self, every_s: float = 5.0) -> None:
        """Keep kvwire_kv_pages_in_use current for scrapers, even when nobody calls Stats."""
        while True:
            for pool in self.pools.values():
                await self._workers(pool)
            await asyncio.sleep(every_s)


