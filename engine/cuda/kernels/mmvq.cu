// Quantized matrix x small batch: y[T, rows] = x[T, K] @ W[rows, K]^T (+ bias) (+ residual), T = 1..8.
//
// Decode and verification are bound by streaming the weights from HBM once, so each weight block is decoded once
// and reused for every row of the batch: tensor cores (mma.m16n8k16, N = 8 = the largest T) multiply the
// decoded f16 block by all T activation rows at once, and T = 5 costs about what T = 1 does.
// A block of W warps owns 16 * MT output rows; its warps split K by superblocks and reduce through shared memory.
#include "common.cuh"
#include "quants.cuh"

#define MMVQ_MAX_WARPS 8
#define MMVQ_NCOLS 8

// Activation layout ("act"): tokens in groups of 8; per group, superblock sb and step s, the 8 tokens' 16 values
// at the canonical positions (quants.cuh) of that step: act[((sb * 16 + s) * 8 + n) * 16 + 4c + r] holds x[n][k],
// k = 256 sb + 64c + 32 (s & 1) + 4 (s >> 1) + r. Positions past K hold zeros. One step's fragment of all 8 tokens
// is 256 contiguous bytes. Sums: sums[(sb * 8 + n) * 8 + j] = sum of x[n][256 sb + 32 j .. + 31] (f16).
__device__ __forceinline__ i64 act_index(int sb, int s, int n) { return ((i64)(sb * SB_STEPS + s) * 8 + n) * 16; }

// One step's activation fragment of token g (zeros for absent tokens).
__device__ __forceinline__ void load_b(u32 (&b)[2], const f16* __restrict__ act, bool has_col, int sb, int s, int g,
                                       int c) {
    if (has_col) {
        const uint2 v = ld_cached_u2(act + act_index(sb, s, g) + 4 * c);
        b[0] = v.x;
        b[1] = v.y;
    } else {
        b[0] = b[1] = 0u;
    }
}

// The min term of Q4_K/Q5_K: sum over sub-blocks of m * (sum of x over the sub-block), k-slots 2c, 2c+1 only.
__device__ __forceinline__ void min_mma(float (&cm)[4], u32 m0, u32 m1, const f16* __restrict__ sums, bool has_col,
                                        int sb, int g, int c) {
    u32 bm[2] = {has_col ? __ldg(reinterpret_cast<const u32*>(sums + ((i64)sb * 8 + g) * 8 + 2 * c)) : 0u, 0u};
    u32 am[4] = {m0, m1, 0u, 0u};
    mma_f16_16816(cm, am, bm);
}

// One superblock of the lane's two rows. With act_lo (precise mode) the activations are x = hi + lo, both f16,
// and every product is taken twice: the result then carries f32-level activation precision.
template <int QT>
__device__ __forceinline__ void mmvq_compute(const typename QTraits<QT>::Row (&r)[2], const f16* __restrict__ act,
                                             const f16* __restrict__ act_lo, const f16* __restrict__ sums,
                                             const f16* __restrict__ sums_lo, bool has_col, int sb, int c, int g,
                                             float (&acc)[4]) {
    using Q = QTraits<QT>;
    u32 b[SB_STEPS][2];
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) load_b(b[s], act, has_col, sb, s, g, c);
    typename Q::Consts k[2];
    Q::prepare(r[0], c, k[0]);
    Q::prepare(r[1], c, k[1]);
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
    float* dst = Q::BLOCK_SCALE ? blk : acc;
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        u32 a[4];
        Q::frag(r[0], k[0], c, s, a[0], a[2]);
        Q::frag(r[1], k[1], c, s, a[1], a[3]);
        mma_f16_16816(dst, a, b[s]);
        if (act_lo) {
            u32 bl[2];
            load_b(bl, act_lo, has_col, sb, s, g, c);
            mma_f16_16816(dst, a, bl);
        }
    }
    if constexpr (Q::BLOCK_SCALE) {
        const float d0 = Q::dscale(r[0]), d1 = Q::dscale(r[1]);
        acc[0] += d0 * blk[0];
        acc[1] += d0 * blk[1];
        acc[2] += d1 * blk[2];
        acc[3] += d1 * blk[3];
    }
    if constexpr (Q::HAS_MIN) {
        float cm[4] = {0.f, 0.f, 0.f, 0.f};
        min_mma(cm, k[0].mins, k[1].mins, sums, has_col, sb, g, c);
        if (sums_lo) min_mma(cm, k[0].mins, k[1].mins, sums_lo, has_col, sb, g, c);
        const float m0 = Q::mscale(r[0]), m1 = Q::mscale(r[1]);
        acc[0] -= m0 * cm[0];
        acc[1] -= m0 * cm[1];
        acc[2] -= m1 * cm[2];
        acc[3] -= m1 * cm[3];
    }
}

template <int QT>
__device__ __forceinline__ void mmvq_load(typename QTraits<QT>::Row (&r)[2], const u8* __restrict__ w, i64 ntot,
                                          int nb, int row0, int rows, int sb, int c, int g) {
    // rows past the end repeat the last one (their results are never stored)
    QTraits<QT>::load(r[0], w, ntot, nb, min(row0 + g, rows - 1), sb, c);
    QTraits<QT>::load(r[1], w, ntot, nb, min(row0 + g + 8, rows - 1), sb, c);
}

