"""A GPU too old for a KV format's kernels is refused when the KV cache is created, with a clear
error, instead of failing inside a worker at the first prefill (Triton: "fp8e4nv data type is not
supported on CUDA arch < 89"). The GPU is faked: the check only asks torch for its capability."""
import pytest
import torch

from kvwire.kernels.device_support import UnsupportedDeviceError, check_device
from kvwire.kv_cache import KVCache

from .helpers import make_format

CUDA = torch.device("cuda")


def fake_gpu(monkeypatch, capability: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize("fmt", ["fp8-token", "nvfp4", "fp8-token/nvfp4", "bf16/fp8-tensor"])
def test_ampere_is_refused_for_compact_pages_and_told_about_bf16(monkeypatch, fmt):
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100-SXM4-80GB")
    with pytest.raises(UnsupportedDeviceError, match=r"A100.*\(sm_80\): its kernels need sm_89 .*use bf16 pages"):
        check_device(make_format(fmt), CUDA)
    with pytest.raises(UnsupportedDeviceError):               # before any CUDA allocation
        KVCache(make_format(fmt), num_pages=4, max_sequences=2, device="cuda")


def test_ampere_runs_bf16_pages_and_turing_runs_nothing(monkeypatch):
    fake_gpu(monkeypatch, (8, 6), "NVIDIA A10")
    check_device(make_format("bf16"), CUDA)
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    with pytest.raises(UnsupportedDeviceError, match=r"\(sm_75\): its kernels need sm_80 .*Ampere") as err:
        check_device(make_format("bf16"), CUDA)
    assert "use bf16 pages" not in str(err.value)
    with pytest.raises(UnsupportedDeviceError, match="need sm_89"):
        check_device(make_format("nvfp4"), CUDA)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_ada_hopper_and_newer_run_every_format(monkeypatch, capability):
    fake_gpu(monkeypatch, capability, "a GPU")
    for fmt in ("bf16", "fp8-tensor", "nvfp4", "fp8-token/nvfp4"):
        check_device(make_format(fmt), CUDA)


def test_cpu_is_not_asked_about(monkeypatch):
    def no_gpu(device=None):
        raise AssertionError("a CPU cache must not query CUDA")
    monkeypatch.setattr(torch.cuda, "get_device_capability", no_gpu)
    KVCache(make_format("nvfp4"), num_pages=2, max_sequences=1, device="cpu")
