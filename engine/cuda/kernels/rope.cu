// Rotary position embedding on the first rope_dim dims of every head (engine/reference/ops.py: rope).
// NEOX rotates the pair (i, i + rope_dim/2) (qwen2/3/35), otherwise adjacent pairs (2i, 2i+1) (llama).
// The angle position * theta^(-2i/rope_dim) is formed and reduced modulo 2 pi in double precision, as the
// reference forms it, so long contexts keep their accuracy; sin and cos are then taken in float.
#include "common.cuh"

// x[t * ld + h * head_stride + d] in place; positions: [T] int32 on the device. One thread per (t, h, pair).
template <bool NEOX>
__global__ void __launch_bounds__(256)
rope(float* __restrict__ x, const i32* __restrict__ positions, int T, int num_heads, int ld, int head_stride,
     int rope_dim, float theta) {
    PDL_ENTER();
    const int half = rope_dim / 2;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)T * num_heads * half) return;
    const int i = idx % half, h = (idx / half) % num_heads, t = idx / ((i64)half * num_heads);
    const double inv_freq = pow((double)theta, -2.0 * i / rope_dim);
    const double angle = fmod((double)positions[t] * inv_freq, 6.283185307179586);
    float s, c;
    sincosf((float)angle, &s, &c);
    float* p = x + (i64)t * ld + (i64)h * head_stride;
    const int a = NEOX ? i : 2 * i, b = NEOX ? i + half : 2 * i + 1;
    const float x0 = p[a], x1 = p[b];
    p[a] = x0 * c - x1 * s;
    p[b] = x0 * s + x1 * c;
}