// y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), T <= 8, x in the act layout. A block owns 16 output rows;
// its warps take superblocks sb = warp, warp + W, ... with the next superblock's weights loaded (double-buffered)
// while the current one is multiplied, then reduce through shared memory.
template <int QT>
__global__ void __launch_bounds__(MMVQ_MAX_WARPS * 32)
mmvq(const u8* __restrict__ w, const f16* __restrict__ act, const f16* __restrict__ sums, const f16* __restrict__ act_lo,
     const f16* __restrict__ sums_lo, float* __restrict__ y, const float* __restrict__ bias,
     const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    using Q = QTraits<QT>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int nb = Q::QK == 1 ? K : (K + Q::QK - 1) / Q::QK;
    const int nsb = (K + QK_SB - 1) / QK_SB;
    const i64 ntot = (i64)rows * nb;
    const bool has_col = g < T;

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    typename Q::Row ra[2], rb[2];
    int sb = warp;
    if (sb < nsb) mmvq_load<QT>(ra, w, ntot, nb, row0, rows, sb, c, g);
    while (sb < nsb) {  // unrolled by two so the buffers swap without copies
        if (sb + num_warps < nsb) mmvq_load<QT>(rb, w, ntot, nb, row0, rows, sb + num_warps, c, g);
        mmvq_compute<QT>(ra, act, act_lo, sums, sums_lo, has_col, sb, c, g, acc);
        sb += num_warps;
        if (sb >= nsb) break;
        if (sb + num_warps < nsb) mmvq_load<QT>(ra, w, ntot, nb, row0, rows, sb + num_warps, c, g);
        mmvq_compute<QT>(rb, act, act_lo, sums, sums_lo, has_col, sb, c, g, acc);
        sb += num_warps;
    }

    __shared__ float red[MMVQ_MAX_WARPS][16][MMVQ_NCOLS];
    red[warp][g][2 * c] = acc[0];
    red[warp][g][2 * c + 1] = acc[1];
    red[warp][g + 8][2 * c] = acc[2];
    red[warp][g + 8][2 * c + 1] = acc[3];
    __syncthreads();
    for (int o = threadIdx.x; o < 16 * MMVQ_NCOLS; o += blockDim.x) {
        const int lr = o / MMVQ_NCOLS, col = o % MMVQ_NCOLS, row = row0 + lr;
        if (col >= T || row >= rows) continue;
        float v = 0.f;
        for (int wi = 0; wi < num_warps; ++wi) v += red[wi][lr][col];
        if (bias) v += bias[row];
        if (residual) v += residual[(i64)col * ldy + row];
        y[(i64)col * ldy + row] = v;
    }
}

// Plain f32 weights (small tensors only): one warp per row, f32 FMA, T <= 8 columns.
__global__ void __launch_bounds__(256)
mmv_f32(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
        const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K, int T, int ldx,
        int ldy) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    float acc[MMVQ_NCOLS];
#pragma unroll
    for (int n = 0; n < MMVQ_NCOLS; ++n) acc[n] = 0.f;
    const float* wr = w + (i64)row * K;
    for (int k = lane; k < K; k += 32) {
        const float wv = wr[k];
#pragma unroll
        for (int n = 0; n < MMVQ_NCOLS; ++n)
            if (n < T) acc[n] += wv * x[(i64)n * ldx + k];
    }
#pragma unroll
    for (int n = 0; n < MMVQ_NCOLS; ++n) {
        if (n >= T) break;
        float v = warp_sum(acc[n]);
        if (lane == 0) {
            if (bias) v += bias[row];
            if (residual) v += residual[(i64)n * ldy + row];
            y[(i64)n * ldy + row] = v;
        }
    }
}

// f32 activations x [T, ldin] -> the act layout (f16) and sub-block sums, zero-padded to whole superblocks.
// Grid (superblocks, token groups); 256 threads: thread = position in the superblock, looping over the group's
// tokens. Each group of 8 tokens occupies nsb * 4096 bytes of act and nsb * 128 bytes of sums.
__global__ void __launch_bounds__(256)
act_f16(const float* __restrict__ x, f16* __restrict__ act, f16* __restrict__ sums, f16* __restrict__ act_lo,
        f16* __restrict__ sums_lo, int T, int K, int ldin) {
    const int sb = blockIdx.x, grp = blockIdx.y, nsb = gridDim.x, k_local = threadIdx.x;
    const int k = sb * QK_SB + k_local, lane = threadIdx.x & 31;
    const int c = k_local >> 6, h = (k_local >> 5) & 1, i = (k_local >> 2) & 7, r = k_local & 3;
    const int s = 2 * i + h;
    f16* act_g = act + (i64)grp * nsb * 4096 / 2;
    f16* sums_g = sums + (i64)grp * nsb * 64;
    for (int n = 0; n < 8; ++n) {
        const int t = grp * 8 + n;
        const float v = (t < T && k < K) ? x[(i64)t * ldin + k] : 0.f;
        const f16 hi = f32_to_f16(v);
        act_g[act_index(sb, s, n) + 4 * c + r] = hi;
        const float sub = warp_sum(v);  // a warp covers one 32-wide sub-block
        const i64 si = ((i64)sb * 8 + n) * 8 + (k_local >> 5);
        if (lane == 0) sums_g[si] = f32_to_f16(sub);
        if (act_lo) {  // precise mode: the rounding residue as a second f16 term
            act_lo[(i64)grp * nsb * 2048 + act_index(sb, s, n) + 4 * c + r] = f32_to_f16(v - f16_to_f32(hi));
            if (lane == 0) sums_lo[(i64)grp * nsb * 64 + si] = f32_to_f16(sub - f16_to_f32(f32_to_f16(sub)));
        }
    }
}
