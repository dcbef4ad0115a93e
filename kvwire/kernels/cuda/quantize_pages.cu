// Quantise-on-write for FP8 and NVFP4 pages: bf16 K or V [n, P, H, D] -> page data + scales,
// bit-identical to kvwire.quant.quantize_pages (the torch reference).
//
// Compiled at run time by NVRTC (kvwire/kernels/nvrtc.py) with these macros:
//   H (KV heads), P (page size), D (64 or 128), CPL (16-byte chunks per thread), ELEM (1 fp8,
//   2 nvfp4), GRAN (fp8 only: 1 token, 2 page, 3 static = tensor/head), CHECK (count NaN/inf
//   into *flag), DIVSTEPS (FMA correction steps of the exact division, 1 or 2); NVFP4 variants:
//   NOCLAMP (skip the clamp to 6 where the block scale is a normal E4M3, see below), AMAX2 (block
//   amax by packed bf16x2 max: one instruction per two elements), E2M1MIN (the E2M1 code as the
//   least of three magic-number roundings, see e2m1_mag_biased); HFAST (a one-dimensional grid with
//   the KV head fastest, so the blocks running together read whole [H, D] token rows of x); LDL1
//   (input loads allocated in L1, see ld_stream; on by default, quantize_cuda.py).
//
// Layout of the work: one block of TPT = P * D / (8 * CPL) threads per (page, KV head) tile; the
// [P, D] bf16 tile is read with 16-byte loads, all issued before any arithmetic, and stays in
// registers, so token amax is a warp shuffle and the page (global) amax one shared-memory step,
// not a second pass. Thread t owns unit c = t % UPR of rows r0, r0 + RPS, ... (r0 = t / UPR): a
// unit is 8 elements for FP8 and one whole NVFP4 block of 16 (block amax, scale and reciprocal
// in-thread), a row is UPR lanes of one warp, and every store is a contiguous 8-byte vector of the
// page's data section. CPL is tuned per element type in quantize_cuda.py (docs/benchmarks.md).
//
// Exact division, cheaply: see exact_division.cuh (a reciprocal per scale and FMA corrections per
// element instead of div.rn). The sign is copied from x (s > 0), since x = -0 comes out +0 there.
#if ELEM == 2
#define UC 2                        // chunks per unit: an NVFP4 block of 16 is one thread's
#else
#define UC 1
#endif
#define UPR (D / (8 * UC))          // units per row (= threads per row)
#define TPT (P * D / (8 * CPL))     // threads per tile (= per block)
#define NWARP (TPT / 32)
#define RPS (TPT / UPR)             // rows one sweep of the block's loads covers
#define NL CPL                      // chunks per thread
#define NU (CPL / UC)               // units per thread
#if TPT % 32 != 0 || TPT > 1024 || CPL % UC != 0
#error "P * D / (8 * CPL) must be a multiple of 32, at most 1024, and CPL even for NVFP4"
#endif

#ifndef NOCLAMP
#define NOCLAMP 0
#endif
#ifndef AMAX2
#define AMAX2 0
#endif
#ifndef HFAST
#define HFAST 0
#endif
#ifndef LDL1
#define LDL1 0
#endif

#include "ptx_common.cuh"
#include "exact_division.cuh"      // float_ops.cuh through it

// NVFP4 lanes read their 32-byte block as two 16-byte loads, so each load instruction asks for half
// of 32 sectors; LDL1 sends them through L1, where the second half can hit. FP8 lanes gained too
// (2-4% on an H100, quantize_cuda.py); why was not profiled.
__device__ __forceinline__ uint4 ld_stream(const u16* p) {
    uint4 r;
#if LDL1
    ld16_l1((const u8*)p, &r.x);
#else
    ld16((const u8*)p, &r.x);
#endif
    return r;
}

// Element e (0..7) of a 16-byte chunk of bf16, as fp32 (exact).
__device__ __forceinline__ float elem(const uint4& v, int e) {
    u32 w = (e < 2) ? v.x : (e < 4) ? v.y : (e < 6) ? v.z : v.w;
    return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
}
// |element e| of a chunk, for the NVFP4 path (which divides magnitudes): odd elements with the
// sign masked off in the unpacking AND; even ones through fabsf, which the compiler folds into the
// division's multiply and FMA as an operand modifier (no instruction of its own).
__device__ __forceinline__ float elem_abs(const uint4& v, int e) {
    u32 w = (e < 2) ? v.x : (e < 4) ? v.y : (e < 6) ? v.z : v.w;
    return (e & 1) ? __uint_as_float(w & 0x7fff0000u) : fabsf(__uint_as_float(w << 16));
}
// amax / limit, or 1 where that is 0: a zero scale would store 0/0 = NaN codes. The reference's rule
// (quant.scale_from_amax), where an fp32 amax can also underflow the quotient; from bf16 input, as
// here, only amax 0 can (bf16's smallest subnormal / 2688 is still above 0).
__device__ __forceinline__ float scale_or_one(float q) { return q > 0.0f ? q : 1.0f; }

