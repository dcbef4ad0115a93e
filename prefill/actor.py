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


PROMPT_THREADS = 8    # prefill calls at once (they queue for one forward at a time, or wait for pages)


@ray.remote(concurrency_groups={"prompts": PROMPT_THREADS})
class PrefillActor(PrefillWorker):
    """Prefill calls run in their own concurrency group: prompts waiting for pages must not take
    the threads that ``push`` and ``release`` (which free those pages) and the probes run on."""

    @ray.method(concurrency_group="prompts")
    def prefill_request(self, *args, **kwargs) -> dict:
        return super().prefill_request(*args, **kwargs)

    @ray.method(concurrency_group="prompts")
    def prefill(self, *args, **kwargs) -> bytes:
        return super().prefill(*args, **kwargs)


def start_prefill_actor(cfg: WorkerConfig, num_gpus: float | None = None, **options):
    gpus = default_num_gpus(cfg) if num_gpus is None else num_gpus
    return PrefillActor.options(num_gpus=gpus, max_concurrency=8, **options).remote(cfg)
