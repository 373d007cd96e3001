// Shared by OP_ATTN_CORE and OP_ATTN_COMBINE: where a split's keys are, and one head row's RMSNorm + rope
// (engine/reference/transformer.py attention_qkv; VM: solvers.split_range, solvers._qk).
#pragma once
#include "mk_common.cuh"

#define ATTN_MAX_QPW 6  // queries per consumer warp: 8 warps hold G * rows <= 48 queries (Qwen3.8: 6 x 8)

// Keys [begin, end) of split `split` of `splits` over kv_len keys: at least 2^MK_ATTN_MIN_KEYS_LOG2 keys per
// active split, the splits past those idle (begin == end).
__device__ __forceinline__ void split_range(int kv_len, int split, int splits, int& begin, int& end) {
    const int active = max(1, min(splits, (kv_len + (1 << MK_ATTN_MIN_KEYS_LOG2) - 1) >> MK_ATTN_MIN_KEYS_LOG2));
    begin = split < active ? (int)((i64)kv_len * split / active) : kv_len;
    end = split < active ? (int)((i64)kv_len * (split + 1) / active) : kv_len;
}

// One warp: buf[d] = rope(RMSNorm(src[d]) * w[d]) at `pos` (NEOX pairs (i, i + rope_dim / 2), the angle
// pos * inv_freq[i] formed and reduced modulo 2 pi in double, as the reference forms it), times `scale`; D <= 256.
// src is read through L2.
__device__ __noinline__ void norm_rope_row(const float* src, const float* w, int D, int rope_dim, const double* inv_freq, float eps,
                              int pos, float scale, float* buf) {
    const int lane = threadIdx.x & 31, half = rope_dim / 2;
    float x[8], ss = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int d = lane + 32 * e;
        x[e] = d < D ? ld_cg(src + d) : 0.f;
        ss += x[e] * x[e];
    }
    const float inv = rsqrtf(warp_sum(ss) / D + eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int d = lane + 32 * e;
        if (d < D) buf[d] = x[e] * inv * w[d];
    }
    __syncwarp();
    float out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int d = lane + 32 * e;
        out[e] = d < D ? buf[d] : 0.f;
        if (d < rope_dim) {
            const int i = d < half ? d : d - half, partner = d < half ? d + half : d - half;
            const double turns = (double)pos * inv_freq[i] * 0.15915494309189535;  // angle / (2 pi)
            const double angle = (turns - floor(turns)) * 6.283185307179586;
            float sn, cs;
            sincosf((float)angle, &sn, &cs);
            out[e] = d < half ? buf[d] * cs - buf[partner] * sn : buf[partner] * sn + buf[d] * cs;
        }
    }
    __syncwarp();
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int d = lane + 32 * e;
        if (d < D) buf[d] = out[e] * scale;
    }
    __syncwarp();
}

// Split partial of (split, row t, head h): o [D], then max, then sum (layout.py: attn_part).
__device__ __forceinline__ float* attn_part_at(const Globals& g, int split, int t, int h) {
    return g.attn_part + (((i64)split * MK_MAX_ROWS + t) * g.num_heads + h) * (g.head_dim + 2);
}
