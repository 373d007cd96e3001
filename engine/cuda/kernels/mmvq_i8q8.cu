// Q8_0 x 1-8 tokens with int8 activations: y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), x in act8
// (kernels/mmvq_i8.cu describes that copy). For the small Q8_0 matrices of a decode or verify pass (the DeltaNet's
// alpha | beta: 96 rows) where the int8 copy is all the producer wrote (a closer writes no f16 form:
// engine/cuda/ops.py Closer), and where it is there anyway.
//
// A warp a row: lane l takes the row's 32-wide blocks l, l + 32, ...; a block is one sub-block of the act8 copy,
// whose 32 levels lie in 4 pieces of 8 bytes 16 bytes apart. Its 32 signed weights times the hi and the lo levels
// by dp4a (exact int32 sums), scaled by the block's d and the superblock's two level scales; the warp's sum in
// lane 0. Weights and their d are streamed once (ld.global.cs), the levels (10 KB a token at K = 5,120) are read
// by every warp and stay in L1 / L2.
#include "act8.cuh"
#include "quants.cuh"

#define I8Q8_WARPS 8  // warps (rows) a block; mirrored by engine/cuda/ops.py

__device__ __forceinline__ int dp4a_8(const uint4& wq, const uint2& x0, const uint2& x1, int acc) {
    acc = __dp4a((int)wq.x, (int)x0.x, acc);
    acc = __dp4a((int)wq.y, (int)x0.y, acc);
    acc = __dp4a((int)wq.z, (int)x1.x, acc);
    return __dp4a((int)wq.w, (int)x1.y, acc);
}

// Launch: ceil(rows / I8Q8_WARPS) blocks of I8Q8_WARPS warps; K a multiple of 256, x the act8 bases of group 0's
// T <= 8 tokens, y and residual [T, ldy]. A lane's weights are loaded once for all the tokens.
__global__ void __launch_bounds__(I8Q8_WARPS * 32)
mmvq_q8_0_i8(const u8* __restrict__ w, const i8* __restrict__ q8, const float* __restrict__ scale8,
             float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ residual, int rows,
             int K, int T, int ldy) {
    PDL_ENTER();  // the activations are the previous kernel's output
    const int lane = threadIdx.x & 31, row = blockIdx.x * I8Q8_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int nb = K / 32;
    const Planes P = QTraits<QT_Q8_0>::planes(w, (u64)rows * nb);
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int b = lane; b < nb; b += 32) {
        const u64 idx = (u64)row * nb + b;
        const uint4 wa = ld_stream_u4(P.p[0] + idx * 32), wb = ld_stream_u4(P.p[0] + idx * 32 + 16);
        const float d = f16_to_f32((f16)ld_stream_u16(P.p[1] + idx * 2));
        const int sb = b >> 3, j = b & 7;  // the superblock and its sub-block (positions 32 j .. 32 j + 31)
        const i8* base = q8 + (i64)sb * 4096 + 64 * (j >> 1) + 8 * (j & 1);
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            if (t >= T) break;
            // token t's levels: hi at 256 t, lo 2048 on; block positions 8 m .. 8 m + 7 at 16 m (uint2 index 2 m)
            const uint2* h = reinterpret_cast<const uint2*>(base + 256 * t);
            const uint2* l = reinterpret_cast<const uint2*>(base + 2048 + 256 * t);
            const int dh = dp4a_8(wb, h[4], h[6], dp4a_8(wa, h[0], h[2], 0));
            const int dl = dp4a_8(wb, l[4], l[6], dp4a_8(wa, l[0], l[2], 0));
            acc[t] = fmaf(d, fmaf(scale8[16 * sb + t], (float)dh, scale8[16 * sb + 8 + t] * (float)dl), acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        if (t >= T) break;
        float v = warp_sum(acc[t]);
        if (lane == 0) {
            if (bias) v += bias[row];
            if (residual) v += residual[(i64)t * ldy + row];
            y[(i64)t * ldy + row] = v;
        }
    }
}
