"""write_pages (Triton, interpreter) is bit-identical to quantize_pages + storing into section views."""
import pytest
import torch

from kvwire.kernels import cuda_emulator
from kvwire.kernels._common import interpreting
from kvwire.kernels.quantize import write_page_layers, write_pages, write_pages_reference
from kvwire.quant import NonFiniteCount, NonFiniteInputError

from .helpers import ALL_UNIFORM, make_format, random_kv

pytestmark = pytest.mark.skipif(not interpreting(), reason="interpreter tests (TRITON_INTERPRET=1, set without CUDA)")


def _check(name, dtype, heads=3, head_dim=64, page_size=16, n=5, layer=1, seed=0, edit=None):
    gen = torch.Generator().manual_seed(seed)
    f = make_format(name, page_size=page_size, layers=2, heads=heads, head_dim=head_dim)
    storage = torch.randint(0, 256, (12, f.page_bytes), dtype=torch.uint8, generator=gen)
    expect = storage.clone()
    ids = torch.randperm(12, generator=gen)[:n]
    static = torch.rand((2, heads), generator=gen) * 0.01 + 0.001
    for part in (0, 1):
        x = random_kv((n, page_size, heads, head_dim), gen)
        if edit is not None:
            edit(x)
        x = x.to(dtype)
        write_pages(storage, f, layer, part, ids, x, static[part])
        write_pages_reference(expect, f, layer, part, ids, x, static[part])
    diff = (storage != expect).sum().item()
    assert diff == 0, f"{name} {dtype}: {diff} bytes differ"


@pytest.mark.parametrize("name", ALL_UNIFORM)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bit_identical(name, dtype):
    _check(name, dtype)


def _edge_values(x):
    x[0] = 0.0                       # an all-zero page: scales 1.0, codes 0
    x[1, 3] = 0.0                    # all-zero tokens
    x[1, 4, :, :16] = 0.0            # an all-zero NVFP4 block
    x[2] *= 1e-7                     # tiny values: E4M3 subnormals, block scales that round to 0
    x[2, 0, 0, 0] = 3.0              # ... next to a large one in the same page
    x[3] *= 1e4                      # large values
    x[4, :, :, 1::2] = -0.0          # negative zeros


@pytest.mark.parametrize("name", ["fp8-token", "fp8-page", "fp8-tensor", "nvfp4", "bf16"])
def test_edge_values(name):
    _check(name, torch.float32, edit=_edge_values)


def _underflowing_scales(x):
    x[0] *= 1e-44                    # fp32 subnormals: amax / 448 (and / 2688) round to 0
    x[1, 2] *= 1e-44                 # one such token in an ordinary page


@pytest.mark.parametrize("name", ["fp8-token", "fp8-page", "nvfp4"])
def test_scales_that_underflow_store_zeros_not_nan(name):
    """A quotient amax / limit of 0 used to store 0/0 = NaN codes (and Triton other bytes than the
    reference): such a group takes scale 1, as an all-zero one does, and decodes to zeros."""
    from kvwire.quant import dequantize_pages, quantize_pages

    _check(name, torch.float32, n=2, edit=_underflowing_scales)
    f = make_format(name, page_size=16, layers=1, heads=3, head_dim=64).kv.key
    x = random_kv((2, 16, 3, 64), torch.Generator().manual_seed(1))
    _underflowing_scales(x)
    back = dequantize_pages(quantize_pages(x, f), f)
    assert not back.isnan().any()
    assert (back[0] == 0).all() and (back[1, 2] == 0).all()


def test_mixed_format_parts_and_head_dim_128():
    _check("fp8-token/nvfp4", torch.bfloat16, heads=2, head_dim=128, n=3)
    _check("nvfp4/fp8-head", torch.bfloat16, heads=2, head_dim=128, n=3, page_size=8)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_raises(bad):
    f = make_format("nvfp4")
    storage = torch.zeros((4, f.page_bytes), dtype=torch.uint8)
    x = torch.randn(2, 16, 2, 64, generator=torch.Generator().manual_seed(0))
    x[1, 5, 0, 7] = bad
    with pytest.raises(NonFiniteInputError, match="1 non-finite"):
        write_pages(storage, f, 0, 0, torch.tensor([0, 3]), x)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_deferred_non_finite_count_adds_up_over_writes(backend):
    """With ``nonfinite`` the writes do not raise (or sync); one check afterwards sees them all."""
    if backend == "cuda" and not cuda_emulator.available():
        pytest.skip("the CUDA kernel runs on the CPU in the emulator, which needs g++ on x86-64")
    f = make_format("nvfp4", heads=2, head_dim=128)
    storage = torch.zeros((6, f.page_bytes), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(1)
    count = NonFiniteCount("cpu")
    for ids, bad in (([0, 3], [(1, 5, 0, 7)]), ([1, 2], []), ([4, 5], [(0, 0, 1, 127), (1, 15, 0, 0)])):
        x = random_kv((2, 16, 2, 128), gen).to(torch.bfloat16)
        for i, where in enumerate(bad):
            x[where] = (float("nan"), float("inf"))[i % 2]
        write_pages(storage, f, 0, 0, torch.tensor(ids), x, nonfinite=count, backend=backend)
    with pytest.raises(NonFiniteInputError, match="3 non-finite"):
        count.raise_if_any()
    count.raise_if_any()                       # the check resets the count
    with pytest.raises(ValueError, match="check_finite=True"):
        write_pages(storage, f, 0, 0, torch.tensor([0]), x[:1], nonfinite=count, check_finite=False)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("name", ["nvfp4", "fp8-token/nvfp4", "fp8-page", "fp8-tensor/nvfp4"])
def test_write_page_layers_equals_a_write_per_layer(backend, name):
    """All layers in one call (each section of layer l at its layer stride from layer 0's), from
    strided bf16 tails as the runner passes them; static-scale parts take one call per layer."""
    if backend == "cuda" and not cuda_emulator.available():
        pytest.skip("the CUDA kernel runs on the CPU in the emulator, which needs g++ on x86-64")
    gen = torch.Generator().manual_seed(3)
    f = make_format(name, layers=3, heads=2, head_dim=128)
    storage = torch.randint(0, 256, (10, f.page_bytes), dtype=torch.uint8, generator=gen)
    expect = storage.clone()
    ids = torch.randperm(10, generator=gen)[:4]
    static = torch.rand((3, 2, 2), generator=gen) * 0.01 + 0.001
    for part in (0, 1):
        tails = random_kv((4, 3, 2, 16, 128), gen).to(torch.bfloat16)        # [n, layers, H, P, D]
        write_page_layers(storage, f, part, ids, tails.transpose(2, 3), static, backend=backend)
        for layer in range(3):
            write_pages_reference(expect, f, layer, part, ids, tails[:, layer].transpose(1, 2), static[layer, part])
    assert torch.equal(storage, expect)


def test_static_scale_required():
    f = make_format("fp8-head")
    storage = torch.zeros((2, f.page_bytes), dtype=torch.uint8)
    with pytest.raises(ValueError, match="static scale"):
        write_pages(storage, f, 0, 0, torch.tensor([0]), torch.ones(1, 16, 2, 64))
