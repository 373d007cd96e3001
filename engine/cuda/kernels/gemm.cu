// Prefill matmul on tensor cores (the act layout and fragment order are those of mmvq.cu / quants.cuh).
#ifndef WEIGHT_EVICT_FIRST
#define WEIGHT_EVICT_FIRST 0  // a weight tile is read again by every token tile (common.cuh)
#endif
#include "common.cuh"
#include "quants.cuh"
#include "stage.cuh"

#define GEMM_WARPS 4
#define GEMM_MT 2   // 16-row tiles per warp
#define GEMM_NG 4   // 8-token groups per warp (32 tokens)

// The A fragments of step s for the warp's GEMM_MT 16-row tiles (rows g and g + 8 of each, already prepared).
template <int QT>
__device__ __forceinline__ void gemm_frags(const typename QTraits<QT>::Row (&r)[GEMM_MT][2],
                                           const typename FullFrag<QT>::Consts (&k)[GEMM_MT][2], int c, int s,
                                           u32 (&a)[GEMM_MT][4]) {
#pragma unroll
    for (int mt = 0; mt < GEMM_MT; ++mt) {
        FullFrag<QT>::frag(r[mt][0], k[mt][0], c, s, a[mt][0], a[mt][2]);
        FullFrag<QT>::frag(r[mt][1], k[mt][1], c, s, a[mt][1], a[mt][3]);
    }
}

// y[tok, row] = acc (+ bias[row]) (+ residual[tok, row]) for the warp's rows from row0 and tokens of groups grp0..
__device__ __forceinline__ void gemm_store(const float (&acc)[GEMM_MT][GEMM_NG][4], float* y, const float* bias,
                                           const float* residual, int row0, int grp0, int rows, int T, int ldy,
                                           int g, int c) {
#pragma unroll
    for (int mt = 0; mt < GEMM_MT; ++mt)
#pragma unroll
        for (int n = 0; n < GEMM_NG; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + 16 * mt + g + 8 * (e >> 1), tok = (grp0 + n) * 8 + 2 * c + (e & 1);
                if (row >= rows || tok >= T) continue;
                float v = acc[mt][n][e];
                if (bias) v += bias[row];
                if (residual) v += residual[(i64)tok * ldy + row];
                y[(i64)tok * ldy + row] = v;
            }
}

// Prefill: y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual) for many tokens, on tensor cores. A block computes
// 128 rows x 32 tokens: each warp decodes its 32 rows of a superblock once (full f16 weights) and multiplies them
// by all 32 tokens; the warps share the activations through L1. Blocks of one row tile are adjacent in the grid
// (x = token tiles), so they run together and the weights come from L2 after the first. act: token group 0.
template <int QT>
__global__ void __launch_bounds__(GEMM_WARPS * 32)
gemm(const u8* __restrict__ w, const f16* __restrict__ act, float* __restrict__ y, const float* __restrict__ bias,
     const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    PDL_ENTER();
    using Q = QTraits<QT>;
    using F = FullFrag<QT>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.y * (GEMM_WARPS * GEMM_MT * 16) + warp * GEMM_MT * 16;
    const int grp0 = blockIdx.x * GEMM_NG;
    const int nb = Q::QK == 1 ? K : (K + Q::QK - 1) / Q::QK;
    const int nsb = (K + QK_SB - 1) / QK_SB;
    const Planes P = Q::planes(w, (u64)rows * nb);
    const i64 group_halves = (i64)nsb * 2048;  // one 8-token group of the act layout

    float acc[GEMM_MT][GEMM_NG][4] = {};

    for (int sb = 0; sb < nsb; ++sb) {
        typename Q::Row r[GEMM_MT][2];
        typename F::Consts k[GEMM_MT][2];
#pragma unroll
        for (int mt = 0; mt < GEMM_MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                Q::load(r[mt][h], P, nb, min(row0 + 16 * mt + g + 8 * h, rows - 1), sb, c);
                F::prepare(r[mt][h], c, k[mt][h]);
            }
        }
#pragma unroll
        for (int s = 0; s < SB_STEPS; ++s) {
            asm volatile("" ::: "memory");  // keep each step's loads in its step: bounds register pressure
            u32 a[GEMM_MT][4];
            gemm_frags<QT>(r, k, c, s, a);
#pragma unroll
            for (int n = 0; n < GEMM_NG; ++n) {
                const int tok = (grp0 + n) * 8 + g;
                u32 b[2] = {0u, 0u};
                if (tok < T) {
                    const uint2 v = ld_cached_u2(act + (grp0 + n) * group_halves + act_index(sb, s, g) + 4 * c);
                    b[0] = v.x;
                    b[1] = v.y;
                }
#pragma unroll
                for (int mt = 0; mt < GEMM_MT; ++mt) mma_f16_16816(acc[mt][n], a[mt], b);
            }
        }
    }
    gemm_store(acc, y, bias, residual, row0, grp0, rows, T, ldy, g, c);
}


