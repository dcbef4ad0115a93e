"""Backend choice of quantise-on-write on the CPU: "auto" never picks the CUDA kernel here, "cuda"
runs it in the warp emulator under the interpreter and says why not elsewhere, and its scope is
what the docstring says (its bytes are checked in test_cuda_emulator.py and, on the GPU, in
test_gpu_cuda_quantize.py)."""
import pytest
import torch

from kvwire.kernels import quantize_cuda
from kvwire.kernels.quantize import write_pages, write_pages_reference

from .helpers import make_format, random_kv


def _args(name="nvfp4"):
    gen = torch.Generator().manual_seed(0)
    f = make_format(name, page_size=16, layers=1, heads=2, head_dim=64)
    storage = torch.randint(0, 256, (6, f.page_bytes), dtype=torch.uint8, generator=gen)   # poisoned
    x = random_kv((3, 16, 2, 64), gen).to(torch.bfloat16)
    return storage, f, 0, 0, torch.tensor([4, 0, 2]), x


def test_cuda_backend_on_cpu_raises_with_the_reason(monkeypatch):
    args = _args()
    with pytest.raises(ValueError, match="CUDA quantise kernel does not cover"):        # fp32: out of scope
        write_pages(*args[:-1], args[-1].float(), backend="cuda")
    import kvwire.kernels.quantize as qz
    monkeypatch.setattr(qz, "use_triton", lambda t: False)                               # no interpreter
    with pytest.raises(ValueError, match="CUDA quantise kernel needs CUDA tensors"):
        write_pages(*args, backend="cuda")


def test_unknown_backend_raises():
    with pytest.raises(ValueError, match="backend must be"):
        write_pages(*_args(), backend="cutlass")


def test_auto_on_cpu_writes_the_reference_bytes(monkeypatch):
    from kvwire.kernels import cuda_emulator
    monkeypatch.setattr(cuda_emulator, "load_emulated", lambda *a, **k: pytest.fail("auto built an emulated kernel"))
    args = _args()
    expect = args[0].clone()
    write_pages(*args)
    write_pages_reference(expect, *args[1:])
    assert torch.equal(args[0], expect)


class _FakeCuda:
    """Only the attributes supports() reads, on a (pretend) CUDA device."""

    is_cuda = True
    device = torch.device("cuda", 0)

    def __init__(self, dtype=torch.bfloat16, strides=(8192, 512, 64, 1), ptr=0x1000):
        self.dtype, self._strides, self._ptr = dtype, strides, ptr

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def data_ptr(self):
        return self._ptr


@pytest.mark.parametrize("name,page_size,head_dim,x,ok", [
    ("nvfp4", 16, 128, _FakeCuda(), True), ("fp8-token", 16, 64, _FakeCuda(), True),
    ("fp8-tensor", 32, 64, _FakeCuda(), True), ("bf16", 16, 128, _FakeCuda(), False),
    ("fp8-page", 16, 96, _FakeCuda(), False), ("fp8-page", 2, 64, _FakeCuda(), False),
    ("fp8-page", 2, 128, _FakeCuda(), True), ("nvfp4", 2, 128, _FakeCuda(), False),
    ("nvfp4", 16, 128, _FakeCuda(dtype=torch.float32), False),
    ("nvfp4", 16, 128, _FakeCuda(strides=(8192, 512, 64, 2)), False),
    ("nvfp4", 16, 128, _FakeCuda(strides=(8196, 512, 64, 1)), False),
    ("nvfp4", 16, 128, _FakeCuda(ptr=0x1008), False)])
def test_supports_covers_the_documented_scope(name, page_size, head_dim, x, ok, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    f = make_format(name, page_size=page_size, layers=1, heads=8, head_dim=head_dim)
    assert quantize_cuda.supports(f, 0, x, _FakeCuda()) is ok


def test_kernel_source_and_entry_point_exist():
    """kernel_for compiles SOURCE's KERNEL on the GPU only; a rename must fail here on the CPU too."""
    from kvwire.kernels.nvrtc import CUDA_SOURCE_DIR
    text = (CUDA_SOURCE_DIR / quantize_cuda.SOURCE).read_text()
    assert f'extern "C" __global__ void __launch_bounds__(TPT) {quantize_cuda.KERNEL}(' in text


def test_kernel_includes_name_shared_headers():
    """NVRTC sees no file system: every ``#include`` of a kernel or header must be a header nvrtc.py hands it."""
    import re

    from kvwire.kernels.nvrtc import CUDA_SOURCE_DIR, shared_headers
    headers = shared_headers()
    for src in [*CUDA_SOURCE_DIR.glob("*.cu"), *CUDA_SOURCE_DIR.glob("*.cuh")]:
        for name in re.findall(r'#include\s+"([^"]+)"', src.read_text()):
            assert name in headers, f"{src.name} includes {name}, which is not in {sorted(headers)}"


def test_auto_falls_back_once_nvrtc_cannot_load(monkeypatch):
    """A machine without NVRTC (a failure the CPU suite cannot cause otherwise): "auto" warns once,
    then stays on Triton for every kernel without trying again; "cuda" still raises."""
    from kvwire.kernels import nvrtc
    monkeypatch.setattr(nvrtc, "UNAVAILABLE", [])
    tries = []

    def build():
        tries.append(1)
        raise nvrtc.NvrtcUnavailableError("no libnvrtc here")

    with pytest.warns(RuntimeWarning, match="quantise-on-write falls back to Triton: no libnvrtc here"):
        assert nvrtc.choose("auto", True, build, lambda: "", "quantise-on-write") is None
    assert nvrtc.choose("auto", True, build, lambda: "", "paged decode") is None
    assert len(tries) == 1 and nvrtc.UNAVAILABLE == ["no libnvrtc here"]
    assert nvrtc.choose("triton", True, build, lambda: "", "x") is None
    with pytest.raises(ValueError, match="not covered"):
        nvrtc.choose("cuda", False, build, lambda: "not covered", "x")
