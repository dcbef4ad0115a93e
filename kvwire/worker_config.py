"""Configuration shared by prefill and decode workers, and building their engine from it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvwire.formats import KVFormat


@dataclass(frozen=True)
class WorkerConfig:
    name: str                          # unique; also the transfer agent's name
    kv_format: str = "bf16"
    model: str = "smollm2"
    load_format: str = "auto"
    model_shape: str | None = None
    device: str = "auto"               # auto: cuda if visible to this process, else cpu
    page_size: int = 16
    chunk_size: int = 512
    num_pages: int | None = None
    max_batch: int = 32                # decode: sequences decoded together at most
    cuda_graphs: bool = True           # decode steps from CUDA graphs (on a GPU; no effect on the CPU)
    transport: str = "nixl"            # or "inprocess" (single-process runs and tests)
    transfer_deadline_s: float = 30.0
    transfer_progress_delay_us: int = 1000   # NIXL: its progress thread's longest sleep between polls
    hold_timeout_s: float = 120.0      # prefill: free a manifest's pages if no decode notice by then

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a worker needs a name")
        KVFormat.parse(self.kv_format)
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")


def build_engine(cfg: WorkerConfig):
    """(engine, tokenizer) for a worker; CUDA is touched only here, inside the worker process."""
    from kvwire.calibration import CALIBRATION_TEXT
    from kvwire.engine import Engine, EngineConfig
    from kvwire.model.registry import load_model

    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    model, tokenizer = load_model(cfg.model, load_format=cfg.load_format, model_shape=cfg.model_shape, device=device)
    calibration = tokenizer.encode(CALIBRATION_TEXT) if tokenizer is not None else None
    engine = Engine(model, EngineConfig(kv_format=cfg.kv_format, page_size=cfg.page_size, chunk_size=cfg.chunk_size,
                                        num_pages=cfg.num_pages, max_sequences=cfg.max_batch + 1,
                                        cuda_graphs=cfg.cuda_graphs),
                    calibration_ids=calibration)
    return engine, tokenizer
