"""The fused block ops (kvwire/kernels/model_ops.py) in the Triton interpreter against the torch ops
the model runs on the CPU: fresh random activations, fp32 and bf16, odd widths, strided rows.
The kernels round bf16 by integer ops (as on the GPU), so RoPE is exact; the norm differs by the
reduction order of its mean."""
import pytest
import torch
import triton
import triton.language as tl

from kvwire.kernels._common import interpreting
from kvwire.kernels import model_ops
from kvwire.kernels.model_ops import add_rms_norm, rope_split
from kvwire.model import llama
from kvwire.model.config import ModelConfig
from kvwire.model.llama import LlamaModel, dense_causal_attention
from kvwire.model.llama import add_rms_norm as add_rms_norm_reference
from kvwire.model.llama import rope_split as rope_split_reference

pytestmark = pytest.mark.skipif(not interpreting(), reason="interpreter tests (TRITON_INTERPRET=1, set without CUDA)")
TOL = {torch.float32: dict(rtol=2e-6, atol=2e-6), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def rand(shape, gen, dtype, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,cols", [(1, 576), (7, 64), (33, 100)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm(dtype, rows, cols, with_delta):
    gen = torch.Generator().manual_seed(rows * cols)
    h = rand((rows, cols + 8), gen, dtype, 3.0)[:, 3:cols + 3]            # strided rows
    delta = rand((rows, cols), gen, dtype, 0.5) if with_delta else None
    weight = rand((cols,), gen, dtype) + 1
    got_h, got = add_rms_norm(h, delta, weight, 1e-5)
    want_h, want = add_rms_norm_reference(h, delta, weight, 1e-5)
    torch.testing.assert_close(got_h, want_h, **TOL[dtype])
    torch.testing.assert_close(got, want, **TOL[dtype])
    if not with_delta:
        assert got_h is h


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 2, 16), (32, 8, 128)])
def test_rope_split(dtype, heads, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(heads * head_dim)
    n = 5
    qkv = rand((n, (heads + 2 * kv_heads) * head_dim), gen, dtype, 2.0)
    angles = torch.rand((n, head_dim // 2), generator=gen) * 100
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    # the kernel rounds each product and the sum as torch does (by integer ops, not the
    # interpreter's truncating cast), so the results are equal
    for got, want in zip(rope_split(qkv, cos, sin, heads, kv_heads, head_dim),
                         rope_split_reference(qkv, cos, sin, heads, kv_heads, head_dim)):
        assert got.is_contiguous() and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_non_finite_values_pass_through_like_torch():
    # the integer rounding must keep NaN a NaN and round past the bf16 maximum to inf, as a cast does
    gen = torch.Generator().manual_seed(11)
    qkv = rand((3, 4 * 16), gen, torch.bfloat16, 2.0)
    qkv[0, 1], qkv[1, 17], qkv[2, 5] = float("nan"), float("inf"), 3.3e38
    angles = torch.rand((3, 8), generator=gen) * 10
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    cos[2, 5] = 1.5                                              # 3.3e38 * 1.5 rounds past the bf16 maximum
    for got, want in zip(rope_split(qkv, cos, sin, 2, 1, 16), rope_split_reference(qkv, cos, sin, 2, 1, 16)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert rope_split(qkv, cos, sin, 2, 1, 16)[0][2, 0, 5].isinf()


@triton.jit
def _rounded_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o, mask=o < n)
    tl.store(y_ptr + o, model_ops.rounded(x, tl.bfloat16), mask=o < n)


def test_rounding_to_bf16_is_the_cast():
    # the GPU's canonical NaN (all mantissa bits set) would carry into the sign without the NaN guard
    gen = torch.Generator().manual_seed(12)
    x = torch.cat([torch.randn(200, generator=gen) * 10 ** torch.randint(-30, 30, (200,), generator=gen),
                   torch.tensor([float("inf"), -float("inf"), 3.4e38, -3.4e38, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8,
                                 -0.0, 1e-40])])
    bits = torch.cat([x.view(torch.int32), torch.tensor([0x7FFFFFFF, -1, 0x7F800001], dtype=torch.int32)])
    x = bits.view(torch.float32)
    y = torch.full_like(x, 7.0)
    _rounded_kernel[(1,)](x, y, x.numel(), BLOCK=256)
    torch.testing.assert_close(y, x.to(torch.bfloat16).float(), rtol=0, atol=0, equal_nan=True)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="row-contiguous"):
        add_rms_norm(torch.ones(4, 8).t(), None, torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="power of two"):
        rope_split(torch.ones(2, 5 * 12), torch.ones(2, 12), torch.ones(2, 12), 3, 1, 12)


def test_model_forward_with_the_fused_ops(monkeypatch):
    """The model's forward through the kernels (as on CUDA): in fp32 the torch path's logits; in
    bf16 as close to the fp32 logits as the torch bf16 path is (within 2x: the interpreter's bf16
    cast truncates)."""
    cfg = ModelConfig(name="tiny", vocab_size=97, hidden_size=96, intermediate_size=160, num_layers=3, num_heads=6,
                      num_kv_heads=2, head_dim=16, rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5,
                      max_context=128, tie_embeddings=True, bos_token_id=None)
    models = {dt: LlamaModel(cfg, dtype=dt, device="cpu") for dt in (torch.float32, torch.bfloat16)}
    models[torch.float32].init_random(seed=4, std=0.2)
    with torch.no_grad():
        for src, dst in zip(models[torch.float32].parameters(), models[torch.bfloat16].parameters()):
            dst.copy_(src)
    ids = torch.randint(1, 97, (11,), generator=torch.Generator().manual_seed(5))
    pos, rows = torch.arange(11), torch.tensor([3, 10])

    def attn(layer, q, k, v):
        return dense_causal_attention(q, k, v)

    torch_path = {dt: m(ids, pos, attn, logits_indices=rows) for dt, m in models.items()}
    monkeypatch.setattr(llama, "block_ops", lambda h, head_dim: (model_ops.add_rms_norm, model_ops.rope_split))
    fused = {dt: m(ids, pos, attn, logits_indices=rows) for dt, m in models.items()}
    exact = torch_path[torch.float32]
    torch.testing.assert_close(fused[torch.float32], exact, rtol=1e-5, atol=1e-5)
    torch_err = (torch_path[torch.bfloat16] - exact).abs().max().item()
    assert (fused[torch.bfloat16] - exact).abs().max().item() <= 2 * torch_err + 1e-3
