// Probe builds of mmvq_cp for bench/gpu_stream.py, never used by the engine: each keeps the copies, the stage ring
// and the grid of the real kernel and drops part of the arithmetic, so that the stream probe can say which part
// costs the bandwidth. Selected by one define:
//   OPENJET_PROBE_LOADS_ONLY  neither decoding nor mma (kernels/mmvq.cu does this one inline)
//   OPENJET_PROBE_DECODE_ONLY the stage reads and every fragment decoded (prepare + frag), no activations, no mma
//   OPENJET_PROBE_MMA_ONLY    the stage reads, the activations and the mma chain, the raw quant words as fragments
//   OPENJET_PROBE_ACT_ONLY    the stage reads and the activation loads, neither decoding nor mma
//   OPENJET_PROBE_ACT_HOT     as ACT_ONLY, every unit reading superblock 0's activations (always in L1)
//   OPENJET_PROBE_MMA_NOACT   the stage reads and the mma chain on constant activations (no activation loads)
//   OPENJET_PROBE_MMA_SPLIT   as MMA_ONLY with the chain cut into four independent accumulators
// Each folds what it computed into acc[0] so that nothing is optimised away; the results are meaningless.
#pragma once
#include "mmvq.cuh"

template <int QT>
__device__ __forceinline__ void probe_decode_only(const typename QTraits<QT>::Row (&r)[2], int c, float (&acc)[4]) {
    using Q = QTraits<QT>;
    typename Q::Consts k[2];
    Q::prepare(r[0], c, k[0]);
    Q::prepare(r[1], c, k[1]);
    u32 fold = 0u;
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        u32 f[4];
        Q::frag(r[0], k[0], c, s, f[0], f[2]);
        Q::frag(r[1], k[1], c, s, f[1], f[3]);
        fold ^= f[0] ^ f[1] ^ f[2] ^ f[3];
    }
    acc[0] += __int_as_float(fold & 0x007FFFFFu);
}

template <int QT>
__device__ __forceinline__ void probe_act_only(const CpColumns& cols, const typename QTraits<QT>::Row (&r)[2], int sb,
                                               float (&acc)[4]) {
#ifdef OPENJET_PROBE_ACT_HOT
    sb = 0;
#endif
    const f16* a = cols.a ? cols.a + 2048 * sb : nullptr;
    u32 fold = reinterpret_cast<const u32*>(&r[0].q[0])[0] ^ reinterpret_cast<const u32*>(&r[1].q[0])[0];
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        const uint2 v = a ? ld_cached_u2(a + 128 * s) : make_uint2(0u, 0u);
        fold ^= v.x ^ v.y;
    }
    acc[0] += __int_as_float(fold & 0x007FFFFFu);
}

// The mma chain on the raw quant words (MMA_ONLY); NOACT: b is a constant; SPLIT: four accumulators, so four
// mmas are in flight instead of one.
template <int QT, bool NOACT, bool SPLIT>
__device__ __forceinline__ void probe_mma_chain(const CpColumns& cols, const typename QTraits<QT>::Row (&r)[2], int sb,
                                                float (&acc)[4]) {
    const f16* a = cols.a ? cols.a + 2048 * sb : nullptr;
    const u32* q0 = reinterpret_cast<const u32*>(&r[0].q[0]);
    const u32* q1 = reinterpret_cast<const u32*>(&r[1].q[0]);
    float part[4][4] = {};
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        const uint2 v = NOACT ? make_uint2(0x3C003C00u, 0x3C003C00u) : a ? ld_cached_u2(a + 128 * s) : make_uint2(0u, 0u);
        u32 b[2] = {v.x, v.y};
        u32 f[4] = {q0[s & 7], q1[s & 7], q0[(s + 1) & 7], q1[(s + 1) & 7]};
        mma_f16_16816(SPLIT ? part[s & 3] : acc, f, b);
    }
    if constexpr (SPLIT) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += (part[0][j] + part[1][j]) + (part[2][j] + part[3][j]);
    }
}
