// kvwire's CPU warp emulator: runs the CUDA kernels of kvwire/kernels/cuda on the host, so that the
// CPU test suite can check them against the torch reference (as it checks the Triton kernels in
// Triton's interpreter). Built by kvwire/kernels/cuda_emulator.py with g++: the kernel source and
// its logic headers are compiled unchanged; the primitives headers (ptx_common, fragment_ops,
// bulk_copy, float_ops) are replaced by the twins in this directory, which call into this file.
//
// Model: every CUDA thread of a block is a fiber (its own stack) on one OS thread; blocks run one
// after another. A fiber runs until it reaches a barrier or a warp collective, then the next one
// runs. A collective (shuffle, vote, mma.sync) is a warp barrier: each lane leaves its operands in
// the warp's exchange slots, and once every live lane has arrived each reads what it needs. The
// slots alternate between two buffers by barrier generation, so a lane may start the next
// collective before its neighbours have read the last one. A deadlock (fibers all waiting, none
// able to go on) ends the launch with an error instead of hanging. __shared__ variables become
// function-local statics, shared by the fibers of the block that is running.
//
// What it does not model: timing, memory ordering between blocks, and anything the kernels do not
// use. f16 arithmetic is rounded as the GPU rounds it (RN, subnormals kept); the MMA accumulates in
// fp32 in k order; ex2.approx is exp2f.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvemu_numbers.h"

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;

struct kvemu_dim3 {
    unsigned x, y, z;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};

