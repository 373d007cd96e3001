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

// Split s's share of a merge of key splits (s = threadIdx.x; row: the index of its (max, sum) pair in part_ml;
// live: a split of the launch): its weight e^(m_s - m), 1 / the weighted sum of the splits' sums, and how many
// leading splits saw keys (attn: split < active; the idle ones after them wrote no o, so a merge takes the first
// `used` without a branch per split and their loads fly together). Block reductions: every thread calls it.
// attn_combine's merge, and the producer's that merges in its place (act.cu ACT_COMBINE).
struct SplitWeight {
    float wt, inv;
    int used;
};

__device__ __forceinline__ SplitWeight split_weight(const float* part_ml, i64 row, bool live, float* scratch) {
    const float ms = live ? part_ml[row * 2] : NEG_INF;
    const float m = block_max(ms, scratch);
    const float wt = (ms == NEG_INF || m == NEG_INF) ? 0.f : __expf(ms - m);
    const float denom = block_sum(live ? wt * part_ml[row * 2 + 1] : 0.f, scratch);
    const int used = (int)block_max(wt != 0.f ? (float)(threadIdx.x + 1) : 0.f, scratch);
    return {wt, denom > 0.f ? 1.f / denom : 0.f, used};
}
