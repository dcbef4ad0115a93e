"""The Llama block's small elementwise ops fused for the GPU: residual add + RMSNorm, and RoPE of q
and k with the split of the fused QKV projection, one launch each.

Why: a decode step of a small model is bound by launches (docs/benchmarks.md, "Decode step"). In
torch, RMSNorm is about eight kernels (upcast, square, mean, add, rsqrt, multiply, downcast,
weight) and RoPE about five per tensor: by that count, two norms, two residual adds and the RoPE
of q and k are ~28 of a layer's ~40 launches, and 3 here. That matters in eager mode and inside a
CUDA graph alike (each kernel still costs microseconds of GPU time). Counted, not yet timed.

Numerics follow the torch reference (``kvwire.model.llama``: HF's RMSNorm in float32, scaled in
the activation dtype; RoPE by rotate_half with cos/sin in the activation dtype), rounding to the
activation dtype where torch does, so outputs equal it up to the reduction order of the mean.
Those intermediate roundings go through ``rounded`` (integer round-to-nearest-even on the bits):
Triton folds a cast pair fp32 -> bf16 -> fp32 away and contracts what is left into FMAs, which
measured 1-ulp differences from torch in 23% of RoPE outputs on the H200 (2026-12-05).
The model uses these only on CUDA for bf16 and fp32 activations; elsewhere it keeps the torch ops.
Tests run them in the Triton interpreter and on the GPU against the references.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvwire.kernels._common import interpreting, rounded


def fused_ops_for(t: torch.Tensor) -> bool:
    """Whether the model should run these kernels for activations ``t`` (CUDA, compiled Triton,
    bf16 or fp32: the dtypes whose torch rounding ``rounded`` reproduces)."""
    return t.is_cuda and not interpreting() and t.dtype in (torch.bfloat16, torch.float32)


@triton.jit
def _add_rms_norm_kernel(h_ptr, d_ptr, w_ptr, hout_ptr, y_ptr, n_cols, s_h, s_d, s_ho, s_y, eps,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    dt = y_ptr.dtype.element_ty
    x = tl.load(h_ptr + row * s_h + cols, mask=m, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + row * s_d + cols, mask=m, other=0.0)
        h = rounded(x.to(tl.float32) + d.to(tl.float32), dt)
        tl.store(hout_ptr + row * s_ho + cols, h.to(dt), mask=m)
    else:
        h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / n_cols
    normed = rounded(h * tl.math.rsqrt(var + eps), dt)
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    tl.store(y_ptr + row * s_y + cols, rounded(w.to(tl.float32) * normed, dt).to(dt), mask=m)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h + delta, RMSNorm(h + delta) * weight) for h, delta [N, C]; ``delta`` None: (h, RMSNorm(h))."""
    if h.dim() != 2 or h.stride(1) != 1 or (delta is not None and (delta.shape != h.shape or delta.stride(1) != 1)):
        raise ValueError(f"expected row-contiguous [N, C] activations, got {tuple(h.shape)} strides {h.stride()}")
    n, c = h.shape
    y = torch.empty_like(h)
    hout = torch.empty_like(h) if delta is not None else h
    if n:
        _add_rms_norm_kernel[(n,)](h, delta if delta is not None else h, weight, hout, y, c, h.stride(0),
                                   delta.stride(0) if delta is not None else 0, hout.stride(0), y.stride(0), eps,
                                   HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(c),
                                   num_warps=4 if c <= 2048 else 8)
    return hout, y


@triton.jit
def _rope_split_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, s_qkv, s_cos,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr):
    n = tl.program_id(0)
    j = tl.program_id(1)                        # head: q heads, then k heads, then v heads
    dt = q_ptr.dtype.element_ty
    o = tl.arange(0, HALF)
    src = qkv_ptr + n * s_qkv + j * D
    x1 = tl.load(src + o)
    x2 = tl.load(src + HALF + o)
    if j < HQ + HKV:
        c1 = tl.load(cos_ptr + n * s_cos + o).to(tl.float32)
        c2 = tl.load(cos_ptr + n * s_cos + HALF + o).to(tl.float32)
        s1 = tl.load(sin_ptr + n * s_cos + o).to(tl.float32)
        s2 = tl.load(sin_ptr + n * s_cos + HALF + o).to(tl.float32)
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1), rounded as torch rounds
        y1 = rounded(rounded(a1 * c1, dt) + rounded(-a2 * s1, dt), dt).to(dt)
        y2 = rounded(rounded(a2 * c2, dt) + rounded(a1 * s2, dt), dt).to(dt)
        if j < HQ:
            dst = q_ptr + (n * HQ + j) * D
        else:
            dst = k_ptr + (n * HKV + j - HQ) * D
        tl.store(dst + o, y1)
        tl.store(dst + HALF + o, y2)
    else:
        dst = v_ptr + (n * HKV + j - HQ - HKV) * D
        tl.store(dst + o, x1)
        tl.store(dst + HALF + o, x2)


def rope_split(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
               head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused QKV projection [N, (Hq + 2 Hkv) D] -> q [N, Hq, D], k, v [N, Hkv, D] (contiguous),
    RoPE on q and k; cos/sin [N, D] in the activation dtype."""
    n = qkv.shape[0]
    if qkv.shape != (n, (num_heads + 2 * num_kv_heads) * head_dim) or qkv.stride(1) != 1:
        raise ValueError(f"qkv must be row-contiguous [N, {(num_heads + 2 * num_kv_heads) * head_dim}], "
                         f"got {tuple(qkv.shape)}")
    if head_dim % 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
    if cos.shape != (n, head_dim) or sin.shape != cos.shape or cos.stride() != sin.stride() or cos.stride(1) != 1:
        raise ValueError(f"cos/sin must be row-contiguous [{n}, {head_dim}] alike, got {tuple(cos.shape)}")
    q = qkv.new_empty((n, num_heads, head_dim))
    k = qkv.new_empty((n, num_kv_heads, head_dim))
    v = qkv.new_empty((n, num_kv_heads, head_dim))
    if n:
        _rope_split_kernel[(n, num_heads + 2 * num_kv_heads)](
            qkv, cos, sin, q, k, v, qkv.stride(0), cos.stride(0),
            HQ=num_heads, HKV=num_kv_heads, D=head_dim, HALF=head_dim // 2, num_warps=1)
    return q, k, v
