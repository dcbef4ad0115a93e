"""Backend choice of paged decode on the CPU: "auto" never picks the CUDA kernel here, "cuda" runs it
in the warp emulator under the interpreter and says why not elsewhere (its numerics are checked in
test_cuda_emulator.py and, on the GPU, in test_gpu_cuda_decode.py)."""
import pytest
import torch

from kvwire.kernels import paged_decode_cuda
from kvwire.kernels.paged_decode import paged_decode_attention, paged_decode_reference

from .helpers import make_format, make_pool, rel_err


def _args(name="fp8-token/nvfp4"):
    gen = torch.Generator().manual_seed(0)
    f = make_format(name, page_size=16, layers=1, heads=2, head_dim=64)
    storage, static = make_pool(f, 8, gen)
    q = torch.randn((1, 8, 64), generator=gen)
    tail = torch.randn((1, 1, 2, 2, 16, 64), generator=gen).to(torch.bfloat16)
    return (q, storage, f, 0, torch.tensor([[3, 1, 6]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32),
            tail, torch.tensor([0], dtype=torch.int32), torch.tensor([9], dtype=torch.int32), static)


def test_cuda_backend_on_cpu_raises_with_the_reason(monkeypatch):
    with pytest.raises(ValueError, match="does not cover format bf16/nvfp4"):
        paged_decode_attention(*_args("bf16/nvfp4"), backend="cuda")
    import kvwire.kernels.paged_decode as pd
    monkeypatch.setattr(pd, "use_triton", lambda t: False)                               # no interpreter
    with pytest.raises(ValueError, match="does not cover .* on cpu"):
        paged_decode_attention(*_args(), backend="cuda")


def test_cuda_backend_refuses_misaligned_storage():
    """Pages are read with 16-byte loads (and bulk copies): a storage view 8 bytes off gets a clear
    error. (The GPU twin is in test_gpu_cuda_decode.py; this one runs in CI, in the emulator.)"""
    args = list(_args("fp8-token"))
    storage = args[1]
    raw = torch.randint(0, 256, (storage.numel() + 16,), dtype=torch.uint8)
    shifted = raw[8:8 + storage.numel()].view_as(storage)
    shifted.copy_(storage)
    args[1] = shifted
    with pytest.raises(ValueError, match="16-byte aligned"):
        paged_decode_attention(*args, backend="cuda")


def test_unknown_backend_raises():
    with pytest.raises(ValueError, match="backend must be"):
        paged_decode_attention(*_args(), backend="cutlass")


def test_auto_on_cpu_matches_the_reference(monkeypatch):
    from kvwire.kernels import cuda_emulator
    monkeypatch.setattr(cuda_emulator, "load_emulated", lambda *a, **k: pytest.fail("auto built an emulated kernel"))
    args = _args()
    assert rel_err(paged_decode_attention(*args), paged_decode_reference(*args)) < 1e-4


@pytest.mark.parametrize("name,page_size,head_dim,q_heads,ok", [
    ("fp8-token/nvfp4", 16, 128, 32, True), ("bf16/nvfp4", 16, 128, 32, False), ("nvfp4", 32, 128, 32, True),
    ("nvfp4", 64, 128, 32, True), ("nvfp4", 48, 128, 32, False), ("nvfp4", 8, 128, 32, False),
    ("fp8-token", 128, 128, 32, False), ("fp8-token", 16, 96, 32, False), ("fp8-token", 16, 128, 80, False),
    ("fp8-tensor", 16, 64, 8, True)])
def test_supports_covers_the_documented_scope(name, page_size, head_dim, q_heads, ok, monkeypatch):
    """``supports`` on a (pretend) sm_90 device: compact K and V, P = 16, 32 or 64, D 64/128, G <= 8."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))

    class FakeCudaQ:                       # only the attributes supports() reads
        is_cuda = True
        dtype = torch.bfloat16
        device = torch.device("cuda", 0)

        @staticmethod
        def stride(dim):
            return 1

    f = make_format(name, page_size=page_size, layers=1, heads=8, head_dim=head_dim)
    assert paged_decode_cuda.supports(f, q_heads, FakeCudaQ()) is ok


def test_kernel_source_and_entry_point_exist():
    """kernel_for compiles SOURCE's KERNEL on the GPU only; a rename must fail here on the CPU too."""
    from kvwire.kernels.nvrtc import CUDA_SOURCE_DIR
    text = (CUDA_SOURCE_DIR / paged_decode_cuda.SOURCE).read_text()
    assert f'extern "C" __global__ void __launch_bounds__(NT, MINB) {paged_decode_cuda.KERNEL}(' in text


def test_tuning_layers_defaults_format_entries_and_overrides(monkeypatch):
    from kvwire.formats import ElementType
    f = make_format("nvfp4")
    monkeypatch.setattr(paged_decode_cuda, "FORMAT_TUNING", {(ElementType.NVFP4, ElementType.NVFP4): {"DEPTH": 3}})
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {})
    assert paged_decode_cuda.tuning_for(f) == {**paged_decode_cuda.DEFAULT_TUNING, "DEPTH": 3}
    assert paged_decode_cuda.tuning_for(make_format("fp8-token")) == paged_decode_cuda.DEFAULT_TUNING
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {"DEPTH": 4, "PREF": 1})
    assert paged_decode_cuda.tuning_for(f) == {**paged_decode_cuda.DEFAULT_TUNING, "DEPTH": 4, "PREF": 1}


