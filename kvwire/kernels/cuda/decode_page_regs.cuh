// One page's bytes as a decode warp holds them: which bytes of each section a lane reads (the
// fragment layout described at the top of paged_decode_split.cu), the registers they land in, and
// the loads. Part of that kernel: it uses the kernel's compile-time macros (D, KELEM, VELEM, KGRAN,
// VGRAN, P, VB) and is included after they are defined.
#pragma once

#include "fragment_ops.cuh"

#if KELEM == 1
#define KWORDS (D / 16)      // 32-bit words per K row per lane (D/4 bytes)
#else
#define KWORDS (D / 32)      // D/8 bytes of E2M1 codes per K row per lane
#endif
#if VELEM == 1
#define VWORDS (D / 32)      // D/8 bytes per V token per lane
#else
#define VWORDS (D / 64)      // D/16 bytes of codes
#endif
#ifndef SCALESHFL
#define SCALESHFL 0
#endif
// Token scales of both K and V (fp8-token): with SCALESHFL each lane loads one of the page's 32
// scales (lanes 0-15 the keys', 16-31 the values') and the warp shuffles them to where they are
// used: one load request per page instead of four, and one lane offset instead of two.
#define TOKSHFL (SCALESHFL && KELEM == 1 && KGRAN == 1 && VELEM == 1 && VGRAN == 1)
#define KSTEPS (D / 16)
#define MTILES (D / 16)
// FP8 keys at D = 128 as whole 128-byte lines (KLINES): lane l loads bytes [16l, +16) of each of
// the K section's four 512-byte quarters, so each load instruction asks for four whole lines
// instead of eight half lines (the fragment order gives each row's four lanes 64 bytes per load).
// A lane then holds half of each of its rows' d (gi even: d < 64, odd: d >= 64); q's odd score
// columns carry each head's second half (q_operand.cuh), so it needs EVENCOLS (G <= 4), and lane
// gi ends up scoring tokens score_token(gi) and score_token(gi) + 8 instead of gi and gi + 8
// (page_attention.cuh). D = 64 rows are 64 bytes: whole lines already.
#ifndef KLINES
#define KLINES 0
#endif
#if KLINES && !(KELEM == 1 && D == 128 && EVENCOLS)
#undef KLINES
#define KLINES 0
#endif
// The first of the two tokens whose scores lane (gi, ci) holds (the second is 8 further).
__device__ __forceinline__ int score_token(int gi) { return KLINES ? (gi >> 1) + 4 * (gi & 1) : gi; }

struct PageRegs {
    u32 k[2][KWORDS];        // rows gi, gi+8
    u32 v[4][VWORDS];        // tokens ci, ci+4, ci+8, ci+12
    float ks[2];             // key scale of tokens gi, gi+8 (token/page/global)
    float vs[2];             // value scale of tokens gi, gi+8 (token/page/global)
#if TOKSHFL
    float sc;                // this lane's token scale (TOKSHFL): key of token lane, value of lane - 16
#endif
#if KELEM == 2
    u32 kbs[2];              // E4M3 block scales of rows gi, gi+8 (bytes: one per word pair)
#endif
#if VELEM == 2
    u32 vbs[4];              // E4M3 block scale of each V token's D/8 slice
#endif
};

// Byte offsets of this lane's first element of each section inside a page (computed once: the
// per-page address work is then one 64-bit add per section).
struct LaneOffsets {
    u32 k, ks, kbs, v, vs, vbs;
};

__device__ __forceinline__ LaneOffsets lane_offsets(int h, int tile, int gi, int ci, i64 k_data, i64 k_s, i64 k_bs,
                                                    i64 k_gs, i64 v_data, i64 v_s, i64 v_bs, i64 v_gs) {
    LaneOffsets o;
    const int st = score_token(gi);
    const int row = h * PT + tile * P;          // the tile's first token row in head h's slice of a section
#if KELEM == 1
    o.k = (u32)(k_data + row * D + (KLINES ? 16 * (4 * gi + ci) : gi * D + 16 * ci));
    o.kbs = 0;
#if TOKSHFL
    const int lane = 4 * gi + ci;
    o.ks = (u32)(lane < P ? k_s + (row + lane) * 4 : v_s + (row + lane - P) * 4);
#else
    o.ks = (u32)(KGRAN == 1 ? k_s + (row + st) * 4 : (KGRAN == 2 ? k_s + h * 4 : 0));
#endif
#else
    o.k = (u32)(k_data + row * (D / 2) + gi * (D / 2) + ci * (D / 8));
    o.kbs = (u32)(k_bs + (row + gi) * (D / 16) + ci * (D / 64));
    o.ks = (u32)(k_gs + h * 4);
#endif
#if VELEM == 1
    o.v = (u32)(v_data + row * D + ci * D + gi * VB);
    o.vbs = 0;
    o.vs = (u32)(VGRAN == 1 ? v_s + (row + st) * 4 : (VGRAN == 2 ? v_s + h * 4 : 0));
#else
    o.v = (u32)(v_data + row * (D / 2) + ci * (D / 2) + gi * (VB / 2));
    o.vbs = (u32)(v_bs + (row + ci) * (D / 16) + gi * VB / 16);
    o.vs = (u32)(v_gs + h * 4);
#endif
    return o;
}

