// What the mmvq kernels share (kernels/mmvq.cu, kernels/mmvq_persist.cu): the act layout, the min-term mma, and
// the per-superblock product of the cp.async-pipelined kernels with its column packing.
#pragma once
#include "common.cuh"
#include "quants.cuh"
#include "stage.cuh"

#define MMVQ_MAX_WARPS 8
#define MMVQ_NCOLS 8
// Independent mma accumulators per superblock (mmvq_cp_compute): one chain makes each mma wait for the last.
#ifndef MMVQ_CHAINS
#define MMVQ_CHAINS 1
#endif

// Activation layout ("act"): tokens in groups of 8; per group, superblock sb and step s, the 8 tokens' 16 values
// at the canonical positions (quants.cuh) of that step: act[((sb * 16 + s) * 8 + n) * 16 + 4c + r] holds x[n][k],
// k = 256 sb + 64c + 32 (s & 1) + 4 (s >> 1) + r. Positions past K hold zeros. One step's fragment of all 8 tokens
// is 256 contiguous bytes. Sums: sums[(sb * 8 + n) * 8 + j] = sum of x[n][256 sb + 32 j .. + 31] (f16).
__device__ __forceinline__ i64 act_index(int sb, int s, int n) { return ((i64)(sb * SB_STEPS + s) * 8 + n) * 16; }

// The min term of Q4_K/Q5_K: sum over sub-blocks of m * (sum of x over the sub-block), k-slots 2c, 2c+1 only.
__device__ __forceinline__ void min_mma(float (&cm)[4], u32 m0, u32 m1, u32 sums_pair) {
    u32 bm[2] = {sums_pair, 0u};
    u32 am[4] = {m0, m1, 0u, 0u};
    mma_f16_16816(cm, am, bm);
}

// ---- the pipelined kernels' product (K-quants, weights staged through shared memory) ----
//
// Columns: for T <= 4 the mma's 8 columns carry each token twice: column n the f16 activations and the hi
// sub-block sums, column T + n the activations' rounding residue (precise mode; zeros otherwise) and the lo
// sums; the epilogue adds the two columns. So precise mode and the exact min term cost no second mma at T <= 4.
// For T > 4, TWO runs the residue as a second mma per step (precise), and the lo sums get a second min mma.

// One superblock: b from column source a (null: a zero column), bl from a2 (TWO only).
template <int QT, bool TWO>
__device__ __forceinline__ void mmvq_cp_compute(const typename QTraits<QT>::Row (&r)[2], const f16* a, const f16* a2,
                                                u32 sum1, u32 sum2, bool two_sums, int c, float (&acc)[4]) {
    using Q = QTraits<QT>;
    static_assert(Q::BLOCK_SCALE, "the pipelined mmvq is for the K-quants (a per-superblock scale d)");
    u32 b[SB_STEPS][2], bl[TWO ? SB_STEPS : 1][2];
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        const uint2 v = a ? ld_cached_u2(a + 128 * s) : make_uint2(0u, 0u);
        b[s][0] = v.x;
        b[s][1] = v.y;
        if constexpr (TWO) {
            const uint2 vl = a2 ? ld_cached_u2(a2 + 128 * s) : make_uint2(0u, 0u);
            bl[s][0] = vl.x;
            bl[s][1] = vl.y;
        }
    }
    typename Q::Consts k[2];
    Q::prepare(r[0], c, k[0]);
    Q::prepare(r[1], c, k[1]);
    float chain[MMVQ_CHAINS][4] = {};
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        u32 f[4];
        Q::frag(r[0], k[0], c, s, f[0], f[2]);
        Q::frag(r[1], k[1], c, s, f[1], f[3]);
        mma_f16_16816(chain[s % MMVQ_CHAINS], f, b[s]);
        if constexpr (TWO) mma_f16_16816(chain[s % MMVQ_CHAINS], f, bl[s]);
    }
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < MMVQ_CHAINS; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) blk[e] += chain[j][e];
    const float d0 = Q::dscale(r[0]), d1 = Q::dscale(r[1]);
    acc[0] += d0 * blk[0];
    acc[1] += d0 * blk[1];
    acc[2] += d1 * blk[2];
    acc[3] += d1 * blk[3];
    if constexpr (Q::HAS_MIN) {
        float cm[4] = {0.f, 0.f, 0.f, 0.f};
        min_mma(cm, k[0].mins, k[1].mins, sum1);
        if (two_sums) min_mma(cm, k[0].mins, k[1].mins, sum2);
        const float m0 = Q::mscale(r[0]), m1 = Q::mscale(r[1]);
        acc[0] -= m0 * cm[0];
        acc[1] -= m0 * cm[1];
        acc[2] -= m1 * cm[2];
        acc[3] -= m1 * cm[3];
    }
}

// The B column of lane (g, c): token g (hi), or when packed token g - T's residue (lo). The pointers are those
// of superblock 0; null means a zero column (or no second sum).
struct CpColumns {
    const f16* a;   // the first mma's column
    const f16* a2;  // the second mma's column (TWO: the residue of token g)
    const u32* s1;  // the sub-block sums of the min term (hi, or lo where the lane carries the residue)
    const u32* s2;  // the lo sums as a second min mma (unpacked only)
    bool packed;    // columns T + n fold into n in the epilogue
};

template <bool LO, bool TWO>
__device__ __forceinline__ CpColumns cp_columns(const f16* act, const f16* sums, const f16* act_lo,
                                                const f16* sums_lo, int T, int g, int c) {
    CpColumns k;
    k.packed = !TWO && T <= 4;
    const bool hi = g < T, lo = k.packed && !hi && g < 2 * T;
    const int tok = hi ? g : g - T;
    k.a = hi ? act + tok * 16 + 4 * c : (LO && lo) ? act_lo + tok * 16 + 4 * c : nullptr;
    k.a2 = (TWO && hi) ? act_lo + tok * 16 + 4 * c : nullptr;
    k.s1 = hi ? reinterpret_cast<const u32*>(sums + tok * 8 + 2 * c)
         : lo ? reinterpret_cast<const u32*>(sums_lo + tok * 8 + 2 * c) : nullptr;
    k.s2 = (!k.packed && hi) ? reinterpret_cast<const u32*>(sums_lo + tok * 8 + 2 * c) : nullptr;
    return k;
}

// Superblock sb of the lane's two rows r (already read from a stage) into acc.
template <int QT, bool TWO>
__device__ __forceinline__ void cp_superblock(const CpColumns& k, const typename QTraits<QT>::Row (&r)[2], int sb,
                                              int c, float (&acc)[4]) {
    u32 sum1 = 0u, sum2 = 0u;
    if (QTraits<QT>::HAS_MIN) {
        sum1 = k.s1 ? __ldg(k.s1 + 32 * sb) : 0u;
        sum2 = k.s2 ? __ldg(k.s2 + 32 * sb) : 0u;
    }
    mmvq_cp_compute<QT, TWO>(r, k.a ? k.a + 2048 * sb : nullptr, k.a2 ? k.a2 + 2048 * sb : nullptr, sum1, sum2,
                             !k.packed, c, acc);
}
