"""The fused block ops compiled for the GPU against the torch ops on the same GPU: with hardware
round-to-nearest casts the bf16 results agree to the reduction order of the mean (1 ulp), and the
model picks the kernels on CUDA by itself."""
import pytest
import torch

from kvwire.kernels import model_ops
from kvwire.model import llama

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = "cuda"
ULP = dict(rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("rows,cols", [(1, 576), (300, 4096), (17, 100)])
def test_add_rms_norm_on_the_gpu(rows, cols):
    gen = torch.Generator(DEV).manual_seed(rows)
    h = (torch.randn((rows, cols), generator=gen, device=DEV) * 3).to(torch.bfloat16)
    delta = torch.randn((rows, cols), generator=gen, device=DEV).to(torch.bfloat16)
    weight = (torch.randn(cols, generator=gen, device=DEV) + 1).to(torch.bfloat16)
    for d in (delta, None):
        got = model_ops.add_rms_norm(h, d, weight, 1e-5)
        want = llama.add_rms_norm(h, d, weight, 1e-5)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], **ULP)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (32, 8, 128)])
def test_rope_split_on_the_gpu(heads, kv_heads, head_dim):
    gen = torch.Generator(DEV).manual_seed(heads)
    n = 257
    qkv = (torch.randn((n, (heads + 2 * kv_heads) * head_dim), generator=gen, device=DEV) * 2).to(torch.bfloat16)
    angles = torch.rand((n, head_dim // 2), generator=gen, device=DEV) * 1000
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    for got, want in zip(model_ops.rope_split(qkv, cos, sin, heads, kv_heads, head_dim),
                         llama.rope_split(qkv, cos, sin, heads, kv_heads, head_dim)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_model_takes_the_kernels_on_cuda():
    h = torch.zeros((2, 8), device=DEV, dtype=torch.bfloat16)
    assert llama.block_ops(h, 64) == (model_ops.add_rms_norm, model_ops.rope_split)
    assert llama.block_ops(h, 80) == (model_ops.add_rms_norm, llama.rope_split)
    assert llama.block_ops(h.cpu(), 64) == (llama.add_rms_norm, llama.rope_split)