__device__ __forceinline__ float chunk_amax(const uint4& v) {
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(elem(v, e)));
    return m;
}
// max |x| of two chunks (an NVFP4 block of 16), as fp32: packed bf16x2 maxima of magnitudes
// (bmax_abs2 takes |.| of its inputs itself); the result's sign, the XOR of the inputs' signs, is
// dropped at the end.
__device__ __forceinline__ float block_amax2(const uint4& v, const uint4& w) {
    const u32 m = bmax_abs2(bmax_abs2(bmax_abs2(v.x, v.y), bmax_abs2(v.z, v.w)),
                            bmax_abs2(bmax_abs2(w.x, w.y), bmax_abs2(w.z, w.w)));
    return fmaxf(fabsf(__uint_as_float(m << 16)), fabsf(__uint_as_float(m & 0xffff0000u)));
}
__device__ __forceinline__ int chunk_non_finite(const uint4& v) {
    int n = 0;
    u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) n += ((w[k] & 0x7f80u) == 0x7f80u) + ((w[k] & 0x7f800000u) == 0x7f800000u);
    return n;
}
// |y| in [0, 6.375] -> E2M1 magnitude code 0..7, nearest, ties to even. The codes are 2|y| rounded
// below 2, 2 + |y| rounded in [2, 4) and 4 + |y|/2 rounded in [4, 6.375] (7 for all of (6, 6.375],
// as if clamped to 6): scale by m = 2^(1-k) (k = 0, 1, 2 from the exponent) and round to an
// integer by adding 2^23. Callers clamp to 6 wherever |y| could go past 6.375.
// Returned biased: the code plus E2M1_BIAS, which nibble_sum takes off for a whole word at once.
// E2M1MIN: the same code as min(rnd(2|y|), rnd(|y| + 2), rnd(|y| / 2 + 4)), rnd to the nearest
// integer, ties to even: the three pieces meet at 2 and 4, the function is concave, and rnd is
// monotone, so the least piece is the right one. Each rnd is one FMA with 2^23 (+2, +4) added, which
// rounds once and leaves the integer in the low bits; the least is one 3-way integer min (VIMNMX3;
// two float mins measured slower). That is three FMA-pipe instructions and one ALU one, against
// four ALU and one FMA for the exponent form.
#ifndef E2M1MIN
#define E2M1MIN 0
#endif
#if E2M1MIN
#define E2M1_BIAS 0x4b000000u
__device__ __forceinline__ u32 e2m1_mag_biased(float mag) {
    const float c1 = fma_rn(mag, 2.0f, 8388608.0f);
    const float c2 = fma_rn(mag, 1.0f, 8388610.0f);
    const float c3 = fma_rn(mag, 0.5f, 8388612.0f);
    return min(min(__float_as_uint(c1), __float_as_uint(c2)), __float_as_uint(c3));
}
#else
#define E2M1_BIAS 0x4b0000feu
__device__ __forceinline__ u32 e2m1_mag_biased(float mag) {
    const int k = max((int)(__float_as_uint(mag) >> 23), 127);          // 127 + k
    const float m = __uint_as_float((u32)(255 - k) << 23);
    return __float_as_uint(fma_rn(mag, m, 8388608.0f)) + 2u * (u32)k;
}
#endif
// The 8 codes b[e] - E2M1_BIAS as the nibbles e of one word: a sum of b[e] * 16^e (multiply-adds,
// on the FMA pipe, where shifts and ORs would load the integer ALU pipe that bounds this kernel)
// plus one constant that removes all eight biases modulo 2^32; codes are < 8, so nothing carries.
__device__ __forceinline__ u32 nibble_sum(const u32* b) {
    u32 acc = 0u - E2M1_BIAS * 0x11111111u;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += b[e] * (1u << (4 * e));
    return acc;
}
// The sign bits of a chunk's 8 bf16 elements at E2M1 nibble positions (bit 4e + 3 for element e):
// gather the high byte of every element (4 byte permutes), then move odd elements' sign bits to
// bit 7 and even ones' to bit 3 of each output byte.
__device__ __forceinline__ u32 e2m1_signs(const uint4& v) {
    const u32 t0 = prmt(v.x, v.y, 0x7531), t1 = prmt(v.z, v.w, 0x7531);   // high bytes of elements 0..7
    const u32 odd = prmt(t0, t1, 0x7531), even = prmt(t0, t1, 0x6420);
    return (odd & 0x80808080u) | ((even >> 4) & 0x08080808u);
}
// One NVFP4 block's 8 data bytes: the 16 codes (biased, from e2m1_mag_biased) with the signs of
// the two bf16 chunks they came from.
__device__ __forceinline__ void store_nvfp4_unit(u8* dst, const uint4& c0, const uint4& c1, const u32* mag) {
    uint2 out;
    out.x = e2m1_signs(c0) | nibble_sum(mag);
    out.y = e2m1_signs(c1) | nibble_sum(mag + 8);
    *(uint2*)dst = out;
}
// Max of a over the block (every thread gets it): warp shuffles, then one shared-memory step.
__device__ __forceinline__ float block_max(float a, float* sm, int warp, int lane) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) a = fmaxf(a, shfl_xor(a, m));
#if NWARP > 1
    if (lane == 0) sm[warp] = a;
    block_sync();
