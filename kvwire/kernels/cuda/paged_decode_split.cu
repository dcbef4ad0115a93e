// Split-KV paged decode over FP8 / NVFP4 pages on mma.sync tensor cores (sm_80+; tuned on sm_90).
//
// Compiled at run time by NVRTC (kvwire/kernels/nvrtc.py) with these macros:
//   H, G (<= 8), D (64 or 128), NW (warps per block), KELEM, VELEM (1 fp8, 2 nvfp4),
//   KGRAN, VGRAN (0 none, 1 token, 2 page, 3 static: tensor/head; fp8 only), QF32 (q is fp32, else bf16),
//   PT (tokens per stored page: 16, or 32 / 64 read as 16-token tiles that a block's warps share);
//   tuning: DEPTH, MINB, PREF (paged_decode_cuda.py says what they are), LAZYMAX (0: exact running
//   max), EVENCOLS (default G <= 4: query heads in the score MMA's even columns, one softmax column
//   per lane), KLINES (FP8 keys at D = 128 with EVENCOLS loaded as whole 128-byte lines:
//   decode_page_regs.cuh), QSMEM (q's fragments in shared memory instead of registers), SCALESHFL (fp8-token
//   scales by one load and shuffles, decode_page_regs.cuh), STAGES (0: pages loaded straight into
//   registers; n > 0: through an n-slot shared-memory ring per warp filled by the bulk-copy
//   engine, page_staging.cuh; sm_90+), WHOLEPAGE (0: a block is NW warps of one KV head, each warp
//   every NW-th page of the split; 1: a block is NW consecutive KV heads, one warp each, and every
//   warp walks all the split's pages, so the block reads each page's sections as contiguous runs
//   and no warp's partial needs merging with another's), REFILL_LAG (WHOLEPAGE with STAGES: how
//   many pages behind the block ring's producer lets the slowest warp be), PROBE_LOADS (a timing
//   probe of the memory path alone), PROBE_NOCVT (a timing probe: NVFP4 keys (1), values (2) or
//   both (3) reach their MMAs as placed E4M3 words, with no f16 conversion or block-scale multiply;
//   4: keys converted but not scaled; it bounds what any cheaper conversion could gain, and its
//   output is meaningless).
// It writes the same partial results (m, l, acc per split and query head, log2 units) as the
// Triton split kernel, so the Triton reduce kernel attends the bf16 tail and merges the splits.
//
// Layout of the work (why it is fast): a warp owns one page (16 tokens = the MMA's M) at a time
// and reads it straight from global memory into registers, already in tensor-core fragment order:
//   S^T[tok, head]  = K[tok, d] . q^T[d, head]     A = K (16 tok x 16 d), B = q^T (16 d x 8 heads)
//   O^T[d, head]   += V^T[d, tok] . P^T[tok, head] A = V^T (16 d x 16 tok), B = P^T
// so the GQA group sits on the MMA's N side (8 columns, no 16-row padding of the query), and the
// only per-element work is the hardware E4M3x2 -> f16x2 conversion (plus the E2M1 -> E4M3 bit
// placement and the block-scale multiply for NVFP4). The reduction dimensions (d for S, tokens
// for O) are visited in a permuted order, matched in q and in P, so every lane's loads are
// contiguous 16- or 8-byte vectors; the output rows (d) are permuted too and unpermuted on store.
//
// Fragment conventions of mma.m16n8k16 (lane = 4 * gi + ci):
//   A: a0,a1 (row gi, k 2ci..+1) a2,a3 (row gi+8, same k) a4,a5 (row gi, k 2ci+8..) a6,a7 (row gi+8)
//   B: b0,b1 (k 2ci..+1, col gi)  b2,b3 (k 2ci+8.., col gi)
//   C: c0,c1 (row gi, cols 2ci..+1) c2,c3 (row gi+8, same cols)
// K (fp8):   lane reads row gi and gi+8, bytes [64j + 16ci, +16) for j < D/64; k-step 4j+u uses
//            word u: its low half -> a0a1 / a2a3, its high half -> a4a5 / a6a7. With KLINES
//            (D = 128) lane l reads bytes [16l, +16) of each 512-byte quarter instead: two score
//            tiles of 4 k-steps, whose even rows hold d < 64 and odd rows d >= 64 (page_attention.cuh).
// K (nvfp4): lane reads bytes [ci * D/8, +D/8) of rows gi, gi+8 (D/4 elements); word w gives
//            E4M3 words L (even d) and H (odd d); k-step 2w+t: a0a1 = L half t, a4a5 = H half t.
// V:         lane reads tokens ci, ci+4, ci+8, ci+12 at d in [gi * D/8, +D/8); token order for
//            the P.V reduction is pi(2c)=c, pi(2c+1)=c+8, pi(2c+8)=c+4, pi(2c+9)=c+12, and output
//            row gi (gi+8) of m-tile i is d = gi * D/8 + 2i (+1).
#ifndef DEPTH
#define DEPTH 2
#endif
#ifndef PREF
#define PREF 0
#endif
#ifndef MINB
#define MINB 1
#endif
#ifndef LAZYMAX
#define LAZYMAX 5
#endif
#ifndef QSMEM
#define QSMEM 0
#endif
#ifndef EVENCOLS
#define EVENCOLS (G <= 4)
#endif
#if EVENCOLS && G > 4
#error "EVENCOLS puts the G query heads in the score MMA's 4 even columns: G must be at most 4"
#endif
#define NT (NW * 32)
#define P 16
#define VB (D / 8)

