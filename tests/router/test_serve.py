"""start_router's port checks: a taken port is reported at once, before Ray starts, and a bind that
fails later (grpcio raises RuntimeError) reads the same, as an OSError that `kvwire serve` prints."""
from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from router.config import RouterConfig, ServeConfig
from router.serve import _listen, check_ports_free, start_router


@pytest.fixture
def taken_port():
    """A port held by a plain listening socket on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def config(port: int, metrics_port: int | str = 0) -> ServeConfig:
    return ServeConfig(router=RouterConfig(port=port, metrics_port=metrics_port))


@pytest.mark.parametrize("which", ["port", "metrics_port"])
def test_a_taken_port_is_refused_before_ray_starts(taken_port, which):
    ray = pytest.importorskip("ray")
    ray_was_up = ray.is_initialized()
    with pytest.raises(OSError) as err:
        start_router(config(**{"port": 0, "metrics_port": 0, which: taken_port}))
    assert f"127.0.0.1:{taken_port}" in str(err.value) and "in use" in str(err.value)
    assert ("gRPC" if which == "port" else "metrics") in str(err.value)
    assert ray.is_initialized() == ray_was_up


def test_free_and_os_chosen_ports_pass():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    check_ports_free(config(free, "any"))
    check_ports_free(config(0, 0))


def test_a_failed_grpc_bind_is_an_oserror(taken_port):
    async def bind() -> int:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        try:
            return _listen(server, "127.0.0.1", taken_port)
        finally:
            await server.stop(None)

    with pytest.raises(OSError, match=f"cannot listen for gRPC on 127.0.0.1:{taken_port}"):
        asyncio.run(bind())


def test_a_model_that_does_not_load_is_refused_before_ray_starts():
    """A bad model path was found only after Ray's start-up (~10 s), as a traceback."""
    ray = pytest.importorskip("ray")
    from router.config import PoolConfig
    from router.serve import StartError

    ray_was_up = ray.is_initialized()
    bad = ServeConfig(router=RouterConfig(port=0, metrics_port=0), pools=(PoolConfig("a", model="/nonexistent"),))
    with pytest.raises(StartError, match="pool a: model '/nonexistent'"):
        start_router(bad)
    assert ray.is_initialized() == ray_was_up


def test_a_ray_address_nobody_answers_is_one_line_at_once():
    """--address pointing at no Ray head printed minutes of Ray's GCS warnings before anything said why."""
    ray = pytest.importorskip("ray")
    import time

    from router.serve import StartError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]                 # nothing listens once the socket is closed
    from router.serve import check_ray_reachable

    began = time.monotonic()
    for address in (f"127.0.0.1:{closed}", f"ray://127.0.0.1:{closed}"):
        with pytest.raises(StartError, match=f"cannot reach the Ray cluster at {address}"):
            check_ray_reachable(address)
    check_ray_reachable("auto")                        # left to Ray
    if not ray.is_initialized():                       # start_router checks only when it is to join
        with pytest.raises(StartError, match=f"cannot reach the Ray cluster at 127.0.0.1:{closed}"):
            start_router(config(0, 0), ray_address=f"127.0.0.1:{closed}")
        assert not ray.is_initialized()
    assert time.monotonic() - began < 10


def _live_actors() -> int:
    """Actors not dead, from the GCS (ray.util.state needs the dashboard, which tests leave out)."""
    import ray

    return sum(a["State"] != "DEAD" for a in ray._private.state.actors().values())


def test_workers_ray_cannot_place_are_named_and_start_up_stops_on_cancel(ray_cluster):
    """Workers needing 2 GPUs on a cluster with none kept `kvwire serve` waiting for good, silent and deaf
    to Ctrl-C; a CUDA device with no GPU ended in dead actors' tracebacks."""
    import threading
    import time

    from router.config import PoolConfig
    from router.serve import StartCancelled, StartError

    dummy = dict(load_format="dummy", model_shape="smollm2-135m", transport="inprocess")
    with pytest.raises(StartError, match="device cuda, but the Ray cluster has no GPU"):
        start_router(ServeConfig(router=RouterConfig(port=0, metrics_port=0),
                                 pools=(PoolConfig("g", device="cuda", **dummy),)))
    before = _live_actors()
    messages: list[str] = []
    cancel = threading.Event()
    result: dict = {}

    def start() -> None:
        try:
            start_router(ServeConfig(router=RouterConfig(port=0, metrics_port=0),
                                     pools=(PoolConfig("two-gpus", gpus_per_worker=2, device="cpu", **dummy),)),
                         progress=messages.append, cancel=cancel)
        except BaseException as exc:   # noqa: BLE001 - the test reads which
            result["error"] = exc

    thread = threading.Thread(target=start)
    thread.start()
    deadline = time.monotonic() + 30
    while sum("warning" in m for m in messages) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    warnings = [m for m in messages if "warning" in m]
    assert len(warnings) == 2 and all("needs GPU 2 on one node" in m for m in warnings)
    cancel.set()
    thread.join(60)
    assert not thread.is_alive() and isinstance(result.get("error"), StartCancelled)
    deadline = time.monotonic() + 20
    while _live_actors() > before and time.monotonic() < deadline:     # killed, not left pending
        time.sleep(0.2)
    assert _live_actors() <= before                  # (earlier tests' actors may still be dying)

