"""Start the whole system: Ray (local on 127.0.0.1, or an existing cluster), the pools, the router.

``start_router(config)`` returns a RunningRouter whose gRPC server and pools live on an
asyncio loop in a background thread; ``stop()`` ends requests, shuts the workers down and
(if it started Ray) Ray. `kvwire serve` is this plus signal handling.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Callable

import grpc
import ray
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kvwire.errors import StartError
from kvwire.model.registry import load_model_config, load_tokenizer
from router.api import router_pb2, router_pb2_grpc
from router.config import METRICS_ANY_PORT, ServeConfig
from router.metrics import RouterMetrics
from router.pool import WorkerPool
from router.service import RouterService

log = logging.getLogger("kvwire.router")
STILL_STARTING_EVERY_S = 30.0     # how often start-up says it is still waiting for workers
SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
IN_USE = "already in use (another kvwire serve?)"


class StartCancelled(Exception):
    """Start-up was stopped (Ctrl-C) before the router served; whatever had started was stopped."""


def start_local_ray(num_workers: int) -> None:
    """A single-node Ray of our own, bound to 127.0.0.1 (nothing listens on other addresses).

    ``address="local"``: without it Ray joins a cluster that `ray start` left running on this
    machine (and refuses ``num_cpus``); joining one is what ``--address`` is for.
    """
    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)
    # Actors reserve one logical CPU each for placement; give every worker one even on 2 cores.
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, num_workers + 2), _node_ip_address="127.0.0.1",
             include_dashboard=False, log_to_driver=False, configure_logging=False)


def auto_gpus_per_worker(config: ServeConfig) -> float:
    """GPUs for each worker whose pool says gpus_per_worker = "auto".

    One GPU each when the cluster has enough; otherwise an equal share, so that `kvwire serve`
    on a one-GPU machine puts its prefill and decode workers on that GPU together.
    """
    gpus = ray.cluster_resources().get("GPU", 0.0)
    auto = [p for p in config.pools if p.num_gpus is None and p.device != "cpu"]
    fixed = sum(p.num_gpus * (p.prefill_workers + p.decode_workers) for p in config.pools if p.num_gpus)
    workers = sum(p.prefill_workers + p.decode_workers for p in auto)
    if not gpus or not workers:
        return 0.0
    return min(1.0, max(gpus - fixed, 0.0) / workers)


@dataclass
class RunningRouter:
    config: ServeConfig
    target: str                       # host:port of the gRPC server
    metrics_port: int                 # 0 when disabled
    pools: dict[str, WorkerPool]
    _loop: asyncio.AbstractEventLoop
    _thread: threading.Thread
    _stopped: Future
    _owns_ray: bool
    _stop_event: asyncio.Event = field(repr=False, default=None)
    _hurry_event: asyncio.Event = field(repr=False, default=None)

    def stop(self) -> None:
        """Stop serving: refuse new requests, let in-flight ones finish for up to router.drain_timeout_s
        (or until ``hurry``), shut the workers down, and stop Ray if this router started it (idempotent)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop_event.set)
            self._thread.join(timeout=self.config.router.drain_timeout_s + 60)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def hurry(self) -> None:
        """End a drain now: streams still in flight are cancelled (their pages freed). Thread-safe; a
        second Ctrl-C calls it while ``stop`` waits."""
        if self._thread.is_alive() and self._hurry_event is not None:
            self._loop.call_soon_threadsafe(self._hurry_event.set)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the router stops (True) or the timeout passes (False)."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


def start_router(config: ServeConfig, ray_address: str | None = None,
                 progress: Callable[[str], None] = lambda msg: log.info(msg),
                 cancel: threading.Event | None = None,
                 after_ray: Callable[[], None] = lambda: None) -> RunningRouter:
    """Start Ray (unless connected already), every pool's workers and the gRPC server; return once serving.

    Models are checked before Ray starts (a bad path fails in a second, not after Ray's start-up).
    ``cancel`` set meanwhile (Ctrl-C) stops whatever started and raises StartCancelled: workers Ray
    cannot place would otherwise keep start-up waiting for good. ``after_ray`` runs once Ray is up
    (ray.init replaces the SIGTERM handler; `kvwire serve` puts its own back there).
    """
    check_ports_free(config)
    models = _load_models(config)
    owns_ray = False
    if not ray.is_initialized():
        workers = sum(p.prefill_workers + p.decode_workers for p in config.pools)
        if ray_address:
            check_ray_reachable(ray_address)
            progress(f"joining the Ray cluster at {ray_address}")
            ray.init(address=ray_address, log_to_driver=False, configure_logging=False)
        else:
            progress("starting a local Ray cluster on 127.0.0.1")
            start_local_ray(workers)
        owns_ray = True
    after_ray()
    ready: Future = Future()
    stopped: Future = Future()
    loop = asyncio.new_event_loop()
    holder: dict = {}
    task = loop.create_task(_serve(config, models, progress, ready, holder))

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(task)
        except BaseException as exc:  # reported through `ready` if start-up failed
            if not ready.done():
                ready.set_exception(exc)
        finally:
            loop.close()
            stopped.set_result(None)

    thread = threading.Thread(target=run, name="kvwire-router", daemon=True)
    thread.start()
    try:
        target, metrics_port = _await_ready(ready, cancel)
    except BaseException:   # failed, cancelled, or a KeyboardInterrupt in a caller without ``cancel``
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:    # the loop already closed: start-up ended by itself
            pass
        thread.join(timeout=60)
        if owns_ray:
            ray.shutdown()
        raise
    return RunningRouter(config, target, metrics_port, holder["pools"], loop, thread, stopped, owns_ray,
                         holder["stop"], holder["hurry"])


