// STAGES > 0: each warp copies its head's slice of the next pages into a ring of shared-memory
// stages with cp.async (16-byte copies, no registers held while in flight), and reads the page it
// attends from shared memory into the same PageRegs (same LaneOffsets, relative to the stage).
// Part of paged_decode_split.cu: uses its macros (D, P, KELEM, VELEM, KGRAN, VGRAN, NW, STAGES).
//
// One stage (this head's slice of one page; every section 16-byte aligned):
//   [K data | V data | K extra | V extra | K 4-byte scale (16) | V 4-byte scale (16)]
// where "extra" is the NVFP4 block scales or the FP8 per-token scales, and the 4-byte scale the
// NVFP4 global scale or the FP8 per-page scale.
#pragma once

#define ST_KDB (P * D / (KELEM == 1 ? 1 : 2))
#define ST_VDB (P * D / (VELEM == 1 ? 1 : 2))
#define ST_KXB (KELEM == 2 ? P * D / 16 : (KGRAN == 1 ? P * 4 : 0))
#define ST_VXB (VELEM == 2 ? P * D / 16 : (VGRAN == 1 ? P * 4 : 0))
#define ST_K4 (KELEM == 2 || KGRAN == 2)
#define ST_V4 (VELEM == 2 || VGRAN == 2)
#define S_KD 0
#define S_VD ST_KDB
#define S_KX (ST_KDB + ST_VDB)
#define S_VX (S_KX + ST_KXB)
#define S_K4 (S_VX + ST_VXB)
#define S_V4 (S_K4 + 16)
#define STAGE_BYTES (S_V4 + 16)
// STAGES asked for, fewer where a block's ring would pass 40 KB of static shared memory (FP8 pages
// at head_dim 128 fit two stages per warp at 4 warps).
#define RSTAGES (NW * STAGES * STAGE_BYTES <= 40960 ? STAGES : (40960 / (NW * STAGE_BYTES) >= 2 ? 40960 / (NW * STAGE_BYTES) : 2))
#if ST_KDB % 512 != 0 || ST_VDB % 512 != 0 || (ST_KXB + ST_VXB) / 16 > 30
#error "stage layout: data sections must be whole 512-byte rounds and the extras at most 30 chunks"
#endif

__device__ __forceinline__ void cp_async16(u32 dst, const u8* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(u32 dst, const u8* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void warp_sync() { asm volatile("bar.warp.sync 0xffffffff;" ::: "memory"); }

// What one lane copies of each page (byte offsets in the page, and in the stage).
struct CopyPlan {
    u32 kd, vd;              // this lane's first 16-byte chunk of K / V data (then every 512 bytes)
    u32 x_src, x_dst;        // one chunk of the scale sections (lanes 0..extras-1)
    u32 s4_src, s4_dst;      // a 4-byte scale (lanes 30, 31)
    bool x_on, s4_on;
};

__device__ __forceinline__ CopyPlan copy_plan(int h, int lane, i64 k_data, i64 k_s, i64 k_bs, i64 k_gs,
                                              i64 v_data, i64 v_s, i64 v_bs, i64 v_gs) {
    CopyPlan c;
    c.kd = (u32)(k_data + (i64)h * ST_KDB + 16 * lane);
    c.vd = (u32)(v_data + (i64)h * ST_VDB + 16 * lane);
    const int kx = ST_KXB / 16, vx = ST_VXB / 16;
    const i64 kxs = KELEM == 2 ? k_bs : k_s, vxs = VELEM == 2 ? v_bs : v_s;
    c.x_on = lane < kx + vx;
    if (lane < kx) { c.x_src = (u32)(kxs + (i64)h * ST_KXB + 16 * lane); c.x_dst = S_KX + 16 * lane; }
    else { c.x_src = (u32)(vxs + (i64)h * ST_VXB + 16 * (lane - kx)); c.x_dst = S_VX + 16 * (lane - kx); }
    const i64 k4 = KELEM == 2 ? k_gs : k_s, v4 = VELEM == 2 ? v_gs : v_s;
    c.s4_on = (lane == 30 && ST_K4) || (lane == 31 && ST_V4);
    c.s4_src = (u32)(lane == 30 ? k4 + (i64)h * 4 : v4 + (i64)h * 4);
    c.s4_dst = lane == 30 ? S_K4 : S_V4;
    return c;
}

__device__ __forceinline__ void copy_page(u32 stage, const u8* page, const CopyPlan& c, int lane) {
#pragma unroll
    for (int j = 0; j < ST_KDB / 512; ++j) cp_async16(stage + S_KD + 16 * lane + 512 * j, page + c.kd + 512 * j);
#pragma unroll
    for (int j = 0; j < ST_VDB / 512; ++j) cp_async16(stage + S_VD + 16 * lane + 512 * j, page + c.vd + 512 * j);
    if (c.x_on) cp_async16(stage + c.x_dst, page + c.x_src);
    if (c.s4_on) cp_async4(stage + c.s4_dst, page + c.s4_src);
}

// Where each lane reads its fragments in a stage: the page's LaneOffsets with the head slice at
// the stage's section bases.
__device__ __forceinline__ LaneOffsets stage_offsets(int gi, int ci) {
    return lane_offsets(0, gi, ci, S_KD, KGRAN == 1 ? S_KX : S_K4, S_KX, S_K4,
                        S_VD, VGRAN == 1 ? S_VX : S_V4, S_VX, S_V4);
}
