"""A worker pool: one model in one KV format, its prefill and decode workers, and how to pick them.

Prefill is chosen by prefix-cache affinity (the worker holding most of the prompt's leading
pages skips their prefill), then by load; decode by free pages, then by load. A worker found
dead leaves the pool at once and a replacement is started in the background; requests wait
for a live worker (bounded by their deadline) rather than fail while it loads.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import ray

from kvwire.formats import KVFormat, PageFormat
from kvwire.model.config import ModelConfig
from router.config import PoolConfig
from router.streams import StreamPump, awaited
from router.workers import Role, Worker, WorkerFactory, connect, kill, unplaceable

log = logging.getLogger("kvwire.router")
PROBE_TIMEOUT_S = 10.0       # a worker that does not answer a counters/affinity probe is skipped


async def _probe(refs: list) -> list:
    """Await quick worker calls together; a slow one comes back as a TimeoutError, not a hang."""
    return await asyncio.gather(*(asyncio.wait_for(awaited(r), PROBE_TIMEOUT_S) for r in refs),
                                return_exceptions=True)


def _other(role: Role) -> Role:
    """The role whose workers exchange pages with ``role``'s."""
    return Role.DECODE if role is Role.PREFILL else Role.PREFILL


class NoWorkerError(RuntimeError):
    """No live worker of a role within the wait allowed (the pool is down or still starting)."""


@dataclass
class PoolTotals:
    requests_ok: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    requests_rejected: int = 0
    retries: int = 0
    wire_bytes: int = 0
    wire_bf16_bytes: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefix_pages_reused: int = 0
    workers_replaced: int = 0