#ifndef STAGES
#define STAGES 0
#endif
#ifndef PROBE_LOADS
#define PROBE_LOADS 0
#endif
#ifndef WHOLEPAGE
#define WHOLEPAGE 0
#endif
#ifndef PROBE_NOCVT
#define PROBE_NOCVT 0
#endif
#ifndef REFILL_LAG
#define REFILL_LAG 1
#endif
#if WHOLEPAGE && H % NW != 0
#error "WHOLEPAGE blocks hold NW of the H KV heads: NW must divide H"
#endif
#if WHOLEPAGE && STAGES && (REFILL_LAG < 1 || REFILL_LAG >= STAGES)
#error "REFILL_LAG must be at least 1 and less than STAGES"
#endif
#ifndef PT
#define PT P                           // tokens per stored page: P, or 2P / 4P read as P-token tiles
#endif
#define SUBT (PT / P)                  // tiles per page; warp w takes tile w % SUBT of every NW/SUBT-th page
#if PT % P != 0 || NW % SUBT != 0
#error "PT must be a multiple of 16 whose tiles (PT / 16) divide NW"
#endif
#if SUBT > 1 && (STAGES || WHOLEPAGE || PREF)
#error "pages of more than 16 tokens are read on the register path only (STAGES = WHOLEPAGE = PREF = 0)"
#endif
#define HPB (WHOLEPAGE ? NW : 1)       // KV heads per block (and per staged slot)
#define PSTRIDE (WHOLEPAGE ? 1 : NW / SUBT)   // pages between one warp's consecutive pages

#include "decode_page_regs.cuh"      // fragment_ops.cuh, ptx_common.cuh through it
#if STAGES
#include "page_staging.cuh"
#endif
__device__ constexpr int imax_c(int a, int b) { return a > b ? a : b; }

#include "q_operand.cuh"            // QOperand, fill_q
#include "page_attention.cuh"        // SoftmaxState, attend_page

#if PROBE_LOADS
#include "page_probe.cuh"            // consume_page: the memory path alone
#define ATTEND(cur) consume_page(cur, st)
#else
#define ATTEND(cur) attend_page(cur, qop, cscale, gi, ci, st)
#endif

