// Pages staged through shared memory by the bulk-copy engine (STAGES > 0; sm_90+): each warp keeps
// a ring of STAGES slots, and one lane asks the copy engine (cp.async.bulk, completion counted on
// an mbarrier per slot) for the next pages' sections of the warp's KV head while the warp attends
// the current one. A page then costs a handful of warp instructions to request and one wait,
// and every warp has pages in flight all the time, not only while it waits (the register path,
// DEPTH = 1, has a page in flight only between its loads and their first use).
// Part of paged_decode_split.cu: it uses that kernel's macros and decode_page_regs.cuh.
//
// One slot, for KV head h (every size a multiple of 16 bytes, every source 16-byte aligned: the
// page format aligns its sections to 16 bytes):
//   [K data][V data][K scales][V scales]
//   data     fp8: P*D bytes (h's [P, D] slice), nvfp4: P*D/2
//   scales   fp8 token: P fp32 (64 bytes); fp8 page: the 16-byte chunk holding h's fp32;
//            fp8 static (tensor/head): none; nvfp4: P*D/16 block scales, then the 16-byte chunk
//            holding h's global scale.
#pragma once

#if KELEM == 1
#define SK_DATA (P * D)
#define SK_SCALE (KGRAN == 1 ? P * 4 : (KGRAN == 2 ? 16 : 0))
#else
#define SK_DATA (P * D / 2)
#define SK_SCALE (P * D / 16 + 16)
#endif
#if VELEM == 1
#define SV_DATA (P * D)
#define SV_SCALE (VGRAN == 1 ? P * 4 : (VGRAN == 2 ? 16 : 0))
#else
#define SV_DATA (P * D / 2)
#define SV_SCALE (P * D / 16 + 16)
#endif
#define SLOT_K 0
#define SLOT_V SK_DATA
#define SLOT_KS (SK_DATA + SV_DATA)
#define SLOT_VS (SLOT_KS + SK_SCALE)
#define SLOT_BYTES (SLOT_VS + SV_SCALE)

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void warp_sync() { asm volatile("bar.warp.sync 0xffffffff;" ::: "memory"); }
__device__ __forceinline__ void mbar_init(u32 bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
// Makes initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// Blocks until the barrier's phase ``parity`` has completed (all bytes of that fill arrived).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_copy(u32 dst, const u8* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Where head h's sections start inside a page (bytes): data, scales, and NVFP4's global-scale chunk.
struct StageSources {
    u32 k, v, ks, vs, kg, vg;
};

__device__ __forceinline__ StageSources stage_sources(int h, i64 k_data, i64 k_s, i64 k_bs, i64 k_gs,
                                                      i64 v_data, i64 v_s, i64 v_bs, i64 v_gs) {
    StageSources s;
    s.k = (u32)(k_data + h * SK_DATA);
    s.v = (u32)(v_data + h * SV_DATA);
    const int chunk = (h * 4) & ~15;          // the 16-byte chunk that holds head h's fp32
#if KELEM == 1
    s.ks = (u32)(KGRAN == 1 ? k_s + h * P * 4 : (KGRAN == 2 ? k_s + chunk : 0));
    s.kg = 0;
#else
    s.ks = (u32)(k_bs + h * (P * D / 16));
    s.kg = (u32)(k_gs + chunk);
#endif
#if VELEM == 1
    s.vs = (u32)(VGRAN == 1 ? v_s + h * P * 4 : (VGRAN == 2 ? v_s + chunk : 0));
    s.vg = 0;
#else
    s.vs = (u32)(v_bs + h * (P * D / 16));
    s.vg = (u32)(v_gs + chunk);
#endif
    return s;
}

// One part's scales into [dst, dst + bytes): fp8 token or page scales, or NVFP4's block scales
// followed by its global-scale chunk. Nothing for static (tensor/head) scales.
__device__ __forceinline__ void stage_scales(u32 dst, const u8* page, u32 src, u32 global_chunk, int bytes,
                                             bool nvfp4, u32 bar) {
    if (bytes == 0) return;
    if (nvfp4) {
        bulk_copy(dst, page + src, bytes - 16, bar);
        bulk_copy(dst + bytes - 16, page + global_chunk, 16, bar);
    } else {
        bulk_copy(dst, page + src, bytes, bar);
    }
}

// One lane (the caller picks it) asks for a page's sections into ``slot``; the barrier completes
// when all SLOT_BYTES have landed.
__device__ __forceinline__ void stage_page(u32 slot, u32 bar, const u8* page, const StageSources& s) {
    mbar_expect(bar, SLOT_BYTES);
    bulk_copy(slot + SLOT_K, page + s.k, SK_DATA, bar);
    bulk_copy(slot + SLOT_V, page + s.v, SV_DATA, bar);
    stage_scales(slot + SLOT_KS, page, s.ks, s.kg, SK_SCALE, KELEM == 2, bar);
    stage_scales(slot + SLOT_VS, page, s.vs, s.vg, SV_SCALE, VELEM == 2, bar);
}

// This lane's offsets inside a slot: the same fragment layout as lane_offsets, relative to the
// staged sections instead of the page.
__device__ __forceinline__ LaneOffsets staged_lane_offsets(int h, int gi, int ci) {
    LaneOffsets o;
#if KELEM == 1
    o.k = SLOT_K + gi * D + 16 * ci;
    o.kbs = 0;
#if TOKSHFL
    const int lane = 4 * gi + ci;
    o.ks = lane < P ? SLOT_KS + lane * 4 : SLOT_VS + (lane - P) * 4;
#else
    o.ks = KGRAN == 1 ? SLOT_KS + gi * 4 : (KGRAN == 2 ? SLOT_KS + ((h * 4) & 15) : 0);
#endif
#else
    o.k = SLOT_K + gi * (D / 2) + ci * (D / 8);
    o.kbs = SLOT_KS + gi * (D / 16) + ci * (D / 64);
    o.ks = SLOT_KS + SK_SCALE - 16 + ((h * 4) & 15);
#endif
#if VELEM == 1
    o.v = SLOT_V + ci * D + gi * VB;
    o.vbs = 0;
    o.vs = VGRAN == 1 ? SLOT_VS + gi * 4 : (VGRAN == 2 ? SLOT_VS + ((h * 4) & 15) : 0);
#else
    o.v = SLOT_V + ci * (D / 2) + gi * (VB / 2);
    o.vbs = SLOT_VS + ci * (D / 16) + gi * VB / 16;
    o.vs = SLOT_VS + SV_SCALE - 16 + ((h * 4) & 15);
#endif
    return o;
}
