// PTX primitives of floating-point arithmetic with IEEE rounding and 8-bit float conversions (the
// quantise kernel, exact_division.cuh). Only primitives live here, so that the CPU emulator
// (cuda/emu/float_ops.cuh, kvwire/kernels/cuda_emulator.py) can stand in for them.
#pragma once

#include "ptx_common.cuh"

__device__ __forceinline__ float div_rn(float a, float b) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float rcp_rn(float a) {
    float r;
    asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}
__device__ __forceinline__ float rcp_approx_ftz(float a) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}
// Per bf16 half: max(|a|, |b|) with the sign of a XOR b (`max.xorsign.abs`, sm_86+).
__device__ __forceinline__ u32 bmax_abs2(u32 a, u32 b) {
    u32 r;
    asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
// Two fp32 -> two E4M3 bytes (round to nearest even, saturating): hi in bits 8..15, lo in 0..7.
__device__ __forceinline__ u32 e4m3x2(float hi, float lo) {
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
// E4M3 bits (0..126, positive) -> fp32, exactly: the hardware E4M3 -> f16 conversion (every E4M3
// value is an f16 value), then f16 -> f32. Two instructions instead of a bit-field decode with a
// subnormal branch.
__device__ __forceinline__ float e4m3_value(u32 b) {
    float r;
    asm("{ .reg .b16 lo, hi; .reg .b32 h2; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 h2, lo;"
        " mov.b32 {lo, hi}, h2; cvt.f32.f16 %0, lo; }" : "=f"(r) : "r"(b));
    return r;
}
