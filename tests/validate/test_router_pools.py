"""The router backend checks every requested format against the router's pools before any cell runs.

A real gRPC server in this process answers ListPools with the router's own response type (starting
`kvwire serve` takes Ray and a model per pool; the pools are all this check reads) and counts the
Generate calls that must not come."""
from concurrent import futures

import grpc
import pytest

from kvwire.validate.backends import BackendError, RouterBackend
from router.api import router_pb2 as pb
from router.api import router_pb2_grpc as pb_grpc


class PoolsOnly(pb_grpc.RouterServicer):
    def __init__(self, formats: tuple[str, ...]) -> None:
        self.formats = formats
        self.generate_calls = 0

    def ListPools(self, request, context):
        return pb.ListPoolsResponse(pools=[pb.PoolInfo(name=f"p-{f}", kv_format=f, bytes_per_token=100.0 / (i + 1),
                                                       bf16_bytes_per_token=100.0, page_size=16)
                                           for i, f in enumerate(self.formats)])

    def Generate(self, request, context):
        self.generate_calls += 1
        context.abort(grpc.StatusCode.UNAVAILABLE, "this test router generates nothing")


@pytest.fixture()
def router():
    """(target, servicer) of a router serving bf16 and fp8-token pools."""
    servicer = PoolsOnly(("bf16", "fp8-token"))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_RouterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


def test_missing_pools_are_named_together_at_start(router):
    target, _ = router
    with pytest.raises(BackendError) as err:
        RouterBackend(target, formats=("bf16", "nvfp4", "fp8-token", "fp8-token/nvfp4"))
    msg = str(err.value)
    assert "no pool for nvfp4, fp8-token/nvfp4" in msg and "it serves bf16, fp8-token" in msg
    backend = RouterBackend(target, formats=("bf16", "fp8-token"))
    try:
        assert backend.bytes_per_token("fp8-token") == 50.0
    finally:
        backend.close()


def test_cli_refuses_before_any_cell(router, tmp_path, capsys):
    from kvwire.cli import main

    target, servicer = router
    out = tmp_path / "v"
    code = main(["validate", "--backend", "router", "--target", target, "--formats", "nvfp4", "--lengths", "1024",
                 "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no pool for nvfp4" in err, err
    assert servicer.generate_calls == 0, "no prompt reached the router"
    assert not (out / "results.json").exists()
