// The flash-decoding merge fused into the split kernel (FUSED=1): the last block to finish a
// (sequence, KV head) attends the bf16 tail page and merges every split's partial into the output
// rows of the KV head's query heads. A decode step is then one launch instead of two (the Triton
// reduce kernel of paged_decode.py is the FUSED=0 path). Why: at 1x32k the whole step is ~25 us
// and the second launch, with its own round trips to L2, is a sizeable share of it.
//
// Completion is counted per (sequence, KV head) in ``counters`` (zero before the launch). Every
// thread fences its partial stores before the block counts itself done; the block that brings the
// count to ``num_splits`` reads the partials through L2 (ld.global.cg: its L1 never held them) and
// sets the counter back to zero, so the buffer is ready for the next launch on the stream.
// Part of paged_decode_split.cu: uses its macros (G, D, P, NW, NT, QF32).
#pragma once

#include "fragment_ops.cuh"

__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ u32 atomic_add_gpu(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ float ldcg(const float* p) {
    float r;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(r) : "l"(p) : "memory");
    return r;
}
__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float q_elem(const void* q, i64 off) {
#if QF32
    return ((const float*)q)[off];
#else
    return bf16_to_f32(((const u16*)q)[off]);
#endif
}

// blockIdx.y, read afresh (volatile: the compiler must not keep the kernel's copy live for it).
__device__ __forceinline__ int block_row() {
    int r;
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(r));
    return r;
}

// Whether this block is the last of its row to finish (call with every thread of the block).
__device__ __forceinline__ bool last_block_of_row(u32* counter, int num_splits) {
    __shared__ int sm_last;
    fence_gpu();
    block_sync();
    if (threadIdx.x == 0) sm_last = atomic_add_gpu(counter, 1u) == (u32)(num_splits - 1);
    block_sync();
    if (sm_last) fence_gpu();
    return sm_last != 0;
}

// Tail + every split -> the G output rows. Pointers/offsets in elements:
//   q + q_row + hd * sq_h          query head h*G + hd;  tail_k / tail_v + j * st_p   tail token j
//   part_* rows prow0 + s * G + hd  (split s, head hd);   out + out_row + hd * so_h      output row
// ``scratch`` holds G * num_splits floats of shared memory (the split weights).
__device__ void merge_splits_and_tail(float* scratch, const void* q, i64 q_row, i64 sq_h,
                                      const u16* tail_k, const u16* tail_v, i64 st_p, int tail_len,
                                      const float* part_acc, const float* part_m, const float* part_l,
                                      i64 prow0, int num_splits, float qk_scale,
                                      void* out, i64 out_row, i64 so_h, u32* counter) {
    __shared__ float sm_tp[8][P];        // tail scores, then tail probabilities
    __shared__ float sm_l[8];            // softmax sum of each head over the tail and all splits
    const int S = num_splits;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int idx = threadIdx.x; idx < G * P; idx += NT) {          // tail scores, log2 units
        const int hd = idx / P, j = idx % P;
        float sc = -1.0e30f;
        if (j < tail_len) {
            const i64 qo = q_row + hd * sq_h;
            const u16* kr = tail_k + j * st_p;
            float a = 0.f;
#pragma unroll 16
            for (int d = 0; d < D; ++d) a += q_elem(q, qo + d) * bf16_to_f32(kr[d]);
            sc = a * qk_scale;
        }
        sm_tp[hd][j] = sc;
    }
    block_sync();
    for (int hd = warp; hd < G; hd += NW) {          // one warp per head: max, weights, sum
        const float st = lane < P ? sm_tp[hd][lane] : -1.0e30f;
        float m = st;
        for (int s = lane; s < S; s += 32) m = fmx(m, ldcg(part_m + prow0 + (i64)s * G + hd));
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) m = fmx(m, shfl_xor(m, x));
        float l = 0.f;
        if (lane < P) {
            l = lane < tail_len ? ex2(st - m) : 0.f;
            sm_tp[hd][lane] = l;
        }
        for (int s = lane; s < S; s += 32) {
            const i64 r = prow0 + (i64)s * G + hd;
            const float w = ex2(ldcg(part_m + r) - m);
            scratch[hd * S + s] = w;
            l += w * ldcg(part_l + r);
        }
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) l += shfl_xor(l, x);
        if (lane == 0) sm_l[hd] = l;
    }
    block_sync();
    for (int idx = threadIdx.x; idx < G * D; idx += NT) {         // one thread per (head, d)
        const int hd = idx / D, d = idx % D;
        float a = 0.f;
        for (int j = 0; j < tail_len; ++j) a += sm_tp[hd][j] * bf16_to_f32(tail_v[j * st_p + d]);
        const float* w = scratch + hd * S;
        const float* pa = part_acc + (prow0 + hd) * D + d;
#pragma unroll 8
        for (int s = 0; s < S; ++s) a += w[s] * ldcg(pa + (i64)s * G * D);
        const float o = a / sm_l[hd];
        const i64 oo = out_row + hd * so_h + d;
#if QF32
        ((float*)out)[oo] = o;
#else
        ((u16*)out)[oo] = f32_to_bf16(o);
#endif
    }
    if (threadIdx.x == 0) *counter = 0u;
}
