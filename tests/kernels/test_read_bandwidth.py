"""The read pass of `kvwire bench attention` (kvwire/bench/read_bandwidth.py) against its torch
reference: fresh random data, the output poisoned first, in the interpreter and on the GPU."""
import pytest
import torch

from kvwire.bench.read_bandwidth import TILE, tile_maxima, tile_maxima_reference
from kvwire.kernels._common import interpreting


def check(device: str, tiles: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tiles * TILE, generator=gen).to(device)
    out = torch.full((tiles,), float("nan"), device=device)
    tile_maxima(x, out)
    assert torch.equal(out, tile_maxima_reference(x))


@pytest.mark.skipif(not interpreting(), reason="interpreter test (TRITON_INTERPRET=1, set without CUDA)")
@pytest.mark.parametrize("tiles,seed", [(1, 0), (3, 1)])
def test_tile_maxima_in_the_interpreter(tiles, seed):
    check("cpu", tiles, seed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tile_maxima_on_the_gpu():
    check("cuda", 257, 2)


@pytest.mark.parametrize("x", [torch.zeros(TILE, dtype=torch.bfloat16), torch.zeros(TILE + 1),
                               torch.zeros(2, TILE).t()])
def test_tile_maxima_rejects_what_it_cannot_read(x):
    with pytest.raises(ValueError, match="contiguous fp32"):
        tile_maxima(x)


@pytest.mark.skipif(not interpreting(), reason="records the launch in the interpreter (CPU runs)")
def test_the_read_pass_builds_for_hopper_and_ampere(monkeypatch):
    from kvwire.bench import read_bandwidth

    from .offline_build import Recorder, build_all
    rec = Recorder(read_bandwidth._tile_max_kernel)
    monkeypatch.setattr(read_bandwidth, "_tile_max_kernel", rec)
    tile_maxima(torch.randn(2 * TILE))
    (launch,) = rec.launches
    assert all("error" not in r for r in build_all([(launch, (9, 0)), (launch, (8, 0))]))
