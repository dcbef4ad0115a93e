// PTX primitives of the shared-memory page rings (page_staging.cuh): mbarriers and the bulk-copy
// engine (sm_90+). Only primitives live here, so that the CPU emulator (cuda/emu/bulk_copy.cuh,
// kvwire/kernels/cuda_emulator.py) can stand in for them and run the ring logic itself.
#pragma once

#include "ptx_common.cuh"

__device__ __forceinline__ void mbar_init(u32 bar, u32 count = 1) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(bar) : "memory");
}
// Makes initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// Whether the barrier's phase ``parity`` has completed (all bytes of that fill arrived).
__device__ __forceinline__ bool mbar_try_wait(u32 bar, u32 parity) {
    u32 done;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done != 0;
}
__device__ __forceinline__ void bulk_copy(u32 dst, const u8* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
