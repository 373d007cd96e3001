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

// Activation fragment for the lane's four consecutive positions e..e+3 (zeros for absent columns and past K).
__device__ __forceinline__ void load_b(u32* b, const f16* xrow, bool has_col, int e, int K) {
    if (has_col && e < K) {
        const uint2 v = ld_cached_u2(xrow + e);
        b[0] = v.x;
        b[1] = v.y;
    } else {
        b[0] = b[1] = 0u;
    }
}

template <int QT, int MT>
__device__ __forceinline__ void mmvq_superblock(const u8* __restrict__ w, const f16* __restrict__ xrow,
                                                const f16* __restrict__ xsum_row, bool has_col, int row0, int rows,
                                                int K, int nb, i64 ntot, int sb, int c, int g,
                                                float (&acc)[MT][4], float (&accm)[MT][4]) {
    using Q = QTraits<QT>;
    typename Q::Row r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = min(row0 + 16 * mt + g + 8 * h, rows - 1);  // rows past the end repeat the last one
            Q::load(r[mt][h], w, ntot, nb, row, sb, c);
        }
    u32 b[Q::NSTEP][2];
#pragma unroll
    for (int s = 0; s < Q::NSTEP; ++s) load_b(b[s], xrow, has_col, sb * Q::SB + Q::kofs(c, s), K);
    typename Q::Consts k[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        Q::prepare(r[mt][0], c, k[mt][0]);
        Q::prepare(r[mt][1], c, k[mt][1]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        float blk[4] = {0.f, 0.f, 0.f, 0.f};
        float* dst = Q::BLOCK_SCALE ? blk : acc[mt];
#pragma unroll
        for (int s = 0; s < Q::NSTEP; ++s) {
            u32 a[4];
            Q::frag(r[mt][0], k[mt][0], c, s, a[0], a[2]);
            Q::frag(r[mt][1], k[mt][1], c, s, a[1], a[3]);
            mma_f16_16816(dst, a, b[s]);
        }
        if constexpr (Q::BLOCK_SCALE) {
            const float d0 = Q::dscale(r[mt][0]), d1 = Q::dscale(r[mt][1]);
            acc[mt][0] += d0 * blk[0];
            acc[mt][1] += d0 * blk[1];
            acc[mt][2] += d1 * blk[2];
            acc[mt][3] += d1 * blk[3];
        }
        if constexpr (Q::HAS_MIN) {
            // sum over sub-blocks of (dmin * m) * (sum of x over the sub-block), k-slots 2c, 2c+1 only
            u32 bm[2] = {has_col ? __ldg(reinterpret_cast<const u32*>(xsum_row + sb * 8 + 2 * c)) : 0u, 0u};
            u32 am[4] = {k[mt][0].mins, k[mt][1].mins, 0u, 0u};
            mma_f16_16816(accm[mt], am, bm);
        }
    }
}

// x: [T, ldx] f16; xsum: [T, ldxs] f16 sums of 32-wide sub-blocks (K-quants with mins only); y, residual: [T, ldy].
template <int QT, int MT>
__global__ void __launch_bounds__(MMVQ_MAX_WARPS * 32)
mmvq(const u8* __restrict__ w, const f16* __restrict__ x, const f16* __restrict__ xsum, float* __restrict__ y,
     const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K, int T, int ldx, int ldxs,
     int ldy) {
    using Q = QTraits<QT>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16 * MT;
    const int nb = Q::QK == 1 ? K : (K + Q::QK - 1) / Q::QK;
    const int nsb = (K + Q::SB - 1) / Q::SB;
    const i64 ntot = (i64)rows * nb;
    const bool has_col = g < T;
    const f16* xrow = x + (i64)(has_col ? g : 0) * ldx;
    const f16* xsum_row = xsum + (i64)(has_col ? g : 0) * ldxs;

    float acc[MT][4], accm[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][i] = accm[mt][i] = 0.f;

    for (int sb = warp; sb < nsb; sb += num_warps)
        mmvq_superblock<QT, MT>(w, xrow, xsum_row, has_col, row0, rows, K, nb, ntot, sb, c, g, acc, accm);

    // reduce the warps' partial sums: red[warp][row][col]
    __shared__ float red[MMVQ_MAX_WARPS][16 * MT][MMVQ_NCOLS];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        red[warp][16 * mt + g][2 * c] = acc[mt][0] - accm[mt][0];
        red[warp][16 * mt + g][2 * c + 1] = acc[mt][1] - accm[mt][1];
        red[warp][16 * mt + g + 8][2 * c] = acc[mt][2] - accm[mt][2];
        red[warp][16 * mt + g + 8][2 * c + 1] = acc[mt][3] - accm[mt][3];
    }
    __syncthreads();
    for (int o = threadIdx.x; o < 16 * MT * MMVQ_NCOLS; o += blockDim.x) {
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

// f32 activations -> f16 copy and f16 sums of each 32-wide sub-block (what the K-quants' min term needs).
// One block per row of x; x: [T, ldin], out: [T, ldx], sums: [T, ldxs].
__global__ void __launch_bounds__(256)
act_f16(const float* __restrict__ in, f16* __restrict__ out, f16* __restrict__ sums, int K, int ldin, int ldx,
        int ldxs) {
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    const float* src = in + (i64)t * ldin;
    for (int base = (threadIdx.x >> 5) * 32; base < K; base += blockDim.x) {
        const int k = base + lane;
        const float v = k < K ? src[k] : 0.f;
        if (k < K) out[(i64)t * ldx + k] = f32_to_f16(v);
        const float s = warp_sum(v);
        if (lane == 0 && sums) sums[(i64)t * ldxs + base / 32] = f32_to_f16(s);
    }
}
