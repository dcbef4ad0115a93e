"""KVCache's own checks (its pages and tails are covered by the page-pool and runner tests)."""
import pytest
import torch

from kvwire.kv_cache import KVCache
from tests.kernels.helpers import make_format


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_static_scales_must_be_finite_and_positive(bad):
    """A zero static scale stored 0/0 = NaN codes for every zero value; the manifest path already
    refused such scales, KVCache.set_static_scales now does too."""
    kv = KVCache(make_format("fp8-tensor"), num_pages=2, max_sequences=1, device="cpu")
    f = kv.format
    scales = torch.rand((f.num_layers, 2, f.num_kv_heads)) + 0.01
    kv.set_static_scales(scales)
    scales[0, 1, 0] = bad
    with pytest.raises(ValueError, match="finite and > 0"):
        kv.set_static_scales(scales)


def test_scales_given_to_the_constructor_are_checked_too():
    f = make_format("fp8-head")
    with pytest.raises(ValueError, match="finite and > 0"):
        KVCache(f, num_pages=2, max_sequences=1, device="cpu",
                static_scales=torch.zeros((f.num_layers, 2, f.num_kv_heads)))


def test_calibration_of_a_head_whose_kv_underflows_gives_scale_one():
    """calibrate_static_scales gave such a head scale 0, which set_static_scales now refuses (an
    engine on fp8-head would not start). A stand-in model feeds the attention hook: no real model
    gives K of 1e-44."""
    from types import SimpleNamespace

    from kvwire.calibration import calibrate_static_scales

    gen = torch.Generator().manual_seed(0)

    class TinyKV:
        config = SimpleNamespace(num_layers=1, num_kv_heads=3, vocab_size=50)
        device = torch.device("cpu")

        def __call__(self, ids, positions, attn, logits_indices):
            q = torch.randn((len(ids), 3, 16), generator=gen)
            k = torch.randn((len(ids), 3, 16), generator=gen) * torch.tensor([1.0, 1e-44, 0.0])[None, :, None]
            attn(0, q, k, torch.randn((len(ids), 3, 16), generator=gen))

    scales = calibrate_static_scales(TinyKV(), list(range(8)))
    assert scales[0, 0, 0] > 0.001 and scales[0, 0, 1:].tolist() == [1.0, 1.0]
    f = make_format("fp8-head", layers=1, heads=3, head_dim=16)
    KVCache(f, num_pages=2, max_sequences=1, device="cpu", static_scales=scales)
