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
