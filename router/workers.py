"""Worker actors as the router sees them: starting one for a pool, connecting it to its peers.

Every prefill worker of a pool is connected (transfer handshakes both ways) to every decode
worker of the same pool, so the router may pair any two of them per request. A replacement
worker gets a new name (``<pool>-prefill-3``), since names are transfer agent names and a dead
agent's name may still be cached by its peers.
"""
from __future__ import annotations

import asyncio
import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

import ray

from decode.actor import start_decode_actor
from kvwire.worker_config import WorkerConfig
from prefill.actor import start_prefill_actor
from router.config import PoolConfig


class Role(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(eq=False)
class Worker:
    """One worker actor. ``inflight`` counts this router's requests on it (a load signal that needs no call)."""

    name: str
    role: Role
    actor: Any
    alive: bool = True
    inflight: int = 0
    agent: str = ""                        # transfer agent name (decode: the push target)
    last_counters: dict = field(default_factory=dict)


def worker_config(pool: PoolConfig, name: str) -> WorkerConfig:
    return WorkerConfig(name=name, kv_format=pool.kv_format, model=pool.model, load_format=pool.load_format,
                        model_shape=pool.model_shape, device=pool.device, page_size=pool.page_size,
                        chunk_size=pool.chunk_size, num_pages=pool.num_pages, max_batch=pool.max_batch,
                        transport=pool.transport, cuda_graphs=pool.cuda_graphs,
                        transfer_progress_delay_us=pool.transfer_progress_delay_us)


class WorkerFactory:
    """Starts a pool's worker actors with fresh names and the pool's resources."""

    def __init__(self, pool: PoolConfig, auto_gpus: float = 0.0) -> None:
        self.pool = pool
        if pool.num_gpus is not None:
            self.num_gpus = pool.num_gpus
        else:
            self.num_gpus = 0.0 if pool.device == "cpu" else auto_gpus
        self._serial = {Role.PREFILL: itertools.count(), Role.DECODE: itertools.count()}

    def demand(self, role: Role) -> dict[str, float]:
        """What Ray must find on one node to place a worker of ``role`` (GPUs and the role's custom resource;
        CPUs are left out: every node has some)."""
        need: dict[str, float] = {"GPU": self.num_gpus} if self.num_gpus else {}
        resource = self.pool.prefill_resource if role is Role.PREFILL else self.pool.decode_resource
        if resource:
            need[resource] = 1.0
        return need

    def start(self, role: Role) -> Worker:
        name = f"{self.pool.name}-{role.value}-{next(self._serial[role])}"
        custom = {k: v for k, v in self.demand(role).items() if k != "GPU"}
        options: dict = {"resources": custom} if custom else {}
        start = start_prefill_actor if role is Role.PREFILL else start_decode_actor
        actor = start(worker_config(self.pool, name), num_gpus=self.num_gpus, **options)
        return Worker(name, role, actor, agent=name)


async def connect(new: Worker, peers: list[Worker]) -> None:
    """Exchange handshakes between ``new`` and each live peer (the other role); waits for model load."""
    new_hs = await new.actor.handshake.remote()
    for peer in peers:
        if not peer.alive:
            continue
        peer_hs = await peer.actor.handshake.remote()
        agent_of_peer, agent_of_new = await asyncio.gather(new.actor.add_peer.remote(peer_hs),
                                                           peer.actor.add_peer.remote(new_hs))
        if new.role is Role.PREFILL:
            peer.agent = agent_of_peer
        else:
            new.agent = agent_of_new


def kill(worker: Worker) -> None:
    worker.alive = False
    try:
        ray.kill(worker.actor, no_restart=True)
    except Exception:  # already gone: nothing to free
        pass


_BOOKKEEPING = ("node:", "accelerator_type:", "memory", "object_store_memory")   # Ray's, not a user's


def unplaceable(demand: dict[str, float]) -> str | None:
    """Why no live node of the Ray cluster can place a worker needing ``demand`` now, or None if one can.

    Only a warning: an autoscaler (KubeRay's, say) may still add such a node, so the caller waits on."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if any(all(node.get(k, 0.0) >= v for k, v in demand.items()) for node in nodes):
        return None
    want = ", ".join(f"{k} {v:g}" for k, v in sorted(demand.items()))
    have = ["{" + ", ".join(f"{k} {v:g}" for k, v in sorted(node.items()) if not k.startswith(_BOOKKEEPING)) + "}"
            for node in nodes]
    return f"needs {want} on one node; the cluster's nodes have {' '.join(have) or 'nothing (none is alive)'}"
