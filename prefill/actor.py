"""Ray actor wrapper for PrefillWorker: the worker class itself knows nothing of Ray.

GPU workers take one GPU by default (``num_gpus`` may be fractional to share one); CPU workers
take none. The model and CUDA are initialised inside the actor process.
"""
from __future__ import annotations

import ray

from kvwire.worker_config import WorkerConfig
from prefill.worker import PrefillWorker


def default_num_gpus(cfg: WorkerConfig) -> float:
    if cfg.device == "cpu":
        return 0.0
    if cfg.device.startswith("cuda"):
        return 1.0
    return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0


def start_prefill_actor(cfg: WorkerConfig, num_gpus: float | None = None, **options):
    gpus = default_num_gpus(cfg) if num_gpus is None else num_gpus
    return ray.remote(PrefillWorker).options(num_gpus=gpus, max_concurrency=8, **options).remote(cfg)
