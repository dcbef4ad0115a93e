// Pages staged through shared memory by the bulk-copy engine (STAGES > 0; sm_90+). Each ring
// has STAGES slots, and one lane asks the copy engine (cp.async.bulk, completion counted on an
// mbarrier per slot) for the next pages' sections while the warps attend the current one. A page
// then costs a handful of instructions to request and one wait, and pages are in flight all the
// time, not only while a warp waits (the register path, DEPTH = 1, has a page in flight only
// between its loads and their first use).
//   WHOLEPAGE = 0: a ring per warp, holding the sections of the warp's KV head.
//   WHOLEPAGE = 1: one ring per block, holding the sections of the block's HPB consecutive KV
//     heads (each section one contiguous run, one copy for the whole block); a second mbarrier per
//     slot counts the warps done with it before it is refilled.
// Part of paged_decode_split.cu: it uses that kernel's macros and decode_page_regs.cuh.
//
// One slot, for KV heads h0 .. h0 + HPB - 1 (every size a multiple of 16 bytes, every source
// 16-byte aligned: the page format aligns its sections to 16 bytes):
//   [K data][V data][K scales][V scales]
//   data     fp8: HPB*P*D bytes (the heads' [P, D] slices), nvfp4: HPB*P*D/2
//   scales   fp8 token: HPB*P fp32; fp8 page: the 16-byte chunks holding the heads' fp32;
//            fp8 static (tensor/head): none; nvfp4: HPB*P*D/16 block scales, then the 16-byte
//            chunks holding the heads' global scales.
#pragma once

// Bytes of the 16-byte chunks that can hold HPB consecutive fp32 (at most: where the group starts
// inside a chunk is known at run time, StageSources.chunk).
#define SCHUNK_MAX (HPB % 4 == 0 ? 4 * HPB : 16 * ((4 * HPB + 12 + 15) / 16))
#if KELEM == 1
#define SK_DATA (P * D)
#define SK_SCALE (KGRAN == 1 ? HPB * P * 4 : (KGRAN == 2 ? SCHUNK_MAX : 0))
#else
#define SK_DATA (P * D / 2)
#define SK_SCALE (HPB * P * D / 16 + SCHUNK_MAX)
#endif
#if VELEM == 1
#define SV_DATA (P * D)
#define SV_SCALE (VGRAN == 1 ? HPB * P * 4 : (VGRAN == 2 ? SCHUNK_MAX : 0))
#else
#define SV_DATA (P * D / 2)
#define SV_SCALE (HPB * P * D / 16 + SCHUNK_MAX)
#endif
#define SLOT_K 0
#define SLOT_V (HPB * SK_DATA)
#define SLOT_KS (HPB * (SK_DATA + SV_DATA))
#define SLOT_VS (SLOT_KS + SK_SCALE)
#define SLOT_BYTES (SLOT_VS + SV_SCALE)

#include "bulk_copy.cuh"

// Blocks until the barrier's phase ``parity`` has completed (all bytes of that fill arrived).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    while (!mbar_try_wait(bar, parity)) {
    }
}

// Where the sections of heads h0 .. h0 + HPB - 1 start inside a page (bytes): data, scales, and the
// 16-byte chunks holding their page or global scales (from ``chunk``, ``chunk_bytes`` long).
struct StageSources {
    u32 k, v, ks, vs, kg, vg;
    u32 chunk, chunk_bytes, bytes;   // bytes: what one fill of a slot delivers
};

// One part's scale sources (fp8 token scales: ``gran`` 1, page-scale chunks: 2, or NVFP4's block
// scales and global-scale chunks; nothing for static scales) and the bytes they fill in a slot.
struct ScaleSources {
    u32 scales, global, bytes;
};

__device__ __forceinline__ ScaleSources scale_sources(bool nvfp4, int gran, int h0, u32 chunk, u32 chunk_bytes,
                                                      i64 s, i64 bs, i64 gs) {
    if (nvfp4) return {(u32)(bs + h0 * (P * D / 16)), (u32)(gs + chunk), HPB * (P * D / 16) + chunk_bytes};
    if (gran == 1) return {(u32)(s + h0 * P * 4), 0u, HPB * P * 4};
    if (gran == 2) return {(u32)(s + chunk), 0u, chunk_bytes};
    return {0u, 0u, 0u};
}

