// The arguments of the attention kernels (attention.cu: decode and verify with key splits; attention_prefill.cu:
// prefill on tensor cores), passed by value; engine/cuda/mixers.py AttnArgs mirrors the field order.
#pragma once
#include "common.cuh"

struct AttnArgs {
    const float* q;       // query of (t, head h): q[t * ld_q + h * q_head_stride + d]
    const f16* kcache;
    const f16* vcache;
    const i32* positions; // [T] query positions; query t sees keys 0 .. positions[t]
    float* out;           // [T, ld_out]: head h at h * D (final output, one split)
    float* part_o;        // [splits][T][Hq][D] partial outputs (several splits)
    float* part_ml;       // [splits][T][Hq][2] partial (max, sum)
    const float* gate;    // optional sigmoid gate: gate[t * ld_gate + h * gate_head_stride + d]
    int T, num_heads, num_kv_heads, capacity, ld_q, q_head_stride, ld_out, ld_gate, gate_head_stride, tile_tokens;
    int min_keys_log2;    // log2 of the fewest keys per active split (engine/cuda/mixers.py: ATTN_MIN_KEYS)
    float scale;
};
