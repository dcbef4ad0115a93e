// CPU twin of cuda/float_ops.cuh for the warp emulator (kvemu.h): the same functions, on the host
// (built with -ffp-contract=off, so that every operation rounds once, as the PTX ones do).
#pragma once

#include "ptx_common.cuh"

inline float div_rn(float a, float b) { return a / b; }
inline float rcp_rn(float a) { return 1.0f / a; }
inline float mul_rn(float a, float b) { return a * b; }
inline float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
// rcp.approx is within an ulp of 1/a; the correctly rounded value is one of the values it may give.
inline float rcp_approx_ftz(float a) {
    if (std::fpclassify(a) == FP_SUBNORMAL) a = std::copysign(0.0f, a);
    return 1.0f / a;
}
inline u32 bmax_abs2(u32 a, u32 b) {
    u32 r = 0;
    for (int half = 0; half < 2; ++half) {
        const u32 x = (a >> (16 * half)) & 0xffffu, y = (b >> (16 * half)) & 0xffffu;
        const bool nan = (x & 0x7fffu) > 0x7f80u || (y & 0x7fffu) > 0x7f80u;
        const u32 m = nan ? 0x7fffu : (((x & 0x7fffu) > (y & 0x7fffu) ? x : y) & 0x7fffu) | ((x ^ y) & 0x8000u);
        r |= m << (16 * half);
    }
    return r;
}
// fp32 -> E4M3 bits, round to nearest even, saturating to +-448 (NaN stays NaN).
inline u32 kvemu_e4m3_satfinite(float x) {
    if (std::isnan(x)) return 0x7fu;
    const u32 s = std::signbit(x) ? 0x80u : 0u;
    const float a = std::fabs(x);
    if (a >= 448.0f) return s | 0x7eu;
    if (a < 0.015625f) return s | (u32)std::nearbyint(a * 512.0f);     // subnormals: multiples of 2^-9
    int e;
    const float fr = std::frexp(a, &e);                                   // a = fr * 2^e, fr in [0.5, 1)
    u32 mant = (u32)std::nearbyint(fr * 16.0f);
    if (mant == 16u) { mant = 8u; ++e; }
    const u32 bits = ((u32)(e - 1 + 7) << 3) | (mant - 8u);
    return s | (bits > 0x7eu ? 0x7eu : bits);
}
inline u32 e4m3x2(float hi, float lo) { return (kvemu_e4m3_satfinite(hi) << 8) | kvemu_e4m3_satfinite(lo); }
inline float e4m3_value(u32 b) { return kvemu::e4m3_to_float(b); }