def _await_ready(ready: Future, cancel: threading.Event | None) -> tuple[str, int]:
    """Wait for start-up, looking at ``cancel`` twice a second (a signal handler sets it; it cannot wake a
    Future); raise StartCancelled once it is set."""
    while True:
        if cancel is not None and cancel.is_set():
            raise StartCancelled("stopped before serving")
        try:
            return ready.result(timeout=0.5)
        except FutureTimeout:
            continue


def _load_models(config: ServeConfig) -> dict[str, tuple]:
    """Each pool's model config and tokenizer (no weights: the workers load those), or StartError."""
    models = {}
    for pc in config.pools:
        try:
            models[pc.name] = (load_model_config(pc.model, pc.load_format, pc.model_shape),
                               load_tokenizer(pc.model, pc.load_format, pc.model_shape))
        except (ValueError, OSError) as exc:
            raise StartError(f"pool {pc.name}: model {pc.model!r}: {exc}") from exc
    return models


def check_ray_reachable(address: str, timeout_s: float = 5.0) -> None:
    """StartError now if nothing listens at a HOST:PORT Ray address (``ray://`` too), rather than minutes
    of Ray's own GCS warnings before its timeout. "auto" and other forms are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise StartError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} (is its head "
                         "running, and is this its GCS port, 6379 by default?)") from exc


def check_ports_free(config: ServeConfig) -> None:
    """Raise OSError now if the gRPC or metrics port is taken, rather than after Ray's start-up (~17 s).

    Port 0 (the OS picks) and "any" need no check. A port can still be taken in the gap before the
    server binds it; ``_listen`` reports that with the same message.
    """
    rc = config.router
    for what, port in (("gRPC", rc.port), ("metrics", rc.metrics_port)):
        if isinstance(port, int) and port:
            _try_bind(what, rc.host, port)


def _try_bind(what: str, host: str, port: int) -> None:
    """Bind host:port briefly as the servers do (SO_REUSEADDR, so a TIME_WAIT leftover is no conflict)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        reason = IN_USE if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise OSError(f"cannot listen for {what} on {host}:{port}: {reason}") from exc


def _listen(server: grpc.aio.Server, host: str, port: int) -> int:
    """The port the server bound. grpcio raises RuntimeError on failure (older releases returned 0)."""
    message = f"cannot listen for gRPC on {host}:{port}: {IN_USE}, or not an address of this host"
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:
        raise OSError(message) from exc
    if bound == 0:
        raise OSError(message)
    return bound