extern "C" __global__ void __launch_bounds__(NT, MINB) kvwire_decode_split(
    const void* __restrict__ q_ptr, i64 sq_b, i64 sq_h,
    const u8* __restrict__ storage, i64 page_bytes,
    const int* __restrict__ page_table, i64 spt_b, const int* __restrict__ num_pages,
    const float* __restrict__ statics, int layer,
    float* __restrict__ part_acc, float* __restrict__ part_m, float* __restrict__ part_l,
    int num_splits, float qk_scale,
    i64 k_data, i64 k_s, i64 k_bs, i64 k_gs, i64 v_data, i64 v_s, i64 v_bs, i64 v_gs) {
    __shared__ float sm_m[NW][8];
    __shared__ float sm_l[NW][8];
#if STAGES
    // The page rings (one per warp, or WHOLEPAGE: one per block); after the page loop the same
    // bytes hold the warps' partials. Barriers: per warp ring a "full" one per slot; for the
    // block ring a "full" and an "empty" (all warps done reading) one per slot.
    __shared__ __align__(128) u8 sm_pool[imax_c(NW / HPB * STAGES * SLOT_BYTES, NW * 8 * (D + 1) * 4)];
    __shared__ __align__(8) unsigned long long sm_bar[WHOLEPAGE ? 2 : NW][STAGES];
#define SM_ACC(w, j, d) ((float*)sm_pool)[((w) * 8 + (j)) * (D + 1) + (d)]
#else
    __shared__ __align__(16) float sm_acc[NW][8][D + 1];     // aligned: lets ptxas store the partials in wider pieces
#define SM_ACC(w, j, d) sm_acc[w][j][d]
#endif
#define SM_M(w, j) sm_m[w][j]
#define SM_L(w, j) sm_l[w][j]

#if WHOLEPAGE
    const int pid_s = blockIdx.x;                 // grid (splits, B * H / NW), one warp per KV head
    const int b = blockIdx.y / (H / NW);
    const int h = (blockIdx.y % (H / NW)) * NW + (threadIdx.x >> 5);
    const int pid_bh = b * H + h;
#else
    const int pid_s = blockIdx.x;                 // grid (splits, B * H)
    const int pid_bh = blockIdx.y;
    const int b = pid_bh / H;
    const int h = pid_bh % H;
#endif
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int gi = lane >> 2;
    const int ci = lane & 3;

    // The Triton reduce kernel may launch now (paged_decode_cuda.DEPENDENT_LAUNCH); it waits for
    // this grid's completion (griddepcontrol.wait) before it reads the partials.
    launch_dependents();
    const int n = num_pages[b];
    const int pps = (n + num_splits - 1) / num_splits;
    const int p0 = imin(pid_s * pps, n);
    const int p1 = imin(p0 + pps, n);

    // q as the B operand (column gi = query head h*G + gi; zero beyond G), in the K visiting order
    float cscale = qk_scale;
#if KGRAN == 3
    cscale *= statics[(layer * 2 + 0) * H + h];
#endif
#if KELEM == 2
    cscale *= 64.0f;                                    // E2M1 placed as E4M3 is value * 2^-6
#endif
    QOperand qop;
    u32* smq = nullptr;
#if QSMEM
    // One copy per KV head of the block (aligned: read by 8-byte ld.shared.v2).
    __shared__ __align__(16) u32 sm_q[HPB][KSTEPS][32][2];
    const int qh = WHOLEPAGE ? warp : 0;
    qop.base = smem_addr(&sm_q[qh][0][lane][0]);
    smq = &sm_q[qh][0][lane][0];
#endif
    {
        // column gi's query head (EVENCOLS: even columns only; KLINES: odd columns too, d >= 64)
        const int qhead = EVENCOLS ? gi >> 1 : gi;
        const bool real = KLINES ? qhead < G : (EVENCOLS ? (gi & 1) == 0 && qhead < G : gi < G);
        const i64 qoff = (i64)b * sq_b + (i64)(h * G + qhead) * sq_h + (KLINES ? 64 * (gi & 1) : 0);
#if QF32
        fill_q(qop, smq, WHOLEPAGE || warp == 0, (const float*)q_ptr + qoff, real, ci);
#else
        fill_q(qop, smq, WHOLEPAGE || warp == 0, (const u16*)q_ptr + qoff, real, ci);
#endif
    }

#if QSMEM
    block_sync();
#endif
    SoftmaxState st;
    st.m0 = st.m1 = -1.0e30f;
    st.l0 = st.l1 = 0.f;
    st.vinv = 0.f;
#pragma unroll
    for (int i = 0; i < MTILES; ++i) st.acc[i][0] = st.acc[i][1] = st.acc[i][2] = st.acc[i][3] = 0.f;
    const int* pt = page_table + (i64)b * spt_b;
    const int first = p0 + (WHOLEPAGE ? 0 : warp / SUBT);
#if STAGES && WHOLEPAGE
    // ---- pages through the block's shared-memory ring (page_staging.cuh) ----
    // Thread 0 fills the slots. Each warp releases a slot (its "empty" barrier) once it has
    // attended the page; at the start of page j thread 0 refills the slot of page j - REFILL_LAG
    // with page j - REFILL_LAG + STAGES, so a warp may trail warp 0 by REFILL_LAG - 1 pages
    // before warp 0 waits for it, and a page is requested STAGES - REFILL_LAG pages ahead.
    const u32 ring = smem_addr(sm_pool);
    const u32 full = smem_addr(&sm_bar[0][0]), empty = smem_addr(&sm_bar[1][0]);
    const bool producer = threadIdx.x == 0;
    if (producer) {
#pragma unroll
        for (int k = 0; k < STAGES; ++k) { mbar_init(full + 8 * k); mbar_init(empty + 8 * k, NW); }
        mbar_init_fence();
    }
    block_sync();
    const StageSources src = stage_sources(h - warp, k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs);
    const LaneOffsets off = staged_lane_offsets(h, warp, src.chunk, gi, ci);
    if (producer) {
#pragma unroll
        for (int k = 0; k < STAGES; ++k) {
            if (first + k < p1) stage_page(ring + k * SLOT_BYTES, full + 8 * k, page_at(storage, pt[first + k], page_bytes), src);
        }
    }
    int id_next = producer && first + STAGES < p1 ? pt[first + STAGES] : 0;
    u32 slot = 0, parity = 0;                 // the slot and phase of page pg
    u32 rslot = 0, rparity = 0;               // ... of page pg - REFILL_LAG, once that is >= first
    for (int pg = first; pg < p1; ++pg) {
        const int nx = pg - REFILL_LAG + STAGES;
        if (pg - REFILL_LAG >= first) {
            if (producer && nx < p1) {
                mbar_wait(empty + 8 * rslot, rparity);
                stage_page(ring + rslot * SLOT_BYTES, full + 8 * rslot, page_at(storage, id_next, page_bytes), src);
                id_next = nx + 1 < p1 ? pt[nx + 1] : 0;
            }
            if (++rslot == STAGES) { rslot = 0; rparity ^= 1u; }
        }
        mbar_wait(full + 8 * slot, parity);
        PageRegs cur;
        load_page<FromShared>(cur, ring + slot * SLOT_BYTES, off);
        ATTEND(cur);
        warp_sync();                     // every lane has read the slot before the warp releases it
        if (lane == 0) mbar_arrive(empty + 8 * slot);
        if (++slot == STAGES) { slot = 0; parity ^= 1u; }
    }
    block_sync();                        // the partials below reuse the ring's bytes
#elif STAGES
    // ---- pages through this warp's shared-memory ring (page_staging.cuh) ----
    const u32 ring = smem_addr(sm_pool) + warp * (STAGES * SLOT_BYTES);
    const u32 bars = smem_addr(&sm_bar[warp][0]);
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < STAGES; ++k) mbar_init(bars + 8 * k);
        mbar_init_fence();
    }
    warp_sync();
    const StageSources src = stage_sources(h, k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs);
    const LaneOffsets off = staged_lane_offsets(h, 0, src.chunk, gi, ci);
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < STAGES; ++k) {
            const int pg = first + k * NW;
            if (pg < p1) stage_page(ring + k * SLOT_BYTES, bars + 8 * k, page_at(storage, pt[pg], page_bytes), src);
        }
    }
    // The id of the page requested next is read one page ahead (its L2 round trip off the issue path).
    int id_next = first + STAGES * NW < p1 ? pt[first + STAGES * NW] : 0;
    u32 slot = 0, parity = 0;
    for (int pg = first; pg < p1; pg += NW) {
        mbar_wait(bars + 8 * slot, parity);
        PageRegs cur;
        load_page<FromShared>(cur, ring + slot * SLOT_BYTES, off);
        ATTEND(cur);
        warp_sync();                     // every lane has read the slot before it is refilled
        const int nx = pg + STAGES * NW;
        if (nx < p1 && lane == 0) stage_page(ring + slot * SLOT_BYTES, bars + 8 * slot, page_at(storage, id_next, page_bytes), src);
        id_next = nx + NW < p1 ? pt[nx + NW] : 0;
        if (++slot == STAGES) { slot = 0; parity ^= 1u; }
    }
    block_sync();                        // the merge below reuses the rings' bytes