#pragma unroll
    for (int w = 0; w < NWARP; ++w) a = fmaxf(a, sm[w]);
#endif
    return a;
}

extern "C" __global__ void __launch_bounds__(TPT) kvwire_quantize_pages(
    const u16* __restrict__ x, i64 sx_n, i64 sx_p, i64 sx_h, const i64* __restrict__ ids,
    u8* __restrict__ st, i64 page_bytes, i64 data_off, i64 s_off, i64 bs_off, i64 gs_off,
    const float* __restrict__ static_scale, int* __restrict__ flag,
    int layers, i64 ls_data, i64 ls_s, i64 ls_bs, i64 ls_gs) {
    __shared__ float sm_max[NWARP];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
#if HFAST
    const int h = blockIdx.x % H;
    const i64 n = blockIdx.x / H;
#else
    const int h = blockIdx.y;
    const i64 n = blockIdx.x;
#endif
    const int c = t % UPR, r0 = t / UPR;
    const u16* xb = x + n * sx_n + (i64)h * sx_h + c * (8 * UC);
    uint4 v[NL];
#pragma unroll
    for (int u = 0; u < NU; ++u)
#pragma unroll
        for (int k = 0; k < UC; ++k) v[u * UC + k] = ld_stream(xb + (i64)(r0 + u * RPS) * sx_p + 8 * k);
    // Tile n is layer n % layers of page ids[n / layers]: each section moves by its layer stride
    // (write_page_layers; one layer: layers = 1, strides 0).
    const u32 layer = (u32)n % (u32)layers;
    u8* page = st + ids[(u32)n / (u32)layers] * page_bytes;
    data_off += layer * ls_data; s_off += layer * ls_s; bs_off += layer * ls_bs; gs_off += layer * ls_gs;
    const i64 row0 = (i64)h * P + r0;           // this thread's first row in the page's [H, P] rows

#if CHECK
    int bad = 0;
#pragma unroll
    for (int l = 0; l < NL; ++l) bad += chunk_non_finite(v[l]);
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) bad += shfl_xor_i(bad, m);
    if (lane == 0 && bad) atomicAdd(flag, bad);
#endif

#if ELEM != 2 || !AMAX2
    float am[NL];
#pragma unroll
    for (int l = 0; l < NL; ++l) am[l] = chunk_amax(v[l]);
#endif

#if ELEM == 1
    // ---- FP8 (E4M3) data, scale per token / page / static -------------------------------------
    float sc[NL];
#if GRAN == 1
#pragma unroll
    for (int l = 0; l < NL; ++l) {
        float a = am[l];
#pragma unroll
        for (int m = UPR / 2; m >= 1; m >>= 1) a = fmaxf(a, shfl_xor(a, m));
        sc[l] = scale_or_one(div_rn(a, 448.0f));
        if (c == 0) *(float*)(page + s_off + (row0 + l * RPS) * 4) = sc[l];
    }
#elif GRAN == 2
    float a = 0.0f;
#pragma unroll
    for (int l = 0; l < NL; ++l) a = fmaxf(a, am[l]);
    a = block_max(a, sm_max, warp, lane);
    const float s = scale_or_one(div_rn(a, 448.0f));
    if (t == 0) *(float*)(page + s_off + (i64)h * 4) = s;
