// Shared by the kvwire CUDA kernels (included by name; kvwire/kernels/nvrtc.py hands NVRTC every
// *.cuh of this directory). No CUDA headers: the serving images have NVRTC but no toolkit headers,
// so warp shuffles, votes, barriers, byte permutes and streaming loads are inline PTX.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;

__device__ __forceinline__ float shfl_xor(float v, int m) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(m));
    return r;
}
__device__ __forceinline__ u32 shfl_idx(u32 v, int src) {
    u32 r;
    asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(src));
    return r;
}
__device__ __forceinline__ float shfl_idx_f(float v, int src) {
    float r;
    asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(src));
    return r;
}
__device__ __forceinline__ bool any_sync(bool p) {
    u32 r;
    asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 %0, 1, 0, q; }"
                 : "=r"(r) : "r"((u32)p));
    return r != 0;
}
// Lets a programmatic dependent grid launch now (sm_90+; elsewhere nothing to do).
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void block_sync() { asm volatile("bar.sync 0;" ::: "memory"); }
__device__ __forceinline__ void warp_sync() { asm volatile("bar.warp.sync 0xffffffff;" ::: "memory"); }
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
// 16 bytes from global memory read once (no L1 allocation).
__device__ __forceinline__ void ld16(const u8* p, u32* r) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
}
// 16 bytes from global memory through L1 (allocated there), for a warp whose next load reads the
// other half of the same 32-byte sectors.
__device__ __forceinline__ void ld16_l1(const u8* p, u32* r) {
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
}
// The 32-bit shared-memory address of a __shared__ object (what ld.shared and the bulk copies take).
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
// Loads from shared memory at a 32-bit shared address.
__device__ __forceinline__ void lds_v4(u32 a, u32* r) {
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void lds_v2(u32 a, u32* r) {
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
// The same, ordered after earlier shared-memory stores of this thread (a "memory" clobber).
__device__ __forceinline__ void lds_v2_ordered(u32 a, u32& r0, u32& r1) {
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(a) : "memory");
}
__device__ __forceinline__ u32 lds_u32(u32 a) {
    u32 r;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(a));
    return r;
}
__device__ __forceinline__ float lds_f32(u32 a) {
    float r;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(r) : "r"(a));
    return r;
}
__device__ __forceinline__ u32 lds_u16(u32 a) {
    u16 r;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(r) : "r"(a));
    return (u32)r;
}
__device__ __forceinline__ u32 lds_u8(u32 a) {
    u16 r;
    asm volatile("ld.shared.u8 %0, [%1];" : "=h"(r) : "r"(a));
    return (u32)r;
}
__device__ __forceinline__ int shfl_xor_i(int v, int m) {
    int r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(m));
    return r;
}
