// CPU twin of cuda/bulk_copy.cuh for the warp emulator (kvemu.h). An mbarrier keeps its state in its
// own 8 shared bytes: the transaction bytes still due (int32), the arrivals still due (u16), the
// arrival count (u8) and the phase parity (u8). A bulk copy lands at once and counts its bytes
// off; a wait that finds its phase incomplete lets the other fibers run and polls again.
#pragma once

#include "ptx_common.cuh"

struct KvemuMbar {
    int32_t tx;
    u16 pending;
    u8 count;
    u8 phase;
};
static_assert(sizeof(KvemuMbar) == 8, "an mbarrier is 8 bytes");

inline KvemuMbar* kvemu_mbar(u32 bar) { return (KvemuMbar*)kvemu::shared_ptr(bar); }
inline void kvemu_mbar_complete_if_due(KvemuMbar* m) {
    if (m->pending == 0 && m->tx == 0) {
        m->phase ^= 1u;
        m->pending = m->count;
    }
    ++kvemu::g_launch->progress;
}
inline void mbar_init(u32 bar, u32 count = 1) { *kvemu_mbar(bar) = KvemuMbar{0, (u16)count, (u8)count, 0}; }
inline void mbar_arrive(u32 bar) {
    KvemuMbar* m = kvemu_mbar(bar);
    if (m->pending == 0) kvemu::fail("mbarrier arrive with no arrival pending");
    --m->pending;
    kvemu_mbar_complete_if_due(m);
}
inline void mbar_init_fence() {}
inline void mbar_expect(u32 bar, u32 bytes) {
    kvemu_mbar(bar)->tx += (int32_t)bytes;
    mbar_arrive(bar);
}
inline bool mbar_try_wait(u32 bar, u32 parity) {
    if (kvemu_mbar(bar)->phase != (parity & 1u)) return true;
    kvemu::yield_to_scheduler();
    return false;
}
inline void bulk_copy(u32 dst, const u8* src, u32 bytes, u32 bar) {
    if (bytes % 16 || (uintptr_t)kvemu::shared_ptr(dst) % 16 || (uintptr_t)src % 16)
        kvemu::fail("cp.async.bulk needs 16-byte aligned addresses and sizes");
    std::memcpy(kvemu::shared_ptr(dst), src, bytes);
    KvemuMbar* m = kvemu_mbar(bar);
    m->tx -= (int32_t)bytes;
    kvemu_mbar_complete_if_due(m);
}
