"""Ray actor wrapper for DecodeWorker (threaded: admissions and token polls run beside the loop)."""
from __future__ import annotations

import ray

from decode.worker import DecodeWorker
from kvwire.worker_config import WorkerConfig
from prefill.actor import default_num_gpus


def start_decode_actor(cfg: WorkerConfig, num_gpus: float | None = None, **options):
    gpus = default_num_gpus(cfg) if num_gpus is None else num_gpus
    return ray.remote(DecodeWorker).options(num_gpus=gpus, max_concurrency=64, **options).remote(cfg)
