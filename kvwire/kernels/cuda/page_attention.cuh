// One page of attention for one decode warp: the softmax state a warp carries across pages and
// attend_page (scores, online softmax, P.V on the page's registers).
// Part of paged_decode_split.cu: it uses that kernel's macros (D, G, KELEM, KGRAN, VELEM, VGRAN,
// LAZYMAX), decode_page_regs.cuh and q_operand.cuh, and is included after them; the fragment
// layout it relies on is described at the top of that file.
#pragma once

// E2M1 codes (low nibble = even element) -> E4M3 bytes of value * 2^-6: bit placement.
__device__ __forceinline__ u32 e2m1_lo_to_e4m3(u32 w) { return ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu); }
__device__ __forceinline__ u32 e2m1_hi_to_e4m3(u32 w) { return (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu); }

struct SoftmaxState {
    float m0, m1;                    // running max of heads 2ci, 2ci+1 (log2 units; EVENCOLS: m0 of head ci)
    float l0, l1;                    // this lane's share of the softmax sums
    float acc[MTILES][4];            // O^T fragments, in units of 1/vinv when value scales ride on P
    float vinv;                      // 0 until the first page sets the value reference
};

// One page (16 tokens) of one warp: scores, online softmax, P.V. ``cur`` holds the page's registers.
__device__ __forceinline__ void attend_page(const PageRegs& cur, const QOperand& q, float cscale,
                                            int gi, int ci, SoftmaxState& st) {
    // ---- scores S^T[tok gi / gi+8, head 2ci / 2ci+1] ----
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    float s2[4] = {0.f, 0.f, 0.f, 0.f};            // second accumulator: two shorter MMA chains
#if KELEM == 1 && KLINES
    // Whole-line keys (decode_page_regs.cuh): words 0-3 / 4-7 of k[0] and k[1] are rows gi and
    // gi+8 of two score tiles, X (tokens gi>>1, 8 + gi>>1) and Y (4 + gi>>1, 12 + gi>>1), and hold
    // d < 64 on even gi, d >= 64 on odd gi. q's odd columns hold each head's d >= 64 (fill_q), so
    // one MMA gives every row both halves' dots: column 2ci the d < 64 one (right for even rows),
    // 2ci + 1 the d >= 64 one (right for odd rows). A token's two halves are in lanes gi and gi^1:
    // even lanes keep tile X's tokens and odd lanes tile Y's, each adding what its partner sends.
    float x[4] = {0.f, 0.f, 0.f, 0.f}, y[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        u32 b0, b1;
        q.get(u, b0, b1);
        const u32 x0 = cur.k[0][u], x1 = cur.k[1][u], y0 = cur.k[0][4 + u], y1 = cur.k[1][4 + u];
        mma16816(x, e4m3x2_lo(x0), e4m3x2_lo(x1), e4m3x2_hi(x0), e4m3x2_hi(x1), b0, b1);
        mma16816(y, e4m3x2_lo(y0), e4m3x2_lo(y1), e4m3x2_hi(y0), e4m3x2_hi(y1), b0, b1);
    }
    {
        const bool odd = gi & 1;
#pragma unroll
        for (int r = 0; r < 4; r += 2) {                        // rows gi and gi + 8
            const float send = odd ? x[r + 1] : y[r];           // the partner's token, my half
            s[r] = (odd ? y[r + 1] : x[r]) + shfl_xor(send, 4);
        }
    }
#elif KELEM == 1
#pragma unroll
    for (int kt = 0; kt < KSTEPS; ++kt) {
        const u32 w0 = cur.k[0][kt], w1 = cur.k[1][kt];
        u32 b0, b1;
        q.get(kt, b0, b1);
        mma16816((kt & 1) ? s2 : s, e4m3x2_lo(w0), e4m3x2_lo(w1), e4m3x2_hi(w0), e4m3x2_hi(w1), b0, b1);
    }
#else
    // Rows gi and gi+8's block scales, one f16x2 per row: D = 128 gives words 0-1 the low half and
    // words 2-3 the high one (D = 64: one scale, low half); each multiply broadcasts its half.
    const u32 bsr0 = e4m3x2_lo(cur.kbs[0]), bsr1 = e4m3x2_lo(cur.kbs[1]);
#pragma unroll
    for (int w = 0; w < KWORDS; ++w) {
        const bool bhi = D == 128 && w >= 2;                        // this word's block scale: the high half
        const u32 L0 = e2m1_lo_to_e4m3(cur.k[0][w]), H0 = e2m1_hi_to_e4m3(cur.k[0][w]);
        const u32 L1 = e2m1_lo_to_e4m3(cur.k[1][w]), H1 = e2m1_hi_to_e4m3(cur.k[1][w]);
        u32 b0, b1, b2, b3;
        q.get(2 * w, b0, b1);
        q.get(2 * w + 1, b2, b3);
#if PROBE_NOCVT & 1
        // timing probe: the placed words go to the MMAs as they are (no conversion, no block scale)
        mma16816(s, w ? L0 : L0 ^ cur.kbs[0], w ? L1 : L1 ^ cur.kbs[1], H0, H1, b0, b1);   // scale bytes kept live
        mma16816(s2, L1, L0, H1, H0, b2, b3);
#elif PROBE_NOCVT & 4
        // timing probe: converted, but no block-scale multiply
        mma16816(s, e4m3x2_lo(w ? L0 : L0 ^ cur.kbs[0]), e4m3x2_lo(w ? L1 : L1 ^ cur.kbs[1]), e4m3x2_lo(H0),
                 e4m3x2_lo(H1), b0, b1);
        mma16816(s2, e4m3x2_hi(L0), e4m3x2_hi(L1), e4m3x2_hi(H0), e4m3x2_hi(H1), b2, b3);
#else
#define KSCALE(x, bsr) (bhi ? hmul2_hi(x, bsr) : hmul2_lo(x, bsr))
        mma16816(s, KSCALE(e4m3x2_lo(L0), bsr0), KSCALE(e4m3x2_lo(L1), bsr1),
                 KSCALE(e4m3x2_lo(H0), bsr0), KSCALE(e4m3x2_lo(H1), bsr1), b0, b1);
        mma16816(s2, KSCALE(e4m3x2_hi(L0), bsr0), KSCALE(e4m3x2_hi(L1), bsr1),
                 KSCALE(e4m3x2_hi(H0), bsr0), KSCALE(e4m3x2_hi(H1), bsr1), b2, b3);
#undef KSCALE
#endif
    }
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] += s2[i];
    float ks0, ks1, vs0, vs1;
    token_scales(cur, score_token(gi), ks0, ks1, vs0, vs1);
