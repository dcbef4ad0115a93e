"""The in-kernel E4M3/E2M1 codecs against torch, on the values where rounding is decided."""
import pytest
import torch
import triton
import triton.language as tl

from kvwire.kernels._common import e2m1_value, e4m3_decode, e4m3_encode, interpreting

pytestmark = pytest.mark.skipif(not interpreting(), reason="interpreter tests (TRITON_INTERPRET=1, set without CUDA)")


@triton.jit
def _enc_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    tl.store(o_ptr + i, e4m3_encode(x, False).to(tl.uint8), mask=i < n)


@triton.jit
def _dec_kernel(b_ptr, o_ptr, c_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(o_ptr + i, e4m3_decode(tl.load(b_ptr + i).to(tl.int32)))
    tl.store(c_ptr + tl.arange(0, 16), e2m1_value(tl.arange(0, 16)))


def _critical_values() -> torch.Tensor:
    finite = torch.arange(256, dtype=torch.uint8)
    finite = finite[(finite & 0x7F) != 0x7F].view(torch.float8_e4m3fn).float()
    pos = torch.unique(finite.abs())
    mids = (pos[1:] + pos[:-1]) / 2
    up = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    down = torch.nextafter(mids, torch.zeros_like(mids))
    rnd = torch.exp(torch.empty(20000).uniform_(-14, 6.2, generator=torch.Generator().manual_seed(0)))
    vals = torch.cat((pos, mids, up, down, rnd, torch.tensor([0.0, 447.9, 448.0, 449.0, 1e-30])))
    return torch.cat((vals, -vals, torch.tensor([-0.0])))


def test_e4m3_encode_bit_ops_match_torch():
    x = _critical_values()
    out = torch.empty(x.shape, dtype=torch.uint8)
    _enc_kernel[(triton.cdiv(x.numel(), 8192),)](x, out, x.numel(), BLOCK=8192)
    ref = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (out != ref).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} mismatches, e.g. x={x[bad[:5]].tolist()} got {out[bad[:5]].tolist()} want {ref[bad[:5]].tolist()}"


def test_e4m3_decode_and_e2m1_values():
    b = torch.arange(256, dtype=torch.uint8)
    out = torch.empty(256)
    codes = torch.empty(16)
    _dec_kernel[(1,)](b, out, codes, BLOCK=256)
    ref = b.view(torch.float8_e4m3fn).float()
    ok = ref.isnan() | (out == ref)
    assert bool(ok.all())
    assert torch.equal(torch.signbit(out[~ref.isnan()]), torch.signbit(ref[~ref.isnan()]))
    from kvwire.quant import E2M1_VALUES
    assert torch.equal(codes, E2M1_VALUES)
