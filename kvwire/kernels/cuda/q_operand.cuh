// q as the B operand of the score MMAs (column gi = query head h*G + gi, zero beyond G; with EVENCOLS
// column 2j = head j and the odd columns zero, or with KLINES head j's d >= 64: the caller picks the
// row), as f16 pairs in the K
// visiting order, and fill_q, which loads it. Part of paged_decode_split.cu: it uses
// that kernel's macros (D, KELEM, QSMEM, QF32) and is included after decode_page_regs.cuh.
#pragma once

// k-steps of q: with KLINES every column holds half of d (its caller offsets odd columns' rows by
// 64), so the score MMAs take 4 k-steps of q instead of 8.
#define QSTEPS (KLINES ? KSTEPS / 2 : KSTEPS)

// In registers, or (QSMEM=1) in shared memory, read per k-step. The second frees 2 * D/16 registers
// per thread, which at 96 registers is what lets the compiler issue all of a page's loads before
// its first MMA (with q in registers it delays the V loads past the score MMAs: two memory round
// trips per page). Shared layout: [KSTEPS][32 lanes][2].
struct QOperand {
#if QSMEM
    u32 base;
    __device__ __forceinline__ void get(int kt, u32& b0, u32& b1) const {
        lds_v2_ordered(base + kt * 256, b0, b1);
    }
#else
    u32 f[QSTEPS][2];
    __device__ __forceinline__ void get(int kt, u32& b0, u32& b1) const { b0 = f[kt][0]; b1 = f[kt][1]; }
#endif
};

// Fills ``qop`` with q of query head gi (a row at ``qrow``; zeros when ``real`` is false); with
// QSMEM the fragments go to ``smq`` (this lane's first slot) when ``store``. The d of k-step s
// follows the key words' load order (decode_page_regs.cuh): FP8 word s holds d = 64(s/4) + 16ci +
// 4(s%4) + 0..3; NVFP4 word w's even and odd codes make k-steps 2w and 2w + 1.
template <class T>
__device__ __forceinline__ void fill_q(QOperand& qop, u32* smq, bool store, const T* qrow, bool real, int ci) {
#if QF32
#define QLOAD(i) (real ? (float)qrow[i] : 0.f)
#else
#define QLOAD(i) (real ? bf16_to_f32(qrow[i]) : 0.f)
#endif
#pragma unroll
    for (int s = 0; s < QSTEPS; ++s) {
        int d0, d1, d2, d3;
#if KELEM == 1
        const int base = 64 * (s / 4) + 16 * ci + 4 * (s % 4);
        d0 = base; d1 = base + 1; d2 = base + 2; d3 = base + 3;
#else
        const int base = ci * (D / 4) + 8 * (s / 2) + 4 * (s % 2);
        d0 = base; d1 = base + 2; d2 = base + 1; d3 = base + 3;
#endif
        const float x0 = QLOAD(d0), x1 = QLOAD(d1), x2 = QLOAD(d2), x3 = QLOAD(d3);
#if QSMEM
        if (store) { smq[s * 64] = pack_f16x2(x0, x1); smq[s * 64 + 1] = pack_f16x2(x2, x3); }
#else
        qop.f[s][0] = pack_f16x2(x0, x1);
        qop.f[s][1] = pack_f16x2(x2, x3);
#endif
    }
#undef QLOAD
}