#if KGRAN == 1 || KGRAN == 2 || KELEM == 2
    s[0] *= cscale * ks0; s[2] *= cscale * ks1;
#if !EVENCOLS
    s[1] *= cscale * ks0; s[3] *= cscale * ks1;
#endif
#else
    s[0] *= cscale; s[2] *= cscale;
#if !EVENCOLS
    s[1] *= cscale; s[3] *= cscale;
#endif
#endif
    // ---- online softmax over the page's 16 tokens, per head ----
    // With LAZYMAX the running max is a reference, not the exact max: it moves only when a score
    // passes it by more than 2^LAZYMAX (then P <= 2^LAZYMAX, and with the value-scale ratio <= 2^10
    // below it stays under 2^15 in f16). Most pages then skip the warp-wide max reduction (three
    // rounds of shuffles on the critical path); the first page always takes it.
#if EVENCOLS
    // Query heads sit in the even columns only (column 2j = head j: fill_q), so this lane's head
    // is ci, in s[0] and s[2]; the odd columns are padding and take no softmax work. The
    // accumulator's columns stay heads (2ci, 2ci+1): their factors come from lanes 2ci and 2ci+1
    // (for ci >= 2 those columns are padding, and "& 3" merely keeps the lane in range).
    float pm0 = fmx(s[0], s[2]);
