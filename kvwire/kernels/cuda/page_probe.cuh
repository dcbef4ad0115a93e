// The memory-path timing probe of the decode kernel (PROBE_LOADS=1): consume_page stands in for
// attend_page. Part of paged_decode_split.cu (its macros, PageRegs and SoftmaxState), included there
// only when PROBE_LOADS is set.
#pragma once

// A timing probe, not attention (a variant of scripts/gpu/cuda_decode.sh's sweep): every word of the page is
// folded into one accumulator, so the warp waits for all of its loads and does almost nothing
// else. What it measures is the page loop's memory path alone; its output is meaningless.
__device__ __forceinline__ void consume_page(const PageRegs& r, SoftmaxState& st) {
    u32 x = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < KWORDS; ++j) x ^= r.k[i][j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < VWORDS; ++j) x ^= r.v[i][j];
#if KELEM == 2
    x ^= r.kbs[0] ^ r.kbs[1];
#endif
#if VELEM == 2
    x ^= r.vbs[0] ^ r.vbs[1] ^ r.vbs[2] ^ r.vbs[3];
#endif
    float f = 0.f;
#if TOKSHFL
    f = r.sc;
#elif (KELEM == 1 && (KGRAN == 1 || KGRAN == 2)) || KELEM == 2
    f = r.ks[0] + r.ks[1] + r.vs[0] + r.vs[1];
#endif
    st.acc[0][0] += (float)(x & 1u) + f;
}
