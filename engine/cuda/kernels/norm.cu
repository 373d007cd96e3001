// Normalisations (engine/reference/ops.py: rms_norm, l2_norm, gated_rms_norm), float32 arithmetic.
#include "common.cuh"

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, one block per token row.
__global__ void __launch_bounds__(1024)
rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int H, int ld_in,
         int ld_out, float eps) {
    PDL_ENTER();
    __shared__ float scratch[32];
    const float* xr = x + (i64)blockIdx.x * ld_in;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss, scratch) / H + eps);
    float* o = out + (i64)blockIdx.x * ld_out;
    for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

// Per-head norms in place on rows (t, h) of x[t * ld + h * head_stride + d], d < D: one warp per row.
// kind 0: RMSNorm times w[D] (qwen3 q/k norm); kind 1: L2 norm times `scale` (DeltaNet q/k).
__global__ void __launch_bounds__(256)
head_norm(float* __restrict__ x, const float* __restrict__ w, int T, int num_heads, int D, int ld, int head_stride,
          float eps, float scale, int kind) {
    PDL_ENTER();
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= T * num_heads) return;
    float* p = x + (i64)(row / num_heads) * ld + (i64)(row % num_heads) * head_stride;
    float ss = 0.f;
    for (int d = lane; d < D; d += 32) ss += p[d] * p[d];
    ss = warp_sum(ss);
    const float inv = kind == 0 ? rsqrtf(ss / D + eps) : rsqrtf(ss + eps) * scale;
    for (int d = lane; d < D; d += 32) p[d] = kind == 0 ? p[d] * inv * w[d] : p[d] * inv;
}

// out[t, h, :] = RMSNorm(o[t, h, :]) * w * silu(z[t, h, :]) (the DeltaNet output norm): one warp per (t, h).
__global__ void __launch_bounds__(256)
gated_rms_norm(const float* __restrict__ o, const float* __restrict__ z, const float* __restrict__ w,
               float* __restrict__ out, int T, int num_heads, int D, int ld_o, int ld_z, int ld_out, float eps) {
    PDL_ENTER();
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= T * num_heads) return;
    const int t = row / num_heads, h = row % num_heads;
    const float* op = o + (i64)t * ld_o + (i64)h * D;
    const float* zp = z + (i64)t * ld_z + (i64)h * D;
    float* outp = out + (i64)t * ld_out + (i64)h * D;
    float ss = 0.f;
    for (int d = lane; d < D; d += 32) ss += op[d] * op[d];
    const float inv = rsqrtf(warp_sum(ss) / D + eps);
    for (int d = lane; d < D; d += 32) outp[d] = op[d] * inv * w[d] * siluf_(zp[d]);
}
