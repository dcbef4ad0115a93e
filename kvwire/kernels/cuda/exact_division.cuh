// Correctly rounded x / s without div.rn per element, for many x over one scale s.
//
// The quantisers must equal the torch reference, which divides each element by its scale with IEEE
// rounding; div.rn costs ~10 instructions and a range check per element. With r = RN(1/s)
// computed once per scale,
//   q0 = RN(x r),   q_{i+1} = RN(q_i + RN(x - s q_i) r)
// gives RN(x / s) after two steps for any x (the last step is Markstein's theorem: q1 is faithful
// and r is within half an ulp of 1/s), and after ONE step for every x with at most 8 significant
// bits (bf16 values): checked exhaustively, all 2^7 x 2^23 significand pairs, on the GPU by
// tests/kernels/test_gpu_cuda_quantize.py. Both need no underflow or overflow on the way:
// div_fast_ok keeps to scales in [2^-80, 2^100], where every quotient that can change an
// E4M3/E2M1 code (|x/s| >= 2^-11) is computed without either; other scales use div.rn.
// DIVSTEPS (1 or 2) picks the number of steps; the kernels only divide bf16 values.
#pragma once
#ifndef DIVSTEPS
#define DIVSTEPS 2
#endif

#include "float_ops.cuh"

// rcp_rn(s) for s with div_fast_ok(s): the fast path of the compiler's own rcp.rn.f32 (approximate
// reciprocal, then one FMA correction, correctly rounded for every s whose exponent is not at the
// ends of the range), without its range check and slow-path branch, which div_fast_ok makes dead.
__device__ __forceinline__ float rcp_rn_in_range(float s) {
    const float r0 = rcp_approx_ftz(s);
    const float e = fma_rn(s, r0, -1.0f);
    return fma_rn(r0, -e, r0);
}
// RN(x / s) for s with div_fast_ok(s) and r = rcp_rn(s).
__device__ __forceinline__ float div_fast(float x, float s, float r) {
    float q = mul_rn(x, r);
    q = fma_rn(fma_rn(-s, q, x), r, q);
#if DIVSTEPS >= 2
    q = fma_rn(fma_rn(-s, q, x), r, q);
#endif
    return q;
}
__device__ __forceinline__ bool div_fast_ok(float s) { return s >= 0x1p-80f && s <= 0x1p100f; }