async def _serve(config: ServeConfig, models: dict[str, tuple], progress: Callable[[str], None], ready: Future,
                 holder: dict) -> None:
    stop, hurry = asyncio.Event(), asyncio.Event()
    holder["stop"], holder["hurry"] = stop, hurry
    pools: dict[str, WorkerPool] = {}
    tokenizers = {}
    holder["pools"] = pools
    metrics = RouterMetrics()
    server = service = None
    try:
        auto = auto_gpus_per_worker(config)
        _check_gpu_devices(config, auto)
        for pc in config.pools:
            model, tokenizers[pc.name] = models[pc.name]
            pools[pc.name] = WorkerPool(pc, model, auto)
        progress(f"starting {sum(p.prefill_workers + p.decode_workers for p in config.pools)} workers "
                 f"in {len(pools)} pool(s): " + ", ".join(f"{p.name} ({p.kv_format}, {p.prefill_workers} prefill "
                                                          f"+ {p.decode_workers} decode)" for p in config.pools))
        await _start_pools(list(pools.values()), progress)
        service = RouterService(config, pools, tokenizers, metrics)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        router_pb2_grpc.add_RouterServicer_to_server(service, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        rc = config.router
        port = _listen(server, rc.host, rc.port)
        await server.start()
        health_names = await _set_health(health_servicer, pools, {})
        watch = asyncio.get_running_loop().create_task(_watch_health(health_servicer, pools, health_names))
        metrics_port = 0
        if rc.metrics_port:
            metrics_port = metrics.serve(rc.host, 0 if rc.metrics_port == METRICS_ANY_PORT else rc.metrics_port)
        gauges = asyncio.get_running_loop().create_task(service.refresh_gauges())
        ready.set_result((f"{rc.host}:{port}", metrics_port))
        await stop.wait()
        gauges.cancel()
        watch.cancel()
        for name in health_names:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    finally:
        if server is not None:
            await _drain(server, service.inflight if service else 0, config.router.drain_timeout_s, hurry,
                         progress)
        metrics.stop()
        await asyncio.gather(*(p.stop() for p in pools.values()), return_exceptions=True)


def _check_gpu_devices(config: ServeConfig, auto_gpus: float) -> None:
    """A pool set to a CUDA device whose workers would get no GPU fails now, not as dead actors later."""
    for pc in config.pools:
        if pc.device.startswith("cuda") and pc.num_gpus is None and not auto_gpus:
            raise StartError(f"pool {pc.name}: device {pc.device}, but the Ray cluster has no GPU for its workers "
                             "(use device auto or cpu)")


async def _start_pools(pools: list[WorkerPool], progress: Callable[[str], None]) -> None:
    """Start every pool's workers, saying why when Ray cannot place some and, while they load, that
    start-up is still going (a model load takes seconds to minutes; a missing node, until it comes)."""
    for problem in (p for pool in pools for p in pool.placement_problems()):
        progress(f"warning: {problem}. Waiting for such a node (an autoscaler may add one); Ctrl-C stops.")
    starting = asyncio.gather(*(p.start() for p in pools))
    began = asyncio.get_running_loop().time()
    try:
        while not (await asyncio.wait({starting}, timeout=STILL_STARTING_EVERY_S))[0]:
            waited = asyncio.get_running_loop().time() - began
            pending = [p for pool in pools for p in pool.placement_problems()]
            why = ("; ".join(pending) if pending else "models still loading, or Ray placing workers: "
                   "`ray status` shows pending demands")
            progress(f"still starting workers after {waited:.0f} s ({why})")
    except BaseException:
        starting.cancel()
        await asyncio.wait({starting})      # each pool kills the workers it started
        if not starting.cancelled():
            starting.exception()            # read, so asyncio logs no "never retrieved" error
        raise
    starting.result()


async def _drain(server: grpc.aio.Server, inflight: int, grace_s: float, hurry: asyncio.Event,
                 progress: Callable[[str], None]) -> None:
    """Stop the gRPC server: new calls are refused at once, calls in flight get ``grace_s`` to finish
    (a rolling update must not cut streams off), unless ``hurry`` is set first; then they are cancelled,
    which frees their pages as a client's cancel does."""
    if inflight and grace_s:
        progress(f"draining {inflight} in-flight request(s) for up to {grace_s:g} s "
                 "(Ctrl-C again to cancel them now)")
    stopping = asyncio.ensure_future(server.stop(grace=grace_s))
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({stopping, hurried}, return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            progress("cancelling the requests still in flight")
            await server.stop(grace=None)
        await stopping
    finally:
        hurried.cancel()


HEALTH_EVERY_S = 1.0


async def _set_health(servicer: health.aio.HealthServicer, pools: dict[str, WorkerPool],
                      last: dict[str, bool]) -> dict[str, bool]:
    """Health by service name: "<Router>/<pool>" SERVING while the pool has a live worker of each role;
    the Router's name (k8s readiness) while any pool does; "" (k8s liveness: the process answers)
    always, so that replacing workers never restarts the router. Sets only what changed."""
    states = {f"{SERVICE_NAME}/{name}": pool.ready for name, pool in pools.items()}
    states[SERVICE_NAME] = any(states.values())
    states[""] = True
    for name, ok in states.items():
        if last.get(name) != ok:
            await servicer.set(name, health_pb2.HealthCheckResponse.SERVING if ok
                               else health_pb2.HealthCheckResponse.NOT_SERVING)
    return states


async def _watch_health(servicer: health.aio.HealthServicer, pools: dict[str, WorkerPool],
                        states: dict[str, bool]) -> None:
    """Keep health current, so that a probe (k8s readiness) sees a pool with no live worker as down
    rather than SERVING while its requests wait for replacements."""
    while True:
        await asyncio.sleep(HEALTH_EVERY_S)
        states.update(await _set_health(servicer, pools, states))
