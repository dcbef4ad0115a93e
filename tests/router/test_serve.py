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