#if LAZYMAX
    if (any_sync(pm0 > st.m0 + (float)LAZYMAX)) {
#endif
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) pm0 = fmx(pm0, shfl_xor(pm0, x));
    const float mn0 = fmx(st.m0, pm0);
    if (LAZYMAX || any_sync(mn0 > st.m0)) {
        const float a0 = ex2(st.m0 - mn0);
        const float fa = shfl_idx_f(a0, 4 * gi + ((2 * ci) & 3)), fb = shfl_idx_f(a0, 4 * gi + ((2 * ci + 1) & 3));
        st.l0 *= a0;
#pragma unroll
        for (int i = 0; i < MTILES; ++i) { st.acc[i][0] *= fa; st.acc[i][1] *= fb; st.acc[i][2] *= fa; st.acc[i][3] *= fb; }
        st.m0 = mn0;
    }
#if LAZYMAX
    }
#endif
    float p0 = ex2(s[0] - st.m0), p2 = ex2(s[2] - st.m0);
    st.l0 += p0 + p2;
#else
    float pm0 = fmx(s[0], s[2]), pm1 = fmx(s[1], s[3]);
#if LAZYMAX
    if (any_sync(pm0 > st.m0 + (float)LAZYMAX || pm1 > st.m1 + (float)LAZYMAX)) {
#endif
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) { pm0 = fmx(pm0, shfl_xor(pm0, x)); pm1 = fmx(pm1, shfl_xor(pm1, x)); }
    const float mn0 = fmx(st.m0, pm0), mn1 = fmx(st.m1, pm1);
    if (LAZYMAX || any_sync(mn0 > st.m0 || mn1 > st.m1)) {
        const float a0 = ex2(st.m0 - mn0), a1 = ex2(st.m1 - mn1);
        st.l0 *= a0; st.l1 *= a1;
#pragma unroll
        for (int i = 0; i < MTILES; ++i) { st.acc[i][0] *= a0; st.acc[i][1] *= a1; st.acc[i][2] *= a0; st.acc[i][3] *= a1; }
        st.m0 = mn0; st.m1 = mn1;
    }
#if LAZYMAX
    }
#endif
    float p0 = ex2(s[0] - st.m0), p1v = ex2(s[1] - st.m1), p2 = ex2(s[2] - st.m0), p3 = ex2(s[3] - st.m1);
    st.l0 += p0 + p2; st.l1 += p1v + p3;
#endif
#if VGRAN == 1 || VGRAN == 2 || VELEM == 2
    {   // value scales ride on P, relative to a warp reference kept within 2^+-10 (f16 range)
        float x0 = vs0 * st.vinv, x1 = vs1 * st.vinv;
        const bool bad = !(x0 >= 9.765625e-4f && x0 <= 1024.0f) || !(x1 >= 9.765625e-4f && x1 <= 1024.0f);
        if (any_sync(bad)) {
            float vm = fmx(vs0, vs1);
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) vm = fmx(vm, shfl_xor(vm, x));
            const float ninv = vm > 0.f ? 1.0f / vm : (st.vinv > 0.f ? st.vinv : 1.0f);
            const float ratio = st.vinv > 0.f ? ninv / st.vinv : 0.f;
#pragma unroll
            for (int i = 0; i < MTILES; ++i) { st.acc[i][0] *= ratio; st.acc[i][1] *= ratio; st.acc[i][2] *= ratio; st.acc[i][3] *= ratio; }
            st.vinv = ninv;
            x0 = vs0 * st.vinv; x1 = vs1 * st.vinv;
        }
        p0 *= x0; p2 *= x1;
#if !EVENCOLS
        p1v *= x0; p3 *= x1;
#endif
    }
#endif
    // ---- P^T as the B operand: lane (gi, ci) needs head gi, tokens (ci, ci+8) and (ci+4, ci+12)