class WorkerPool:
    def __init__(self, cfg: PoolConfig, model: ModelConfig, auto_gpus: float = 0.0) -> None:
        """``auto_gpus``: GPUs per worker where the config says "auto" (the router shares the cluster's)."""
        self.cfg = cfg
        self.model = model
        self.page_format = PageFormat(KVFormat.parse(cfg.kv_format), cfg.page_size, model.num_layers,
                                      model.num_kv_heads, model.head_dim)
        self.totals = PoolTotals()
        self.workers: list[Worker] = []
        self._factory = WorkerFactory(cfg, auto_gpus)
        self._pumps: dict[str, StreamPump] = {}
        self._changed = asyncio.Condition()
        self._replacing: set[asyncio.Task] = set()

    # ---- lifecycle ----
    async def start(self) -> None:
        """Start every worker and connect each prefill worker to each decode worker."""
        prefill = [self._factory.start(Role.PREFILL) for _ in range(self.cfg.prefill_workers)]
        decode = [self._factory.start(Role.DECODE) for _ in range(self.cfg.decode_workers)]
        try:
            await asyncio.gather(*(w.actor.handshake.remote() for w in prefill + decode))  # models loaded
            for w in decode:
                await connect(w, prefill)
        except BaseException:   # failed or cancelled (Ctrl-C during start-up): leave no actor behind
            for w in prefill + decode:
                kill(w)
            raise
        for w in prefill + decode:
            self._add(w)

    def placement_problems(self) -> list[str]:
        """Roles of this pool that no node of the Ray cluster can place now (``workers.unplaceable``)."""
        problems = []
        for role in Role:
            why = unplaceable(self._factory.demand(role))
            if why:
                problems.append(f"pool {self.cfg.name}: a {role.value} worker {why}")
        return problems

    def _add(self, worker: Worker) -> None:
        self.workers.append(worker)
        if worker.role is Role.DECODE:
            self._pumps[worker.name] = StreamPump(worker, self.worker_died, self.cfg.hung_worker_s)

    async def stop(self) -> None:
        for task in self._replacing:
            task.cancel()
        for pump in self._pumps.values():
            pump.stop("the router is stopping")
        await asyncio.gather(*(self._shutdown(w) for w in self.workers if w.alive), return_exceptions=True)
        for w in self.workers:
            kill(w)

    @staticmethod
    async def _shutdown(w: Worker) -> None:
        await asyncio.wait_for(asyncio.wrap_future(w.actor.shutdown.remote().future()), 10)

    @property
    def ready(self) -> bool:
        """A live worker of each role: requests can run now (not only wait for replacements)."""
        return bool(self.live(Role.PREFILL)) and bool(self.live(Role.DECODE))

    def live(self, role: Role) -> list[Worker]:
        return [w for w in self.workers if w.alive and w.role is role]

    def open_stream(self, decode: Worker, rid: str) -> asyncio.Queue:
        pump = self._pumps.get(decode.name)
        if pump is None:
            raise NoWorkerError(f"decode worker {decode.name} left pool {self.cfg.name}")
        return pump.open(rid)

    def close_stream(self, decode: Worker, rid: str) -> None:
        pump = self._pumps.get(decode.name)
        if pump is not None:
            pump.close(rid)

    # ---- failures ----
    def worker_died(self, worker: Worker) -> None:
        """Take a dead worker out of the pool and start its replacement (idempotent)."""
        if not worker.alive:
            return
        log.warning("pool %s: worker %s died; starting a replacement", self.cfg.name, worker.name)
        kill(worker)
        self.workers.remove(worker)
        pump = self._pumps.pop(worker.name, None)
        if pump is not None:
            pump.stop(f"decode worker {worker.name} died")
        self._forget(worker, self.live(_other(worker.role)))
        task = asyncio.get_running_loop().create_task(self._replace(worker.role))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    def _forget(self, gone: Worker, peers: list[Worker]) -> None:
        """Have ``peers`` drop ``gone``'s transfer agent (its metadata and connections), in the background."""
        async def remove(peer: Worker) -> None:
            try:
                await peer.actor.remove_peer.remote(gone.agent)
            except Exception as exc:   # a peer that died too is dealt with on its own
                log.info("pool %s: %s could not forget %s: %s", self.cfg.name, peer.name, gone.name, exc)
        for peer in peers:
            task = asyncio.get_running_loop().create_task(remove(peer))
            self._replacing.add(task)
            task.add_done_callback(self._replacing.discard)

    async def _replace(self, role: Role) -> None:
        """Start a worker of ``role`` and connect it to every live peer, including those that became live
        while it loaded (when both roles die together, each replacement must meet the other)."""
        new = self._factory.start(role)
        peers = self.live(_other(role))
        try:
            await connect(new, peers)            # waits for the model to load, even with no peer yet
            while missing := [p for p in self.live(_other(role)) if p not in peers]:
                peers += missing
                await connect(new, missing)
        except Exception as exc:
            log.error("pool %s: replacement %s failed to start: %s", self.cfg.name, new.name, exc)
            kill(new)
            self._forget(new, peers)
            return
        self._add(new)     # no await since the last look: a peer that becomes live later sees this one
        self.totals.workers_replaced += 1
        async with self._changed:
            self._changed.notify_all()

    async def _wait_live(self, role: Role, timeout_s: float) -> list[Worker]:
        async def wait() -> list[Worker]:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self.live(role)))
            return self.live(role)
        if self.live(role):
            return self.live(role)
        try:
            return await asyncio.wait_for(wait(), timeout_s)
        except asyncio.TimeoutError:
            raise NoWorkerError(f"pool {self.cfg.name} has no live {role.value} worker "
                                f"(replacement not ready within {timeout_s:.0f} s)") from None

    # ---- choosing ----
    async def choose_prefill(self, prompt_ids: list[int], timeout_s: float) -> Worker:
        """Most of the prompt's leading pages cached, then fewest requests in flight."""
        live = await self._wait_live(Role.PREFILL, timeout_s)
        if len(live) == 1:
            return live[0]
        hits = await _probe([w.actor.cached_prefix_pages.remote(prompt_ids) for w in live])
        scored = []
        for w, h in zip(live, hits):
            if isinstance(h, ray.exceptions.RayActorError):
                self.worker_died(w)
            elif not isinstance(h, BaseException):
                scored.append((-h, w.inflight, w.name, w))
        if not scored:
            return await self.choose_prefill(prompt_ids, timeout_s)
        return min(scored, key=lambda t: t[:3])[3]

    async def choose_decode(self, timeout_s: float) -> Worker:
        """Most free pages, then fewest requests in flight."""
        live = await self._wait_live(Role.DECODE, timeout_s)
        if len(live) == 1:
            return live[0]
        counters = await _probe([w.actor.counters.remote() for w in live])
        scored = []
        for w, c in zip(live, counters):
            if isinstance(c, ray.exceptions.RayActorError):
                self.worker_died(w)
            elif not isinstance(c, BaseException):
                w.last_counters = c
                scored.append((-c["pages_free"], w.inflight + c["running"], w.name, w))
        if not scored:
            return await self.choose_decode(timeout_s)
        return min(scored, key=lambda t: t[:3])[3]

    async def worker_counters(self) -> list[tuple[Worker, dict | None]]:
        """Each live worker's counters (None where the call failed); refreshes ``last_counters``."""
        ws = list(self.workers)
        got = await _probe([w.actor.counters.remote() for w in ws])
        out = []
        for w, c in zip(ws, got):
            if isinstance(c, ray.exceptions.RayActorError):
                self.worker_died(w)
                out.append((w, None))
            elif isinstance(c, BaseException):
                out.append((w, None))
            else:
                w.last_counters = c
                out.append((w, c))
        return out