// ---- the same product with its operands staged by cp.async (K-quants with a Stage, kernels/stage.cuh) ----
//
// gemm reads each superblock's weights and activations straight from global memory when it starts on it, so every
// superblock waits out one L2 round trip. Here the block's threads copy superblock sb + 1 (each warp its two 16-row
// weight tiles, all threads together the 32 tokens' activations, 16 KB) while the warps multiply superblock sb
// out of shared memory: GEMM_STAGES slots of GemmStage<QT>::BYTES, dynamic shared memory GEMM_STAGES * BYTES.
// K a multiple of 256.
#define GEMM_STAGES 2
#define GEMM_ACT_BYTES (GEMM_NG * SB_STEPS * 8 * 32)  // one superblock of GEMM_NG token groups (4 KB each)

template <int QT>
struct GemmStage {
    static constexpr int WEIGHTS = GEMM_WARPS * GEMM_MT * Stage<QT>::BYTES, BYTES = WEIGHTS + GEMM_ACT_BYTES;
};

template <int QT>
__global__ void __launch_bounds__(GEMM_WARPS * 32)
gemm_cp(const u8* __restrict__ w, const f16* __restrict__ act, float* __restrict__ y, const float* __restrict__ bias,
        const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    PDL_ENTER();
    using Q = QTraits<QT>;
    using F = FullFrag<QT>;
    using S = Stage<QT>;
    using G = GemmStage<QT>;
    constexpr int THREADS = GEMM_WARPS * 32, ACT_CHUNKS = GEMM_ACT_BYTES / 16 / THREADS;
    extern __shared__ __align__(16) u8 ring[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.y * (GEMM_WARPS * GEMM_MT * 16) + warp * GEMM_MT * 16;
    const int grp0 = blockIdx.x * GEMM_NG, nsb = K / QK_SB, groups = (T + 7) / 8;
    const u64 ntot = (u64)rows * nsb;
    const Planes P = Q::planes(w, ntot);
    const u32 ring_s = smem_u32(ring);
    typename S::Lane L[GEMM_MT];
    u32 base[GEMM_MT][2];
#pragma unroll
    for (int mt = 0; mt < GEMM_MT; ++mt) {
        S::init(L[mt], row0 + 16 * mt, rows, nsb, lane);
        base[mt][0] = stage_row_base(row0 + 16 * mt, g, rows, nsb);
        base[mt][1] = stage_row_base(row0 + 16 * mt, g + 8, rows, nsb);
    }
    const i64 group_halves = (i64)nsb * 2048;
    // Superblock sb into slot: the warp's weight tiles, then this thread's 16-byte chunks of the activations
    // (chunk q: group q / 256 of the block, bytes 16 (q % 256) of its 4 KB; groups past T are zero-filled).
    auto copy_stage = [&](int slot, int sb) {
        const u32 dst = ring_s + slot * G::BYTES;
#pragma unroll
        for (int mt = 0; mt < GEMM_MT; ++mt) S::copy(dst + (warp * GEMM_MT + mt) * S::BYTES, P, L[mt], sb, lane, ntot);
#pragma unroll
        for (int j = 0; j < ACT_CHUNKS; ++j) {
            const int q = tid + THREADS * j, grp = grp0 + (q >> 8);
            const bool live = grp < groups;
            const f16* src = live ? act + grp * group_halves + (i64)sb * 2048 + (q & 255) * 8 : act;
            cp_async16z(dst + G::WEIGHTS + 16 * q, src, live ? 16u : 0u);
        }
    };
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (s < nsb) copy_stage(s, s);
        cp_async_commit();
    }

    float acc[GEMM_MT][GEMM_NG][4] = {};

    for (int sb = 0; sb < nsb; ++sb) {
        const int ahead = sb + GEMM_STAGES - 1;
        if (ahead < nsb) copy_stage(ahead % GEMM_STAGES, ahead);  // its slot was freed by the last barrier
        cp_async_commit();
        cp_async_wait<GEMM_STAGES - 1>();  // this thread's copies of superblock sb have landed
        __syncthreads();                   // and every other thread's
        const u8* st = ring + (sb % GEMM_STAGES) * G::BYTES;
        typename Q::Row r[GEMM_MT][2];
        typename F::Consts k[GEMM_MT][2];
#pragma unroll
        for (int mt = 0; mt < GEMM_MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                S::read(r[mt][h], st + (warp * GEMM_MT + mt) * S::BYTES, g + 8 * h, c, base[mt][h] + sb);
                F::prepare(r[mt][h], c, k[mt][h]);
            }
        const u8* sa = st + G::WEIGHTS;
#pragma unroll
        for (int s = 0; s < SB_STEPS; ++s) {
            u32 a[GEMM_MT][4];
            gemm_frags<QT>(r, k, c, s, a);
#pragma unroll
            for (int n = 0; n < GEMM_NG; ++n) {
                const uint2 v = *reinterpret_cast<const uint2*>(sa + n * 4096 + (s * 8 + g) * 32 + 8 * c);
                const u32 b[2] = {v.x, v.y};
#pragma unroll
                for (int mt = 0; mt < GEMM_MT; ++mt) mma_f16_16816(acc[mt][n], a[mt], b);
            }
        }
        __syncthreads();  // every warp is done with the slot the next iteration's copy refills
    }
    cp_async_wait<0>();
    gemm_store(acc, y, bias, residual, row0, grp0, rows, T, ldy, g, c);
}