#else
    const LaneOffsets off = lane_offsets(h, warp % SUBT, gi, ci, k_data, k_s, k_bs, k_gs, v_data, v_s, v_bs, v_gs);
    // Page ids are read one step before they are needed (a load whose address waits on an id
    // would stall the warp for a whole L2 round trip on every page); PREF > 0 also asks L2 for
    // the page PREF steps beyond the register ring (one 128-byte line per lane).
    const int pf_line = prefetch_line(h, lane, k_data, k_s, k_bs, v_data, v_s, v_bs);
    PageRegs ring[DEPTH];            // DEPTH - 1 pages in flight while one is attended (unrolled: no copies)
#pragma unroll
    for (int k = 0; k < DEPTH - 1; ++k) {
        const int pg = first + k * PSTRIDE;
        if (pg < p1) load_page<FromGlobal>(ring[k], page_at(storage, pt[pg], page_bytes), off);
    }
    int id_ring = first + (DEPTH - 1) * PSTRIDE < p1 ? pt[first + (DEPTH - 1) * PSTRIDE] : 0;
    // The id read after id_ring, through a pointer that moves with the walk (indexing pt instead
    // made ptxas redo the row's 64-bit address on every page: 6 instructions of the NVFP4 loop).
    const int* id_next = pt + first + DEPTH * PSTRIDE;
