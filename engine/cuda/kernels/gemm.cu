// Prefill matmul on tensor cores (the act layout and fragment order are those of mmvq.cu / quants.cuh).
#include "common.cuh"
#include "quants.cuh"

__device__ __forceinline__ i64 act_index(int sb, int s, int n) { return ((i64)(sb * SB_STEPS + s) * 8 + n) * 16; }

#define GEMM_WARPS 4
#define GEMM_MT 2   // 16-row tiles per warp
#define GEMM_NG 4   // 8-token groups per warp (32 tokens)

// Prefill: y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual) for many tokens, on tensor cores. A block computes
// 128 rows x 64 tokens: each warp decodes its 32 rows of a superblock once (full f16 weights) and multiplies them
// by all 64 tokens; the warps share the activations through L1. Blocks of one row tile are adjacent in the grid
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

    float acc[GEMM_MT][GEMM_NG][4];
#pragma unroll
    for (int mt = 0; mt < GEMM_MT; ++mt)
#pragma unroll
        for (int n = 0; n < GEMM_NG; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][n][e] = 0.f;

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
#pragma unroll
            for (int mt = 0; mt < GEMM_MT; ++mt) {
                F::frag(r[mt][0], k[mt][0], c, s, a[mt][0], a[mt][2]);
                F::frag(r[mt][1], k[mt][1], c, s, a[mt][1], a[mt][3]);
            }
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