// Loads of one page's lane bytes from global memory (``page`` a pointer) or from a staged copy in
// shared memory (``page`` a shared-memory address): the same offsets, one template.
struct FromGlobal {
    typedef const u8* Addr;
    static __device__ __forceinline__ void v4(Addr a, u32* r) { ld16(a, r); }
    static __device__ __forceinline__ void v2(Addr a, u32* r) { ld8(a, r); }
    static __device__ __forceinline__ u32 w(Addr a) { return *(const u32*)a; }
    static __device__ __forceinline__ float f(Addr a) { return ldf(a); }
    static __device__ __forceinline__ u32 h(Addr a) { return ldh(a); }
    static __device__ __forceinline__ u32 b(Addr a) { return ldb(a); }
};
struct FromShared {
    typedef u32 Addr;
    static __device__ __forceinline__ void v4(Addr a, u32* r) { lds_v4(a, r); }
    static __device__ __forceinline__ void v2(Addr a, u32* r) { lds_v2(a, r); }
    static __device__ __forceinline__ u32 w(Addr a) { return lds_u32(a); }
    static __device__ __forceinline__ float f(Addr a) { return lds_f32(a); }
    static __device__ __forceinline__ u32 h(Addr a) { return lds_u16(a); }
    static __device__ __forceinline__ u32 b(Addr a) { return lds_u8(a); }
};

template <class M>
__device__ __forceinline__ void load_page(PageRegs& r, typename M::Addr page, const LaneOffsets& o) {
#if KELEM == 1
    const typename M::Addr kb = page + o.k;
#if KLINES
    // quarter Q holds tokens 4Q + (gi >> 1): quarters 0 / 2 are rows gi / gi+8 of the first score
    // tile (k[0][0..3] / k[1][0..3]), quarters 1 / 3 those of the second (k[0][4..7] / k[1][4..7])
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) M::v4(kb + 512 * qq, &r.k[qq >> 1][4 * (qq & 1)]);
#else
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int j = 0; j < D / 64; ++j) M::v4(kb + rr * 8 * D + 64 * j, &r.k[rr][4 * j]);
#endif
#if TOKSHFL
    r.sc = M::f(page + o.ks);
#elif KGRAN == 1
    r.ks[0] = M::f(page + o.ks);
    r.ks[1] = M::f(page + o.ks + 32);
#elif KGRAN == 2
    r.ks[0] = r.ks[1] = M::f(page + o.ks);
#endif
#else
    const typename M::Addr kb = page + o.k;
    const typename M::Addr bs = page + o.kbs;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (D == 128) M::v4(kb + rr * 8 * (D / 2), r.k[rr]); else M::v2(kb + rr * 8 * (D / 2), r.k[rr]);
        const typename M::Addr b = bs + rr * 8 * (D / 16);
        r.kbs[rr] = D == 128 ? M::h(b) : M::b(b);          // D/64 block scales: 2-byte aligned
    }
    r.ks[0] = r.ks[1] = M::f(page + o.ks);
#endif
#if VELEM == 1
    const typename M::Addr vb = page + o.v;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        if (D == 128) M::v4(vb + 4 * t * D, r.v[t]); else M::v2(vb + 4 * t * D, r.v[t]);
    }
#if TOKSHFL
#elif VGRAN == 1
    r.vs[0] = M::f(page + o.vs);
    r.vs[1] = M::f(page + o.vs + 32);
#elif VGRAN == 2
    r.vs[0] = r.vs[1] = M::f(page + o.vs);
#endif
#else
    const typename M::Addr vb = page + o.v;
    const typename M::Addr vbs = page + o.vbs;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        if (D == 128) M::v2(vb + 4 * t * (D / 2), r.v[t]); else r.v[t][0] = M::w(vb + 4 * t * (D / 2));
        r.vbs[t] = M::b(vbs + 4 * t * (D / 16));
    }
    r.vs[0] = r.vs[1] = M::f(page + o.vs);
#endif
}

// The 128-byte line of a page this lane asks L2 for (-1: none): K data, V data, then the scale sections.
__device__ __forceinline__ int prefetch_line(int h, int lane, i64 k_data, i64 k_s, i64 k_bs, i64 v_data, i64 v_s, i64 v_bs) {
    const int kl = P * D * (KELEM == 1 ? 2 : 1) / 2 / 128;     // lines of one head's K data
    const int vl = P * D * (VELEM == 1 ? 2 : 1) / 2 / 128;
    if (lane < kl) return (int)(k_data + (i64)h * P * D * (KELEM == 1 ? 2 : 1) / 2 + lane * 128);
    if (lane < kl + vl) return (int)(v_data + (i64)h * P * D * (VELEM == 1 ? 2 : 1) / 2 + (lane - kl) * 128);
    if (lane == kl + vl) {
        if (KGRAN == 1) return (int)(k_s + (i64)h * P * 4);
        if (KELEM == 2) return (int)(k_bs + (i64)h * P * (D / 16));
    }
    if (lane == kl + vl + 1) {
        if (VGRAN == 1) return (int)(v_s + (i64)h * P * 4);
        if (VELEM == 2) return (int)(v_bs + (i64)h * P * (D / 16));
    }
    return -1;
}

// The key (k0, k1) and value (v0, v1) scales of tokens st and st + 8 (st = score_token(gi)).
__device__ __forceinline__ void token_scales(const PageRegs& r, int st, float& k0, float& k1, float& v0, float& v1) {
#if TOKSHFL
    k0 = shfl_idx_f(r.sc, st); k1 = shfl_idx_f(r.sc, st + 8);
    v0 = shfl_idx_f(r.sc, st + 16); v1 = shfl_idx_f(r.sc, st + 24);
#else
    k0 = r.ks[0]; k1 = r.ks[1]; v0 = r.vs[0]; v1 = r.vs[1];
#endif
}
