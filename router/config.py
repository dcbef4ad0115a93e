"""The serving configuration `kvwire serve` reads: the router's address and limits, and its pools.

A pool is one model served in one KV format by ``prefill_workers`` prefill workers and
``decode_workers`` decode workers; several pools (formats side by side) may serve one model.
The file is TOML or YAML with the same keys; an unknown key anywhere is an error (a typo must
not silently fall back to a default). Example (TOML)::

    [router]
    host = "127.0.0.1"
    port = 50051
    metrics_port = 9464    # 0 turns /metrics off; "any" lets the OS pick a free port (printed at start)
    max_inflight = 32      # requests on the workers at once
    max_queue = 64         # requests waiting beyond that; more get RESOURCE_EXHAUSTED
    default_pool = "smollm2-bf16"
    drain_timeout_s = 30   # on SIGTERM/Ctrl-C: new requests are refused, in-flight ones get this long

    [[pools]]
    name = "smollm2-bf16"
    model = "smollm2"      # 'smollm2' (packaged), a .gguf file or an HF directory
    kv_format = "bf16"
    prefill_workers = 1
    decode_workers = 1
    gpus_per_worker = "auto"   # a number (fractional shares a GPU), or auto: 1 with GPUs, else 0
    device = "auto"            # auto | cpu | cuda
    page_size = 16
    num_pages = 4096           # per worker; omit for the engine's default
    max_batch = 32             # decode: sequences decoded together at most
    cuda_graphs = true         # decode steps replayed from CUDA graphs (GPU workers; no effect on the CPU)
    transport = "nixl"         # or inprocess (tests)
    transfer_progress_delay_us = 1000   # NIXL's progress thread: longest sleep between polls (0 spins)
    hung_worker_s = 60         # a decode worker silent this long (stopped, stuck on its GPU) is replaced
    prefill_resource = "kvwire_prefill"   # optional: custom Ray resources that pin each role
    decode_resource = "kvwire_decode"     # to the nodes that declare them
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvwire.formats import KVFormat

DEFAULT_PORT = 50051
DEFAULT_METRICS_PORT = 9464


class ConfigError(ValueError):
    """The serving configuration is invalid; the message names the key and what is allowed."""


def _is_int(value: object) -> bool:
    """An integer, not a bool (TOML's true would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_port(value: object) -> bool:
    return _is_int(value) and 0 <= value < 65536


def _check_strings(config: object, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """Text keys must be text: a number or null there failed later with an AttributeError traceback."""
    for key in required + optional:
        value = getattr(config, key)
        if not isinstance(value, str) and not (key in optional and value is None):
            raise ConfigError(f"{where}: {key} must be a string, got {value!r}")


@dataclass(frozen=True)
class PoolConfig:
    name: str
    model: str = "smollm2"
    kv_format: str = "bf16"
    prefill_workers: int = 1
    decode_workers: int = 1
    gpus_per_worker: float | str = "auto"
    device: str = "auto"
    load_format: str = "auto"
    model_shape: str | None = None
    page_size: int = 16
    chunk_size: int = 512
    num_pages: int | None = None
    max_batch: int = 32
    cuda_graphs: bool = True
    transport: str = "nixl"
    transfer_progress_delay_us: int = 1000   # 1-1,000,000; NIXL's own 0 spins a core per worker
    hung_worker_s: float = 60.0      # a decode worker whose stream poll answers nothing this long is replaced
    prefill_resource: str | None = None   # a custom Ray resource each prefill worker takes one unit of
    decode_resource: str | None = None    # (pins the roles to node groups, e.g. KubeRay worker groups)

    def __post_init__(self) -> None:
        _check_strings(self, "pool" if not isinstance(self.name, str) else f"pool {self.name}",
                       ("name", "model", "kv_format", "device", "load_format", "transport"),
                       ("model_shape", "prefill_resource", "decode_resource"))
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ConfigError(f"pool name {self.name!r}: use letters, digits, '-', '_' or '.'")
        try:
            KVFormat.parse(self.kv_format)
        except ValueError as exc:
            raise ConfigError(f"pool {self.name}: kv_format: {exc}") from exc
        for key in ("prefill_workers", "decode_workers", "page_size", "chunk_size", "max_batch"):
            value = getattr(self, key)
            if not _is_int(value) or value < 1:
                raise ConfigError(f"pool {self.name}: {key} must be a positive integer, got {value!r}")
        if self.num_pages is not None and (not _is_int(self.num_pages) or self.num_pages < 1):
            raise ConfigError(f"pool {self.name}: num_pages must be a positive integer, got {self.num_pages!r}")
        gpus = self.gpus_per_worker
        if gpus != "auto" and not (_is_number(gpus) and gpus >= 0):
            raise ConfigError(f"pool {self.name}: gpus_per_worker must be 'auto' or a number >= 0, got {gpus!r}")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ConfigError(f"pool {self.name}: device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.load_format not in ("auto", "gguf", "hf", "dummy"):
            raise ConfigError(f"pool {self.name}: load_format must be auto, gguf, hf or dummy")
        for key in ("prefill_resource", "decode_resource"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                raise ConfigError(f"pool {self.name}: {key} must be a Ray resource name")
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError(f"pool {self.name}: cuda_graphs must be true or false, got {self.cuda_graphs!r}")
        if self.transport not in ("nixl", "inprocess"):
            raise ConfigError(f"pool {self.name}: transport must be nixl or inprocess, got {self.transport!r}")
        hung = self.hung_worker_s
        if not _is_number(hung) or not 1 <= hung <= 86400:
            raise ConfigError(f"pool {self.name}: hung_worker_s must be a number of seconds from 1 to 86400, "
                              f"got {hung!r}")
        delay = self.transfer_progress_delay_us
        if not _is_int(delay) or not 1 <= delay <= 1_000_000:
            raise ConfigError(f"pool {self.name}: transfer_progress_delay_us must be an integer from 1 to "
                              f"1000000 (1 s), got {delay!r}: 0 would make NIXL's progress thread spin a core")

    @property
    def num_gpus(self) -> float | None:
        """GPUs per worker actor; None = decide from the cluster (1 if it has GPUs, else 0)."""
        return None if self.gpus_per_worker == "auto" else float(self.gpus_per_worker)


METRICS_ANY_PORT = "any"


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    metrics_port: int | str = DEFAULT_METRICS_PORT   # 0 = no metrics endpoint; "any" = a free port
    max_inflight: int = 32
    max_queue: int = 64
    default_pool: str | None = None
    request_timeout_s: float = 600.0              # used when the client sets no deadline
    max_attempts: int = 2                         # a request whose prefill worker dies is retried once
    drain_timeout_s: float = 30.0                 # on stop, in-flight streams get this long to finish

    def __post_init__(self) -> None:
        _check_strings(self, "router", ("host",), ("default_pool",))
        if not _is_port(self.port):
            raise ConfigError(f"router.port must be a port number (0-65535), got {self.port!r}")
        if not (_is_port(self.metrics_port) or self.metrics_port == METRICS_ANY_PORT):
            raise ConfigError("router.metrics_port must be a port number (0-65535; 0 turns /metrics off) "
                              f"or {METRICS_ANY_PORT!r}, got {self.metrics_port!r}")
        if not _is_int(self.max_inflight) or self.max_inflight < 1:
            raise ConfigError(f"router.max_inflight must be an integer of at least 1, got {self.max_inflight!r}")
        if not _is_int(self.max_queue) or self.max_queue < 0:
            raise ConfigError(f"router.max_queue must be an integer of 0 or more, got {self.max_queue!r}")
        if not _is_int(self.max_attempts) or self.max_attempts < 1:
            raise ConfigError(f"router.max_attempts must be an integer of at least 1, got {self.max_attempts!r}")
        if not _is_number(self.request_timeout_s) or not 0 < self.request_timeout_s < math.inf:
            raise ConfigError(f"router.request_timeout_s must be a positive, finite number of seconds, got "
                              f"{self.request_timeout_s!r}")
        if not _is_number(self.drain_timeout_s) or not 0 <= self.drain_timeout_s <= 3600:
            raise ConfigError("router.drain_timeout_s must be a number of seconds from 0 to 3600, got "
                              f"{self.drain_timeout_s!r}")


@dataclass(frozen=True)
class ServeConfig:
    router: RouterConfig = field(default_factory=RouterConfig)
    pools: tuple[PoolConfig, ...] = (PoolConfig("smollm2-bf16"),)

    def __post_init__(self) -> None:
        if not self.pools:
            raise ConfigError("declare at least one pool")
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"pool names must be unique; repeated: {', '.join(dupes)}")
        if self.router.default_pool is not None and self.router.default_pool not in names:
            raise ConfigError(f"router.default_pool {self.router.default_pool!r} is not a declared pool "
                              f"({', '.join(names)})")

    @property
    def default_pool(self) -> str:
        return self.router.default_pool or self.pools[0].name

    def to_dict(self) -> dict:
        return {"router": dataclasses.asdict(self.router), "pools": [dataclasses.asdict(p) for p in self.pools]}


def _build(cls, data: Any, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table/mapping, got {type(data).__name__}")
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def config_keys() -> dict[str, set[str]]:
    """The keys each section accepts (the k8s ConfigMap is checked against these)."""
    return {"router": {f.name for f in dataclasses.fields(RouterConfig)},
            "pools": {f.name for f in dataclasses.fields(PoolConfig)}}


def parse_config(data: Any, where: str = "config") -> ServeConfig:
    """A ServeConfig from the parsed file (a mapping with optional 'router' and 'pools')."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping with 'router' and/or 'pools'")
    unknown = sorted(set(data) - {"router", "pools"})
    if unknown:
        raise ConfigError(f"{where}: unknown top-level key(s) {', '.join(unknown)}; allowed: pools, router")
    router = _build(RouterConfig, data.get("router", {}), f"{where}: [router]")
    raw_pools = data.get("pools")
    if raw_pools is None:
        return ServeConfig(router=router)
    if not isinstance(raw_pools, list):
        raise ConfigError(f"{where}: 'pools' must be a list of tables")
    pools = tuple(_build(PoolConfig, p, f"{where}: pools[{i}]") for i, p in enumerate(raw_pools))
    return ServeConfig(router=router, pools=pools)


def load_config(path: str | Path) -> ServeConfig:
    """Read a TOML (.toml) or YAML (.yaml/.yml) serving config; JSON (.json) works too."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            import tomllib
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml
            data = yaml.safe_load(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file {path}: use .toml, .yaml/.yml or .json")
    except ConfigError:
        raise
    except Exception as exc:  # the parsers' own error types differ; all mean a malformed file
        raise ConfigError(f"config file {path} is not valid {suffix[1:].upper()}: {exc}") from exc
    return parse_config(data, str(path))