#if PREF > 0
#pragma unroll
    for (int k = 0; k < PREF; ++k) {
        const int pg = first + (DEPTH - 1 + k) * PSTRIDE;
        if (pg < p1 && pf_line >= 0) prefetch_l2(page_at(storage, pt[pg], page_bytes) + pf_line);
    }
    int id_pref = first + (DEPTH - 1 + PREF) * PSTRIDE < p1 ? pt[first + (DEPTH - 1 + PREF) * PSTRIDE] : 0;
#endif
    for (int base = first; base < p1; base += DEPTH * PSTRIDE) {
#pragma unroll
        for (int k = 0; k < DEPTH; ++k) {
            const int pg = base + k * PSTRIDE;
            if (pg < p1) {
                const int pf = pg + (DEPTH - 1) * PSTRIDE;
                if (pf < p1) load_page<FromGlobal>(ring[(k + DEPTH - 1) % DEPTH], page_at(storage, id_ring, page_bytes), off);
                id_ring = pf + PSTRIDE < p1 ? *id_next : 0;
                id_next += PSTRIDE;
#if PREF > 0
                const int pp = pf + PREF * PSTRIDE;
                if (pp < p1 && pf_line >= 0) prefetch_l2(page_at(storage, id_pref, page_bytes) + pf_line);
                id_pref = pp + PSTRIDE < p1 ? pt[pp + PSTRIDE] : 0;
#endif
                ATTEND(ring[k]);
            }
        }
    }
#endif

    // ---- this warp's partial: sums over lanes, value scales, then the block's merge ----
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) { st.l0 += shfl_xor(st.l0, x); st.l1 += shfl_xor(st.l1, x); }
    float vfac = 1.0f;
#if VGRAN == 3
    vfac *= statics[(layer * 2 + 1) * H + h];
#endif
#if VGRAN == 1 || VGRAN == 2 || VELEM == 2
    vfac *= st.vinv > 0.f ? 1.0f / st.vinv : 0.f;
#endif
#if VELEM == 2
    vfac *= 64.0f;
#endif
    if (gi == 0) {
#if EVENCOLS
        SM_M(warp, ci) = st.m0;                         // this lane's softmax column holds head ci
        SM_L(warp, ci) = st.l0;
#else
        SM_M(warp, 2 * ci) = st.m0; SM_M(warp, 2 * ci + 1) = st.m1;
        SM_L(warp, 2 * ci) = st.l0; SM_L(warp, 2 * ci + 1) = st.l1;
#endif
    }
#pragma unroll
    for (int i = 0; i < MTILES; ++i) {
        const int dg = gi * VB + 2 * i;                 // row gi of m-tile i; row gi+8 is dg + 1
        SM_ACC(warp, 2 * ci, dg) = st.acc[i][0] * vfac;
        SM_ACC(warp, 2 * ci + 1, dg) = st.acc[i][1] * vfac;
        SM_ACC(warp, 2 * ci, dg + 1) = st.acc[i][2] * vfac;
        SM_ACC(warp, 2 * ci + 1, dg + 1) = st.acc[i][3] * vfac;
    }
#if WHOLEPAGE
    // Each warp's partial is its head's whole split: written out as it is (through shared
    // memory, for whole-row stores).
    warp_sync();
    const i64 prow = ((i64)pid_bh * num_splits + pid_s) * G;
    for (int idx = lane; idx < G * D; idx += 32) {
        const int hd = idx / D, d = idx % D;
        part_acc[(prow + hd) * D + d] = SM_ACC(warp, hd, d);
        if (d == 0) { part_m[prow + hd] = SM_M(warp, hd); part_l[prow + hd] = SM_L(warp, hd); }
    }
#else
    block_sync();
    const i64 prow = ((i64)pid_bh * num_splits + pid_s) * G;
    for (int idx = threadIdx.x; idx < G * D; idx += NT) {
        const int hd = idx / D, d = idx % D;
        float mx = -1.0e30f;
#pragma unroll
        for (int w = 0; w < NW; ++w) mx = fmx(mx, SM_M(w, hd));
        float a = 0.f, l = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float f = ex2(SM_M(w, hd) - mx);
            a += SM_ACC(w, hd, d) * f;
            l += SM_L(w, hd) * f;
        }
        part_acc[(prow + hd) * D + d] = a;
        if (d == 0) { part_m[prow + hd] = mx; part_l[prow + hd] = l; }
    }
#endif
}
