// PTX primitives of the decode kernel: conversions into mma.sync fragments (E4M3x2 -> f16x2), f16
// and fp32 arithmetic, the m16n8k16 MMA, read-only global loads and page addressing. Only
// primitives live here, so that the CPU emulator (cuda/emu/fragment_ops.cuh,
// kvwire/kernels/cuda_emulator.py) can stand in for them. Included by name
// (kvwire/kernels/nvrtc.py hands NVRTC every *.cuh of this directory).
#pragma once

#include "ptx_common.cuh"

__device__ __forceinline__ float ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 e4m3x2_lo(u32 w) {  // bytes 0,1 -> f16x2 (byte 0 in the low half)
    u32 r;
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(r) : "r"(w));
    return r;
}
__device__ __forceinline__ u32 e4m3x2_hi(u32 w) {  // bytes 2,3 -> f16x2
    u32 r;
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, hi; }" : "=r"(r) : "r"(w));
    return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
// a times b's low (hmul2_lo) or high (hmul2_hi) half in both lanes: ptxas folds the broadcast into
// the multiply's operand (HMUL2 ... R.H0_H0 / R.H1_H1), so it costs no instruction of its own.
__device__ __forceinline__ u32 hmul2_lo(u32 a, u32 b) {
    u32 r;
    asm("{ .reg .b16 lo, hi; .reg .b32 t; mov.b32 {lo, hi}, %2; mov.b32 t, {lo, lo}; mul.rn.f16x2 %0, %1, t; }"
        : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hmul2_hi(u32 a, u32 b) {
    u32 r;
    asm("{ .reg .b16 lo, hi; .reg .b32 t; mov.b32 {lo, hi}, %2; mov.b32 t, {hi, hi}; mul.rn.f16x2 %0, %1, t; }"
        : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ld8(const u8* p, u32* r) {
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "l"(p));
}
__device__ __forceinline__ float ldf(const u8* p) {
    float r;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ u32 ldb(const u8* p) {
    u16 r;
    asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(r) : "l"(p));
    return (u32)r;
}
__device__ __forceinline__ float bf16_to_f32(u16 v) {
    float r;
    asm("mov.b32 %0, %1;" : "=f"(r) : "r"(((u32)v) << 16));
    return r;
}
__device__ __forceinline__ float fmx(float a, float b) {
    float r;
    asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ u32 ldh(const u8* p) {
    u16 r;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return (u32)r;
}
__device__ __forceinline__ void prefetch_l2(const u8* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// A page's first byte: one 32x32 -> 64-bit multiply-add (page ids are non-negative and a page is
// < 4 GiB; the launcher checks). Written as PTX so the compiler keeps one base per page and adds
// each section's lane offset to it, instead of redoing a 64-bit multiply per section.
__device__ __forceinline__ const u8* page_at(const u8* storage, int id, i64 page_bytes) {
    unsigned long long r;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"((u32)id), "r"((u32)page_bytes), "l"(storage));
    return (const u8*)r;
}