namespace kvemu {

enum State { RUNNABLE, WAITING, DONE };

struct Fiber {
    void* sp = nullptr;                 // saved stack pointer while switched out
    std::unique_ptr<unsigned char[]> stack;   // not zeroed: pages are touched only as used
    kvemu_dim3 tid{0, 0, 0};
    int lane = 0, warp = 0;
    State state = RUNNABLE;
    int wait_kind = 0;                  // 1 warp barrier, 2 block barrier
};

constexpr int SLOT_WORDS = 12;          // the widest collective: mma16816 (6 words + 4 floats)

// A barrier among the live threads of a warp or of the block; gen counts the times it completed.
struct Barrier {
    int live = 0, arrived = 0;
    unsigned gen = 0;
};

struct Warp {
    Barrier bar;
    u32 slot[2][32][SLOT_WORDS];
};

struct Launch {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    Barrier block;
    void* sched_sp = nullptr;
    Fiber* cur = nullptr;
    unsigned long progress = 0;
    void (*body)(void*) = nullptr;      // runs the kernel with the launch's arguments
    void* body_arg = nullptr;
    char error[256] = {0};
};

inline Launch* g_launch = nullptr;
inline kvemu_dim3 g_block_idx{0, 0, 0}, g_block_dim{1, 1, 1}, g_grid_dim{1, 1, 1};
inline char g_shared_anchor = 0;        // shared addresses are offsets from this static

extern "C" void kvemu_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, switches stacks, restores the other
// fiber's registers and returns into it. The SSE control word and x87 control word are the same for
// every fiber (nothing here changes them), so they are not saved.
asm(R"(
.text
.p2align 4
.globl kvemu_switch
.hidden kvemu_switch
.type kvemu_switch,@function
kvemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size kvemu_switch, .-kvemu_switch
)");
#else
#error "kvwire's CUDA emulator switches fibers with x86-64 assembly; this host is not x86-64"
#endif

inline Fiber* cur() { return g_launch->cur; }

[[noreturn]] inline void fail(const char* what) {
    std::snprintf(g_launch->error, sizeof(g_launch->error), "%s", what);
    // Leave the fiber for good: the scheduler sees the error and abandons the launch.
    g_launch->cur->state = DONE;
    void* dead;
    kvemu_switch(&dead, g_launch->sched_sp);
    std::abort();
}

inline void yield_to_scheduler() { kvemu_switch(&g_launch->cur->sp, g_launch->sched_sp); }

// The barrier of kind 1 (``warp``'s) or 2 (the block's).
inline Barrier& barrier(int kind, int warp) { return kind == 1 ? g_launch->warps[warp].bar : g_launch->block; }

// Completes the barrier if every live thread has arrived: its waiters may run again.
inline void complete_if_due(int kind, int warp) {
    Barrier& b = barrier(kind, warp);
    if (b.live == 0 || b.arrived != b.live) return;
    b.arrived = 0;
    ++b.gen;
    for (Fiber& o : g_launch->fibers) {
        if (o.state == WAITING && o.wait_kind == kind && (kind == 2 || o.warp == warp)) o.state = RUNNABLE;
    }
}

// Arrive at this warp's (kind 1) or the block's (kind 2) barrier and wait for the others.
inline void arrive(int kind) {
    Fiber* f = cur();
    ++g_launch->progress;
    Barrier& b = barrier(kind, f->warp);
    ++b.arrived;
    const unsigned gen = b.gen;
    complete_if_due(kind, f->warp);
    if (b.gen != gen) return;
    f->state = WAITING;
    f->wait_kind = kind;
    yield_to_scheduler();
}

inline void warp_barrier() { arrive(1); }
inline void block_barrier() { arrive(2); }

// The exchange slots this lane writes before a collective, and reads after it.
inline u32* my_slot() {
    Fiber* f = cur();
    Warp& w = g_launch->warps[f->warp];
    return w.slot[w.bar.gen & 1][f->lane];
}
inline u32* slot_of(int lane_from_last_collective) {
    Fiber* f = cur();
    Warp& w = g_launch->warps[f->warp];
    return w.slot[(w.bar.gen - 1) & 1][lane_from_last_collective];
}

inline u32 shuffle(u32 v, int src) {
    my_slot()[0] = v;
    warp_barrier();
    return slot_of(src & 31)[0];
}
inline bool vote_any(bool p) {
    my_slot()[0] = p ? 1u : 0u;
    warp_barrier();
    bool any = false;
    for (int l = 0; l < 32; ++l) any = any || slot_of(l)[0] != 0;
    return any;
}

inline u32 shared_addr(const void* p) {
    return (u32)(int32_t)((const char*)p - &g_shared_anchor);
}
inline unsigned char* shared_ptr(u32 a) { return (unsigned char*)&g_shared_anchor + (int32_t)a; }

// ---- the launch -----------------------------------------------------------------------------------

constexpr size_t STACK_BYTES = 256 * 1024;

[[noreturn]] inline void fiber_main() {
    g_launch->body(g_launch->body_arg);
    Launch& L = *g_launch;
    Fiber* f = L.cur;
    f->state = DONE;
    ++L.progress;
    // A finished thread no longer counts at barriers; one it was the last to reach completes.
    --L.warps[f->warp].bar.live;
    --L.block.live;
    complete_if_due(1, f->warp);
    complete_if_due(2, f->warp);
    void* dead;
    kvemu_switch(&dead, L.sched_sp);
    std::abort();
}

// Runs every block of the grid; returns 0, or 1 with the reason in ``error``.
inline int run_grid(kvemu_dim3 grid, kvemu_dim3 block, void (*body)(void*), void* arg, char* error, size_t error_len) {
    const int nthreads = (int)(block.x * block.y * block.z);
    if (nthreads <= 0 || nthreads > 1024 || block.y != 1 || block.z != 1) {
        std::snprintf(error, error_len, "block (%u, %u, %u): the emulator runs 1..1024 threads in x only", block.x,
                      block.y, block.z);
        return 1;
    }
    Launch L;
    L.body = body;
    L.body_arg = arg;
    L.fibers.resize(nthreads);
    for (Fiber& f : L.fibers) f.stack.reset(new unsigned char[STACK_BYTES]);
    L.warps.resize((nthreads + 31) / 32);
    g_launch = &L;
    g_grid_dim = grid;
    g_block_dim = block;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                g_block_idx = {bx, by, bz};
                for (Warp& w : L.warps) w.bar = Barrier{};
                L.block = Barrier{nthreads, 0, 0};
                for (int t = 0; t < nthreads; ++t) {
                    Fiber& f = L.fibers[t];
                    f.tid = {(unsigned)t, 0, 0};
                    f.lane = t & 31;
                    f.warp = t >> 5;
                    f.state = RUNNABLE;
                    L.warps[f.warp].bar.live++;
                    // A fresh stack that "returns" into fiber_main with the ABI's alignment.
                    uintptr_t top = ((uintptr_t)f.stack.get() + STACK_BYTES) & ~(uintptr_t)15;
                    void** sp = (void**)(top - 16);
                    sp[0] = (void*)&fiber_main;
                    sp -= 6;
                    for (int k = 0; k < 6; ++k) sp[k] = nullptr;
                    f.sp = sp;
                }
                int idle_passes = 0;
                for (;;) {
                    const unsigned long before = L.progress;
                    bool ran = false;
                    for (Fiber& f : L.fibers) {
                        if (f.state != RUNNABLE) continue;
                        ran = true;
                        L.cur = &f;
                        kvemu_switch(&L.sched_sp, f.sp);
                        if (L.error[0]) {
                            std::snprintf(error, error_len, "block (%u, %u, %u), thread %d: %s", bx, by, bz,
                                          (int)(&f - L.fibers.data()), L.error);
                            g_launch = nullptr;
                            return 1;
                        }
                    }
                    int done = 0;
                    for (const Fiber& f : L.fibers) done += f.state == DONE;
                    if (done == nthreads) break;
                    // No fiber could run, or those that ran only polled (mbarrier waits) many times over.
                    if (!ran || (L.progress == before && ++idle_passes > 10000)) {
                        std::snprintf(error, error_len,
                                      "block (%u, %u, %u): deadlock: %d of %d threads finished, the others wait at "
                                      "barriers that cannot complete", bx, by, bz, done, nthreads);
                        g_launch = nullptr;
                        return 1;
                    }
                    if (L.progress != before) idle_passes = 0;
                }
            }
    g_launch = nullptr;
    return 0;
}

// Calls ``kernel`` with the launch's arguments, given as cuLaunchKernel takes them: an array of
// pointers to the argument values.
template <class... A, size_t... I>
inline void call_with(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}
template <class... A>
struct Call {
    void (*kernel)(A...);
    void** args;
    static void run(void* self) {
        Call* c = static_cast<Call*>(self);
        call_with(c->kernel, c->args, std::index_sequence_for<A...>{});
    }
};
template <class... A>
inline int launch(void (*kernel)(A...), kvemu_dim3 grid, kvemu_dim3 block, void** args, char* error, size_t n) {
    Call<A...> c{kernel, args};
    return run_grid(grid, block, &Call<A...>::run, &c, error, n);
}

}  // namespace kvemu

#define threadIdx (::kvemu::cur()->tid)
#define blockIdx (::kvemu::g_block_idx)
#define blockDim (::kvemu::g_block_dim)
#define gridDim (::kvemu::g_grid_dim)

// CUDA built-ins the kernels use.
inline float __uint_as_float(u32 u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline u32 __float_as_uint(float f) {
    u32 u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline int atomicAdd(int* p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
using std::max;
using std::min;
