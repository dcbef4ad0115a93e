// Number formats for kvwire's CPU warp emulator (kvemu.h): f16, bf16 and E4M3 bits <-> float, rounded
// as the GPU's conversions round (to nearest even, subnormals kept).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvemu {

inline float half_to_float(uint16_t h) {
    const uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31u, m = h & 1023u;
    uint32_t bits;
    if (e == 31) {
        bits = s | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        if (m == 0) return s ? -0.0f : 0.0f;
        const float v = std::ldexp((float)m, -24);
        return s ? -v : v;
    } else {
        bits = s | ((e + 112u) << 23) | (m << 13);
    }
    float r;
    std::memcpy(&r, &bits, 4);
    return r;
}
inline uint16_t float_to_half(float x) {          // round to nearest even, subnormals kept
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint32_t s = (bits >> 16) & 0x8000u;
    const float a = std::fabs(x);
    if (std::isnan(x)) return (uint16_t)(s | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(s | 0x7c00u);
    if (a < 6.103515625e-05f) {              // subnormal range: multiples of 2^-24
        const float q = std::nearbyint(a * 16777216.0f);
        return (uint16_t)(s | (uint32_t)q);
    }
    int e;
    const float fr = std::frexp(a, &e);      // a = fr * 2^e, fr in [0.5, 1)
    float mant = std::nearbyint(fr * 2048.0f);   // 11 significant bits
    if (mant == 2048.0f) { mant = 1024.0f; ++e; }
    const uint32_t exp = (uint32_t)(e - 1 + 15);
    if (exp >= 31) return (uint16_t)(s | 0x7c00u);
    return (uint16_t)(s | (exp << 10) | ((uint32_t)mant - 1024u));
}
inline float e4m3_to_float(uint32_t b) {
    b &= 0xffu;
    const uint32_t s = b >> 7, e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = std::ldexp((float)m, -9);
    else v = std::ldexp(1.0f + (float)m / 8.0f, (int)e - 7);
    return s ? -v : v;
}
inline float bf16_bits_to_float(uint32_t h) {
    const uint32_t bits = h << 16;
    float r;
    std::memcpy(&r, &bits, 4);
    return r;
}

}  // namespace kvemu
