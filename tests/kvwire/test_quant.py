"""Exactness of the reference quantisers on hand-computed values, and cross-checks."""
import warnings

import pytest
import torch

from kvwire.formats import PART_NAMES, Granularity
from kvwire.quant import (
    NonFiniteInputError, calibrate_static_scale, decode, e2m1_decode, e2m1_encode, encode,
    fp8_decode, fp8_encode, pack_nibbles, unpack_nibbles,
)


def test_fp8_hand_values():
    x = torch.tensor([1.0, 448.0, 500.0, -1e6, 1.0625, 1.1875, 2.0 ** -9, 2.0 ** -10,
                      3 * 2.0 ** -10, 0.0, -0.0, -2.0])
    bits = fp8_encode(x)
    assert bits.tolist() == [0x38, 0x7E, 0x7E, 0xFE, 0x38, 0x3A, 0x01, 0x00, 0x02, 0x00, 0x80, 0xC0]
    assert fp8_decode(bits).tolist() == [1.0, 448.0, 448.0, -448.0, 1.0, 1.25, 2.0 ** -9, 0.0,
                                         2.0 ** -8, 0.0, -0.0, -2.0]
    assert torch.signbit(fp8_decode(bits))[10]


def test_e2m1_rounding_ties_to_even_and_saturation():
    x = torch.tensor([0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 100.0,
                      0.26, 0.74, -0.0, -0.1, -5.0, -6.5])
    got = e2m1_decode(e2m1_encode(x))
    want = [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, 0.5, 0.5, -0.0, -0.0, -4.0, -6.0]
    assert got.tolist() == want
    assert torch.signbit(got[13]) and torch.signbit(got[14])


def test_nibble_packing_low_first():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    assert torch.equal(unpack_nibbles(packed), codes)


def test_fp8_token_equals_torch_cast_at_same_scale():
    torch.manual_seed(1)
    x = torch.randn(33, 3, 64) * torch.rand(33, 3, 1) * 10
    enc = encode(x, "fp8-token")
    scale = x.abs().amax(dim=-1) / 448.0
    want = (x / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).permute(1, 0, 2)
    assert torch.equal(enc.sections["data"], want)
    assert torch.equal(enc.sections["token_scale"], scale.T)
    # E4M3 keeps 3 mantissa bits: relative error <= 1/16 for normals; subnormals (below 2^-6 of the
    # scale) have an absolute step of 2^-9 of the scale.
    assert torch.allclose(decode(enc), x, rtol=0.0625, atol=float(scale.max()) * 2.0 ** -10)


@pytest.mark.parametrize("name", PART_NAMES)
def test_roundtrip_error_bounds(name):
    torch.manual_seed(2)
    x = torch.randn(48, 4, 128)
    static = calibrate_static_scale(x, Granularity(name[4:])) if name in ("fp8-tensor", "fp8-head") else None
    y = decode(encode(x, name, static))
    rel = float((y - x).norm() / x.norm())
    bound = {"bf16": 0.005, "nvfp4": 0.12}.get(name, 0.04)
    assert rel < bound, rel
    assert y.shape == x.shape


def test_fp8_static_scale_saturates():
    x = torch.tensor([[[1.0, -3.0, 0.5, 2.0]]])
    y = decode(encode(x, "fp8-tensor", torch.tensor([1.0 / 448])))
    assert y.tolist() == [[[1.0, -1.0, 0.5, 1.0]]]


def test_nvfp4_hand_values():
    block0 = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -5, 0, -0.0, 0.5, 1.5, 3, 4]
    block1 = [2688.0] + [0.0] * 15                 # page amax 2688 -> global scale exactly 1
    block2 = [40.2] + [1.0] * 15                   # block scale 6.7 rounds to 6.5 in E4M3
    block3 = [-1e-6] + [0.0] * 15                  # far below the block scale's range: zero block
    x = torch.tensor([block0 + block1 + block2 + block3])[:, None, :]
    enc = encode(x, "nvfp4")
    assert enc.sections["global_scale"].tolist() == [1.0]
    assert fp8_decode(enc.sections["block_scale"]).tolist() == [[[1.0, 448.0, 6.5, 0.0]]]
    y = decode(enc)[0, 0]
    assert y[:16].tolist() == [6, 0, 1, 1, 2, 2, 4, 4, -0.0, -4, 0, -0.0, 0.5, 1.5, 3, 4]
    assert y[16].item() == 2688.0
    assert y[32].item() == 39.0                    # 40.2 / 6.5 = 6.18 saturates at code 6
    assert y[33].item() == 0.0                     # 1.0 / 6.5 = 0.15 rounds to code 0
    assert y[48:].abs().max().item() == 0.0


def test_zero_input_is_exact():
    for name in ("fp8-token", "fp8-page", "nvfp4"):
        x = torch.zeros(16, 2, 32)
        assert torch.equal(decode(encode(x, name)), x)


@pytest.mark.parametrize("name", ["fp8-token", "nvfp4", "bf16"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_is_a_clear_error(name, bad):
    x = torch.rand(4, 2, 32) + 0.5
    x[1, 1, 3] = bad
    with pytest.raises(NonFiniteInputError, match="non-finite"):
        encode(x, name)


def test_nvfp4_matches_torchao():
    pytest.importorskip("torchao")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
    torch.manual_seed(0)
    x = torch.randn(64, 1, 256) * torch.rand(64, 1, 16).repeat_interleave(16, dim=-1) * 3
    enc = encode(x, "nvfp4")
    glob = enc.sections["global_scale"]
    assert torch.equal(glob, x.abs().amax().reshape(1) / (6 * 448))
    scales, packed = nvfp4_quantize(x.reshape(64, 256).contiguous(), 16, glob)
    # Same bytes: block scales and packed codes (low nibble first in both).
    assert torch.equal(scales.view(torch.uint8).reshape(64, 16), enc.sections["block_scale"].reshape(64, 16))
    same = (packed.reshape(64, 128) == enc.sections["data"].reshape(64, 128)).float().mean().item()
    assert same > 0.999, same
    # Decoded values agree (torchao's codes decoded with the contract's value = code x (block x global)).
    vals = f4_unpacked_to_f32(unpack_uint4(packed)).reshape(64, 16, 16)
    theirs = (vals * (scales.float().reshape(64, 16, 1) * glob)).reshape(64, 1, 256)
    ours = decode(enc)
    assert (ours == theirs).float().mean().item() > 0.999
    assert torch.allclose(ours, theirs, rtol=0.35, atol=1e-6)