def test_deep_grids_stage_only_fp8_token_pages(monkeypatch):
    """The staged ring is picked for fp8-token pages (K and V) only, and an explicit STAGES wins."""
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {})
    assert paged_decode_cuda.deep_grid_stages(make_format("fp8-token")) == paged_decode_cuda.DEEP_GRID_STAGES > 0
    for name in ("fp8-tensor", "fp8-page", "nvfp4", "fp8-token/nvfp4", "nvfp4/fp8-token", "fp8-page/fp8-token"):
        assert paged_decode_cuda.deep_grid_stages(make_format(name)) == 0, name
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {"STAGES": 0})
    assert paged_decode_cuda.deep_grid_stages(make_format("fp8-token")) == 0
    monkeypatch.setattr(paged_decode_cuda, "TUNING", {"WHOLEPAGE": 1})
    assert paged_decode_cuda.deep_grid_stages(make_format("fp8-token")) == 0


def test_decode_kernels_pick_the_staged_ring_from_the_grid_depth():
    from kvwire.kernels.nvrtc import CudaKernel
    regular, deep = CudaKernel(None, None, 96, {"NW": 4}), CudaKernel(None, None, 88, {"NW": 4})
    both = paged_decode_cuda.DecodeKernels(regular, deep, deep_grid_blocks=3960)
    assert both.for_launch(495, 1, 8) is deep                  # 495 x 8 blocks
    assert both.for_launch(494, 1, 8) is regular
    assert paged_decode_cuda.DecodeKernels(regular).for_launch(10**6, 1, 8) is regular
    # whole-page blocks hold NW KV heads: a quarter of the blocks for the same launch
    whole = CudaKernel(None, None, 88, {"NW": 4, "WHOLEPAGE": 1})
    assert paged_decode_cuda.DecodeKernels(regular, whole, deep_grid_blocks=3960).for_launch(495, 1, 8) is regular
    assert paged_decode_cuda.DecodeKernels(regular, whole, deep_grid_blocks=3960).for_launch(1980, 1, 8) is whole


def test_whole_page_blocks_take_a_divisor_of_the_kv_heads():
    assert [paged_decode_cuda.heads_per_block(h, 4) for h in (1, 2, 3, 4, 6, 8, 9, 32)] == [1, 2, 3, 4, 3, 4, 3, 4]
    assert paged_decode_cuda.heads_per_block(8, 8) == 8
    from kvwire.kernels.nvrtc import CudaKernel
    assert paged_decode_cuda.grid(CudaKernel(None, None, 96, {"NW": 3, "WHOLEPAGE": 1}), 5, 2, 9) == (5, 6, 1)
    assert paged_decode_cuda.grid(CudaKernel(None, None, 96, {"NW": 4}), 5, 2, 9) == (5, 18, 1)


def test_default_splits_match_the_h200_sweeps(monkeypatch):
    """The split policy as the H200 sweeps printed it (docs/bench-runs/2026-12-04g-decode-wholepage-*):
    blocks of one KV head (4 warps, 5 blocks/SM) and whole-page blocks (a warp per head). The SM
    count is the one thing taken from the device, so the H200's 132 is stood in for it here."""
    from types import SimpleNamespace

    from kvwire.kernels.nvrtc import CudaKernel
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    head = CudaKernel(None, None, 96, {"NW": 4}, {(128, 0): 5})
    whole = CudaKernel(None, None, 96, {"NW": 4, "WHOLEPAGE": 1}, {(128, 0): 5})
    for kernel, expect in ((head, {(32, 2048): 18, (8, 2048): 41, (1, 2048): 64, (16, 8192): 36, (64, 512): 9}),
                           (whole, {(32, 2048): 41, (8, 2048): 41, (1, 2048): 252, (16, 8192): 41, (64, 512): 36})):
        got = {(b, pages): paged_decode_cuda.default_splits(kernel, b, 8, pages, "cuda") for b, pages in expect}
        assert got == expect, kernel.defines