__device__ __forceinline__ StageSources stage_sources(int h0, i64 k_data, i64 k_s, i64 k_bs, i64 k_gs,
                                                      i64 v_data, i64 v_s, i64 v_bs, i64 v_gs) {
    StageSources s;
    s.k = (u32)(k_data + h0 * SK_DATA);
    s.v = (u32)(v_data + h0 * SV_DATA);
    s.chunk = (u32)(h0 * 4) & ~15u;
    s.chunk_bytes = ((u32)(h0 + HPB) * 4 + 15u & ~15u) - s.chunk;
    const ScaleSources ks = scale_sources(KELEM == 2, KGRAN, h0, s.chunk, s.chunk_bytes, k_s, k_bs, k_gs);
    const ScaleSources vs = scale_sources(VELEM == 2, VGRAN, h0, s.chunk, s.chunk_bytes, v_s, v_bs, v_gs);
    s.ks = ks.scales; s.kg = ks.global;
    s.vs = vs.scales; s.vg = vs.global;
    s.bytes = HPB * (SK_DATA + SV_DATA) + ks.bytes + vs.bytes;
    return s;
}

// One part's scales into the slot at ``dst``: fp8 token scales (``gran`` 1) or page-scale chunks
// (2), or NVFP4's block scales followed by its global-scale chunks. Nothing for static scales.
__device__ __forceinline__ void stage_scales(u32 dst, const u8* page, u32 src, u32 global_chunk, int gran,
                                             bool nvfp4, const StageSources& s, u32 bar) {
    if (nvfp4) {
        bulk_copy(dst, page + src, HPB * (P * D / 16), bar);
        bulk_copy(dst + HPB * (P * D / 16), page + global_chunk, s.chunk_bytes, bar);
    } else if (gran == 1) {
        bulk_copy(dst, page + src, HPB * P * 4, bar);
    } else if (gran == 2) {
        bulk_copy(dst, page + src, s.chunk_bytes, bar);
    }
}

// One lane (the caller picks it) asks for a page's sections into ``slot``; the barrier completes
// when all ``s.bytes`` have landed.
__device__ __forceinline__ void stage_page(u32 slot, u32 bar, const u8* page, const StageSources& s) {
    mbar_expect(bar, s.bytes);
    bulk_copy(slot + SLOT_K, page + s.k, HPB * SK_DATA, bar);
    bulk_copy(slot + SLOT_V, page + s.v, HPB * SV_DATA, bar);
    stage_scales(slot + SLOT_KS, page, s.ks, s.kg, KGRAN, KELEM == 2, s, bar);
    stage_scales(slot + SLOT_VS, page, s.vs, s.vg, VGRAN, VELEM == 2, s, bar);
}

// This lane's offsets inside a slot for head h, the ``w``-th of the slot's heads: the same fragment
// layout as lane_offsets, relative to the staged sections instead of the page.
__device__ __forceinline__ LaneOffsets staged_lane_offsets(int h, int w, u32 chunk, int gi, int ci) {
    LaneOffsets o;
    const u32 in_chunk = (u32)(h * 4) - chunk;          // h's fp32 inside the staged scale chunks
    const int st = score_token(gi);
#if KELEM == 1
    o.k = SLOT_K + w * SK_DATA + (KLINES ? 16 * (4 * gi + ci) : gi * D + 16 * ci);
    o.kbs = 0;
#if TOKSHFL
    const int lane = 4 * gi + ci;
    o.ks = lane < P ? SLOT_KS + (w * P + lane) * 4 : SLOT_VS + (w * P + lane - P) * 4;
#else
    o.ks = KGRAN == 1 ? SLOT_KS + (w * P + st) * 4 : (KGRAN == 2 ? SLOT_KS + in_chunk : 0);
#endif
#else
    o.k = SLOT_K + w * SK_DATA + gi * (D / 2) + ci * (D / 8);
    o.kbs = SLOT_KS + (w * P + gi) * (D / 16) + ci * (D / 64);
    o.ks = SLOT_KS + HPB * (P * D / 16) + in_chunk;
#endif
#if VELEM == 1
    o.v = SLOT_V + w * SV_DATA + ci * D + gi * VB;
    o.vbs = 0;
    o.vs = VGRAN == 1 ? SLOT_VS + (w * P + st) * 4 : (VGRAN == 2 ? SLOT_VS + in_chunk : 0);
#else
    o.v = SLOT_V + w * SV_DATA + ci * (D / 2) + gi * (VB / 2);
    o.vbs = SLOT_VS + (w * P + ci) * (D / 16) + gi * VB / 16;
    o.vs = SLOT_VS + HPB * (P * D / 16) + in_chunk;
#endif
    return o;
}