#if EVENCOLS
    // Head gi's tokens (ci, ci+8) are in lane (ci, gi) (for gi < 4; gi >= 4 are padding columns);
    // with KLINES in lane (2ci, gi), and tokens (ci+4, ci+12) in lane (2ci+1, gi) (score_token).
    const u32 X0 = pack_f16x2(p0, p2);                               // head ci: tokens st, st+8
    const int srcA = KLINES ? 8 * ci + gi : 4 * ci + gi;
    const u32 pb0 = shfl_idx(X0, srcA), pb1 = shfl_idx(X0, srcA ^ (KLINES ? 4 : 16));
#else
    const u32 X0 = pack_f16x2(p0, p2), X1 = pack_f16x2(p1v, p3);   // head 2ci / 2ci+1: tokens gi, gi+8
    const int srcA = 4 * ci + (gi >> 1), srcB = srcA + 16;
    const u32 a0x = shfl_idx(X0, srcA), a1x = shfl_idx(X1, srcA);
    const u32 b0x = shfl_idx(X0, srcB), b1x = shfl_idx(X1, srcB);
    const u32 pb0 = (gi & 1) ? a1x : a0x, pb1 = (gi & 1) ? b1x : b0x;
#endif
    // ---- O^T += V^T . P^T ----
#if VELEM == 1
#pragma unroll
    for (int i = 0; i < MTILES; ++i) {
        const int w = i / 2;
        const u32 sel = (i & 1) ? 0x7362u : 0x5140u;
        const u32 lo = prmt(cur.v[0][w], cur.v[2][w], sel);    // tokens ci, ci+8
        const u32 hi = prmt(cur.v[1][w], cur.v[3][w], sel);    // tokens ci+4, ci+12
        mma16816(st.acc[i], e4m3x2_lo(lo), e4m3x2_hi(lo), e4m3x2_lo(hi), e4m3x2_hi(hi), pb0, pb1);
    }
#else
    const u32 vsA = e4m3x2_lo(prmt(cur.vbs[0], cur.vbs[2], 0x0040u));   // block scales of tokens ci, ci+8
    const u32 vsB = e4m3x2_lo(prmt(cur.vbs[1], cur.vbs[3], 0x0040u));   // tokens ci+4, ci+12
#pragma unroll
    for (int wq = 0; wq < VWORDS; ++wq) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            // Interleave the two tokens' code bytes, then unpack: the unpacking is bytewise, so it
            // commutes with the permute, and permuting packed codes takes half as many permutes.
            const u32 sel = half ? 0x7362u : 0x5140u;
            const u32 rA = prmt(cur.v[0][wq], cur.v[2][wq], sel);        // tokens ci, ci+8
            const u32 rB = prmt(cur.v[1][wq], cur.v[3][wq], sel);        // tokens ci+4, ci+12
            const u32 lA = e2m1_lo_to_e4m3(rA), hA = e2m1_hi_to_e4m3(rA);
            const u32 lB = e2m1_lo_to_e4m3(rB), hB = e2m1_hi_to_e4m3(rB);
#if PROBE_NOCVT & 2
            // timing probe: the placed words go to the MMAs as they are (no conversion, no block scale)
            const u32 live = wq + half ? 0u : cur.vbs[0] ^ cur.vbs[1] ^ cur.vbs[2] ^ cur.vbs[3];   // scale bytes kept live
            mma16816(st.acc[4 * wq + 2 * half], lA ^ live, hA, lB, hB, pb0, pb1);
            mma16816(st.acc[4 * wq + 2 * half + 1], hA, lA, hB, lB, pb0, pb1);
#else
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 4 * wq + 2 * half + e;                      // even d = 8wq + 2(2half+e)
                const u32 A0 = e ? e4m3x2_hi(lA) : e4m3x2_lo(lA);
                const u32 A1 = e ? e4m3x2_hi(hA) : e4m3x2_lo(hA);
                const u32 A2 = e ? e4m3x2_hi(lB) : e4m3x2_lo(lB);
                const u32 A3 = e ? e4m3x2_hi(hB) : e4m3x2_lo(hB);
                mma16816(st.acc[i], hmul2(A0, vsA), hmul2(A1, vsA), hmul2(A2, vsB), hmul2(A3, vsB), pb0, pb1);
            }
#endif
        }
    }
#endif
}
