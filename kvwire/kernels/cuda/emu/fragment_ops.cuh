// CPU twin of cuda/fragment_ops.cuh for the warp emulator (kvemu.h): the same functions, on the host.
#pragma once

#include "ptx_common.cuh"

inline float ex2(float x) { return std::exp2(x); }
inline u32 pack_f16x2(float lo, float hi) { return kvemu::float_to_half(lo) | ((u32)kvemu::float_to_half(hi) << 16); }
inline u32 e4m3x2_to_f16x2(u32 two_bytes) {
    return kvemu::float_to_half(kvemu::e4m3_to_float(two_bytes)) |
           ((u32)kvemu::float_to_half(kvemu::e4m3_to_float(two_bytes >> 8)) << 16);
}
inline u32 e4m3x2_lo(u32 w) { return e4m3x2_to_f16x2(w & 0xffffu); }
inline u32 e4m3x2_hi(u32 w) { return e4m3x2_to_f16x2(w >> 16); }
inline u32 hmul2(u32 a, u32 b) {
    // The product of two f16 values is exact in fp32, so one rounding to f16 is mul.rn.f16's.
    const float lo = kvemu::half_to_float(a & 0xffffu) * kvemu::half_to_float(b & 0xffffu);
    const float hi = kvemu::half_to_float(a >> 16) * kvemu::half_to_float(b >> 16);
    return pack_f16x2(lo, hi);
}
inline u32 hmul2_lo(u32 a, u32 b) { return hmul2(a, (b & 0xffffu) * 0x10001u); }
inline u32 hmul2_hi(u32 a, u32 b) { return hmul2(a, (b >> 16) * 0x10001u); }
// mma.sync.m16n8k16.row.col.f32.f16.f16.f32: lane (g = lane / 4, t = lane % 4) holds A rows g and
// g + 8 at k 2t, 2t+1 (a0, a1) and 2t+8, 2t+9 (a2, a3); B column g at k 2t, 2t+1 (b0) and 2t+8,
// 2t+9 (b1); C/D rows g, g + 8 at columns 2t, 2t+1.
inline void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    u32* s = kvemu::my_slot();
    s[0] = a0; s[1] = a1; s[2] = a2; s[3] = a3; s[4] = b0; s[5] = b1;
    kvemu::warp_barrier();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        const u32* o = kvemu::slot_of(l);
        const int g = l >> 2, t = l & 3;
        const int rows[4] = {g, g + 8, g, g + 8}, ks[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int r = 0; r < 4; ++r) {
            A[rows[r]][ks[r]] = kvemu::half_to_float(o[r] & 0xffffu);
            A[rows[r]][ks[r] + 1] = kvemu::half_to_float(o[r] >> 16);
        }
        B[2 * t][g] = kvemu::half_to_float(o[4] & 0xffffu);
        B[2 * t + 1][g] = kvemu::half_to_float(o[4] >> 16);
        B[2 * t + 8][g] = kvemu::half_to_float(o[5] & 0xffffu);
        B[2 * t + 9][g] = kvemu::half_to_float(o[5] >> 16);
    }
    const int lane = kvemu::cur()->lane, g = lane >> 2, t = lane & 3;
    const int row[4] = {g, g, g + 8, g + 8}, col[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; ++i) {
        float acc = c[i];
        for (int k = 0; k < 16; ++k) acc += A[row[i]][k] * B[k][col[i]];
        c[i] = acc;
    }
}
inline void ld8(const u8* p, u32* r) { std::memcpy(r, p, 8); }
inline float ldf(const u8* p) {
    float r;
    std::memcpy(&r, p, 4);
    return r;
}
inline u32 ldb(const u8* p) { return *p; }
inline float bf16_to_f32(u16 v) { return kvemu::bf16_bits_to_float(v); }
inline float fmx(float a, float b) { return std::fmax(a, b); }
inline u32 ldh(const u8* p) {
    u16 r;
    std::memcpy(&r, p, 2);
    return r;
}
inline void prefetch_l2(const u8*) {}
inline int imin(int a, int b) { return a < b ? a : b; }
inline const u8* page_at(const u8* storage, int id, i64 page_bytes) {
    return storage + (unsigned long long)(u32)id * (u32)page_bytes;
}
