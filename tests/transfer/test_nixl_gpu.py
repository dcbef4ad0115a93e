"""NIXL with VRAM pools (CUDA tensors): push and pull between two agents on one GPU, and
DRAM <-> VRAM. Skipped without CUDA; the CPU suite covers the same paths on DRAM."""
from __future__ import annotations

import pytest
import torch

from tests.transfer.pools import random_pool, unique

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("nixl", reason="nixl is not installed")

from transfer import MemoryType, TransferState  # noqa: E402
from transfer.nixl_transport import NixlTransport  # noqa: E402


@pytest.mark.parametrize("devices", [("cuda", "cuda"), ("cpu", "cuda")])
def test_vram_push_and_pull(fmt, devices) -> None:
    a, b = NixlTransport(unique("gpu-a")), NixlTransport(unique("gpu-b"))
    pool_a = random_pool(fmt, 16, seed=1).to(devices[0])
    pool_b = torch.zeros((16, fmt.page_bytes), dtype=torch.uint8, device=devices[1])
    a.register_pool(pool_a, fmt)
    b.register_pool(pool_b, fmt)
    assert b.handshake().pool.memory_type is MemoryType.VRAM
    a.add_peer(b.handshake())
    b.add_peer(a.handshake())
    try:
        assert a.write_pages(b.name, [0, 1, 5], [2, 3, 9], deadline_s=30).wait(30) is TransferState.DONE
        torch.cuda.synchronize()
        assert torch.equal(pool_b[[2, 3, 9]].cpu(), pool_a[[0, 1, 5]].cpu())
        assert b.read_pages(a.name, [7, 8], [0, 1], deadline_s=30).wait(30) is TransferState.DONE
        torch.cuda.synchronize()
        assert torch.equal(pool_b[[0, 1]].cpu(), pool_a[[7, 8]].cpu())
    finally:
        a.close()
        b.close()