#pragma unroll
    for (int l = 0; l < NL; ++l) sc[l] = s;
#else
    const float s = static_scale[h];
#pragma unroll
    for (int l = 0; l < NL; ++l) sc[l] = s;
#endif
#pragma unroll
    for (int l = 0; l < NL; ++l) {
        float q[8];
        // A static scale can be far below the data (|x/s| huge): keep the fast path to |x/s| <= 2^60,
        // where cvt's saturation equals the reference's clamp to +-448.
        if (div_fast_ok(sc[l]) && am[l] <= sc[l] * 0x1p60f) {
            const float r = rcp_rn(sc[l]);
#pragma unroll
            for (int e = 0; e < 8; ++e) q[e] = copysignf(div_fast(elem(v[l], e), sc[l], r), elem(v[l], e));
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) q[e] = fminf(fmaxf(div_rn(elem(v[l], e), sc[l]), -448.0f), 448.0f);
        }
        uint2 out;
        out.x = e4m3x2(q[1], q[0]) | (e4m3x2(q[3], q[2]) << 16);
        out.y = e4m3x2(q[5], q[4]) | (e4m3x2(q[7], q[6]) << 16);
        *(uint2*)(page + data_off + (row0 + l * RPS) * D + c * 8) = out;
    }
#elif ELEM == 2
    // ---- NVFP4: E2M1 data, E4M3 scale per 16-element block, fp32 global scale per page and head
    float bam[NU];
    float a = 0.0f;
#pragma unroll
    for (int u = 0; u < NU; ++u) {
#if AMAX2
        bam[u] = block_amax2(v[2 * u], v[2 * u + 1]);
#else
        bam[u] = fmaxf(am[2 * u], am[2 * u + 1]);
#endif
        a = fmaxf(a, bam[u]);
    }
    a = block_max(a, sm_max, warp, lane);
    const float glob = scale_or_one(div_rn(a, 2688.0f));
    const float g6 = mul_rn(glob, 6.0f);
    const bool g6_fast = div_fast_ok(g6);
    const float r6 = rcp_rn(g6);
    if (t == 0) *(float*)(page + gs_off + (i64)h * 4) = glob;
    // Block scales first: when every block of this thread has a normal E4M3 scale in the fast
    // division's range (NOCLAMP: the usual case), its blocks take one branch-free path.
    float sv[NU];
    bool all_fast = NOCLAMP != 0;
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        const float bq = g6_fast ? div_fast(bam[u], g6, r6) : div_rn(bam[u], g6);
        const u32 bbits = e4m3x2(0.0f, fminf(bq, 448.0f)) & 0xffu;
        page[bs_off + (row0 + u * RPS) * (D / 16) + c] = (u8)bbits;
        sv[u] = mul_rn(e4m3_value(bbits), glob);
        all_fast = all_fast && bbits >= 8u && div_fast_ok(sv[u]);
    }
    if (all_fast) {
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            // A normal E4M3 block scale is within 2^-4 of bq (relative), so |x / s| <= 6.375 + tiny
            // and the unclamped code, 4 + round(|y| / 2), is still 7 above 6: no clamp needed.
            u32 mag[16];
            const float s = sv[u], r = rcp_rn_in_range(s);
#pragma unroll
            for (int e = 0; e < 16; ++e) mag[e] = e2m1_mag_biased(div_fast(elem_abs(v[2 * u + e / 8], e % 8), s, r));
            store_nvfp4_unit(page + data_off + (row0 + u * RPS) * (D / 2) + c * 8, v[2 * u], v[2 * u + 1], mag);
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        const float s = sv[u];
        u32 mag[16];
        if (s > 0.0f && div_fast_ok(s)) {
            const float r = rcp_rn_in_range(s);
#pragma unroll
            for (int e = 0; e < 16; ++e) mag[e] = e2m1_mag_biased(fminf(div_fast(elem_abs(v[2 * u + e / 8], e % 8), s, r), 6.0f));
        } else if (s > 0.0f) {
#pragma unroll
            for (int e = 0; e < 16; ++e) mag[e] = e2m1_mag_biased(fminf(div_rn(elem_abs(v[2 * u + e / 8], e % 8), s), 6.0f));
        } else {
#pragma unroll
            for (int e = 0; e < 16; ++e) mag[e] = E2M1_BIAS;
        }
        store_nvfp4_unit(page + data_off + (row0 + u * RPS) * (D / 2) + c * 8, v[2 * u], v[2 * u + 1], mag);
    }
#else
#error "ELEM must be 1 (fp8) or 2 (nvfp4)"
#endif
}
