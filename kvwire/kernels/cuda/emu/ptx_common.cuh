// CPU twin of cuda/ptx_common.cuh for the warp emulator (kvemu.h): the same functions, on the host.
#pragma once

#include "kvemu.h"

inline float shfl_xor(float v, int m) {
    return __uint_as_float(kvemu::shuffle(__float_as_uint(v), kvemu::cur()->lane ^ m));
}
inline u32 shfl_idx(u32 v, int src) { return kvemu::shuffle(v, src); }
inline float shfl_idx_f(float v, int src) { return __uint_as_float(kvemu::shuffle(__float_as_uint(v), src)); }
inline bool any_sync(bool p) { return kvemu::vote_any(p); }
inline void launch_dependents() {}
inline void block_sync() { kvemu::block_barrier(); }
inline void warp_sync() { kvemu::warp_barrier(); }
// prmt.b32 (default mode): byte i of the result is byte n & 7 of {b:a}, or its sign replicated when
// bit 3 of selector nibble n is set.
inline u32 prmt(u32 a, u32 b, u32 sel) {
    const unsigned long long pool = ((unsigned long long)b << 32) | a;
    u32 r = 0;
    for (int i = 0; i < 4; ++i) {
        const u32 n = (sel >> (4 * i)) & 15u;
        u32 byte = (u32)(pool >> (8 * (n & 7u))) & 0xffu;
        if (n & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
        r |= byte << (8 * i);
    }
    return r;
}
inline void ld16(const u8* p, u32* r) { std::memcpy(r, p, 16); }
inline void ld16_l1(const u8* p, u32* r) { std::memcpy(r, p, 16); }
inline u32 smem_addr(const void* p) { return kvemu::shared_addr(p); }
inline void lds_v4(u32 a, u32* r) { std::memcpy(r, kvemu::shared_ptr(a), 16); }
inline void lds_v2(u32 a, u32* r) { std::memcpy(r, kvemu::shared_ptr(a), 8); }
inline void lds_v2_ordered(u32 a, u32& r0, u32& r1) {
    std::memcpy(&r0, kvemu::shared_ptr(a), 4);
    std::memcpy(&r1, kvemu::shared_ptr(a) + 4, 4);
}
inline u32 lds_u32(u32 a) {
    u32 r;
    std::memcpy(&r, kvemu::shared_ptr(a), 4);
    return r;
}
inline float lds_f32(u32 a) { return __uint_as_float(lds_u32(a)); }
inline u32 lds_u16(u32 a) {
    u16 r;
    std::memcpy(&r, kvemu::shared_ptr(a), 2);
    return r;
}
inline u32 lds_u8(u32 a) { return *kvemu::shared_ptr(a); }
inline int shfl_xor_i(int v, int m) { return (int)kvemu::shuffle((u32)v, kvemu::cur()->lane ^ m); }
