// Causal grouped-query attention over an f16 KV cache (engine/reference/ops.py: attention), float32 arithmetic.
//
// attn serves decode/verify (and prefill where attention_prefill.cu's tensor-core kernel does not). A block owns one KV head and a tile of query tokens; its queries
// are the G = Hq / Hkv query heads of that KV head for each token of the tile (up to 4 * QPW of them, QPW per
// warp). Keys are split over gridDim.z (flash decoding): each split streams its share of the visible keys once,
// keeps an online softmax per query, and writes a partial (o, max, sum) that attn_combine merges. With one split
// the block normalises and writes the output itself. Positions live in device memory, so the same launch can be
// captured in a CUDA graph and replayed at any sequence length.
#include "attention.cuh"

#define ATTN_WARPS 4

// KV cache: [Hkv][capacity][D] f16. kv_store writes the f32 keys/values of T tokens at their positions.
__global__ void __launch_bounds__(256)
kv_store(const float* __restrict__ k, const float* __restrict__ v, f16* __restrict__ kcache, f16* __restrict__ vcache,
         const i32* __restrict__ positions, int T, int num_kv_heads, int D, int capacity, int ld_k, int ld_v) {
    PDL_ENTER();
    const int t = blockIdx.x, h = blockIdx.y;
    const i64 dst = ((i64)h * capacity + positions[t]) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        kcache[dst + d] = f32_to_f16(k[(i64)t * ld_k + h * D + d]);
        vcache[dst + d] = f32_to_f16(v[(i64)t * ld_v + h * D + d]);
    }
}

// Attention inputs of T tokens in one launch: per row (t, head) of q, k and v (one warp each) the optional
// per-head RMSNorm (qwen3/qwen35), rope on the first rope_dim dims (positions from the device), q written back in
// place, k and v stored in the f16 caches at their positions. Rows: T x (Hq + 2 Hkv); 8 warps per block.
struct QkPrep {
    float* q;              // q[t * ld + h * q_head_stride + d]
    const float* k;        // k[t * ld + h * D + d], v likewise
    const float* v;
    const float* q_norm;   // optional [D] weights
    const float* k_norm;
    f16* kcache;           // [Hkv][capacity][D]
    f16* vcache;
    const i32* positions;
    int T, num_heads, num_kv_heads, D, ld, q_head_stride, capacity, rope_dim, neox;
    float theta, eps;
};

// Row (t, kind, head) of qk_prep's work into out (lane's values d = lane + 32 e): loaded into buf (D floats of
// the warp's own shared memory), the per-head RMSNorm where weights are given, rope on q and k. The fused decode
// attention (attn_prep) forms its queries and this pass's keys with the same statements, so the same bits. DC: the
// head size where the caller knows it (its loops unrolled, out in registers), else 0 (p.D).
template <int DC>
__device__ __forceinline__ void prep_row(const QkPrep& p, int t, int kind, int head, float* buf, float (&out)[8],
                                         int lane) {
    const int D = DC ? DC : p.D;
    const float* src = kind == 0 ? p.q + (i64)t * p.ld + (i64)head * p.q_head_stride
                     : (kind == 1 ? p.k : p.v) + (i64)t * p.ld + (i64)head * D;
    float ss = 0.f;
#pragma unroll
    for (int d = lane; d < D; d += 32) {
        buf[d] = src[d];
        ss += buf[d] * buf[d];
    }
    const float* norm = kind == 0 ? p.q_norm : kind == 1 ? p.k_norm : nullptr;
    if (norm) {
        const float inv = rsqrtf(warp_sum(ss) / D + p.eps);
#pragma unroll
        for (int d = lane; d < D; d += 32) buf[d] = buf[d] * inv * norm[d];
    }
    __syncwarp();
    const int pos = p.positions[t], half = p.rope_dim / 2;
#pragma unroll
    for (int e = 0, d = lane; d < D; ++e, d += 32) {
        float x = buf[d];
        if (kind < 2 && d < p.rope_dim) {
            const int i = p.neox ? (d < half ? d : d - half) : d / 2;
            const bool first = p.neox ? d < half : (d & 1) == 0;
            const int partner = p.neox ? (first ? d + half : d - half) : (d ^ 1);
            const double inv_freq = pow((double)p.theta, -2.0 * i / p.rope_dim);
            float sn, cs;
            sincosf((float)fmod((double)pos * inv_freq, 6.283185307179586), &sn, &cs);
            x = first ? x * cs - buf[partner] * sn : buf[partner] * sn + x * cs;
        }
        out[e] = x;
    }
    __syncwarp();  // buf is read above (partners) before the caller's next row overwrites it
}

__global__ void __launch_bounds__(256) qk_prep(QkPrep p) {
    PDL_ENTER();
    __shared__ float rowbuf[8][256];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, D = p.D;
    const int per_token = p.num_heads + 2 * p.num_kv_heads;
    const int row = blockIdx.x * 8 + warp;
    if (row >= p.T * per_token) return;
    const int t = row / per_token, j = row % per_token;
    const int kind = j < p.num_heads ? 0 : j < p.num_heads + p.num_kv_heads ? 1 : 2;  // q, k, v
    const int head = kind == 0 ? j : kind == 1 ? j - p.num_heads : j - p.num_heads - p.num_kv_heads;
    float out[8];
    prep_row<0>(p, t, kind, head, rowbuf[warp], out, lane);
    if (kind == 0) {
        for (int e = 0, d = lane; d < D; ++e, d += 32) p.q[(i64)t * p.ld + (i64)head * p.q_head_stride + d] = out[e];
    } else {
        const int pos = p.positions[t];
        f16* cache = (kind == 1 ? p.kcache : p.vcache) + ((i64)head * p.capacity + pos) * D;
        for (int e = 0, d = lane; d < D; ++e, d += 32) cache[d] = f32_to_f16(out[e]);
    }
}

__device__ __forceinline__ void unpack_h2(u32 w, float& lo, float& hi) {
    lo = f16_to_f32((f16)(w & 0xFFFFu));
    hi = f16_to_f32((f16)(w >> 16));
}

template <int D>
__device__ __forceinline__ void load_row_f16(const f16* p, float (&x)[D / 32 > 0 ? D / 32 : 1], int lane) {
    // lane's slice d = lane * D/32 .. of one row, in the widest loads its alignment allows (rows are D halves)
    constexpr int DL = D / 32;
    const f16* src = p + lane * DL;
    if constexpr (DL % 8 == 0) {
#pragma unroll
        for (int e = 0; e < DL; e += 8) {
            const uint4 v = *reinterpret_cast<const uint4*>(src + e);
            unpack_h2(v.x, x[e], x[e + 1]);
            unpack_h2(v.y, x[e + 2], x[e + 3]);
            unpack_h2(v.z, x[e + 4], x[e + 5]);
            unpack_h2(v.w, x[e + 6], x[e + 7]);
        }
    } else if constexpr (DL == 4) {
        const uint2 v = *reinterpret_cast<const uint2*>(src);
        unpack_h2(v.x, x[0], x[1]);
        unpack_h2(v.y, x[2], x[3]);
    } else if constexpr (DL == 2) {
        unpack_h2(*reinterpret_cast<const u32*>(src), x[0], x[1]);
    } else {
#pragma unroll
        for (int e = 0; e < DL; ++e) x[e] = f16_to_f32(src[e]);
    }
}

// Value rows a lane loads before using any (a power of two dividing 32): 64 floats of them beside the
// accumulators of few queries, 32 beside many.
__device__ __forceinline__ constexpr int attn_pv_rows(int D, int QPW) {
    const int rows = (QPW <= 4 ? 64 : 32) / (D / 32);
    return rows > 32 ? 32 : rows < 1 ? 1 : rows;
}

// PRE (the decode and verify instances' _pre forms, attn_d{D}_q{n}_pre, the default: engine/cuda/mixers.py ATTN_PRE;
// instances.ATTN_PRE_KEYS): the first PRE keys of the split that earlier passes wrote (below the pass's first
// position: qk_prep writes this pass's) are copied into shared memory before the PDL wait, so that their round
// trips overlap the kernels in front instead of following qk_prep (at a 528-key context a split's 32 keys were ~8
// dependent loads after it: 17 us a layer on the H200; the H100's 27B one-token pass 7.887 -> 7.772 ms,
// bench/NOTES.md Z19). Only kernels of earlier passes wrote those rows, and positions is set before the pass.
// Rows at a pitch of D + 8 halves: a lane reads its own key's row, 16 bytes at a time, the 8 of a phase in 8 banks.
#define ATTN_PRE_PITCH(D) ((D) + 8)
// PREP (attn_prep, engine/cuda/mixers.py ATTN_PREP): qk_prep's work for the block itself, after the PDL wait, so a
// decode or verify pass launches no qk_prep: each warp forms its queries (norm, rope) from the projection's rows,
// and the block forms the keys and values of this pass (positions[0] on: at most the pass's tokens, consecutive
// positions) that fall in its split, into shared memory for its own use; the blocks of the last query tile (whose
// splits cover all of them, each key once) also store them into the caches. The same statements as qk_prep
// (prep_row), so the same bits. Up to ATTN_NEW_KEYS tokens a pass.
#define ATTN_NEW_KEYS 8

template <int D, int QPW, int PRE, bool PREP>
__device__ __forceinline__ void attn_body(const AttnArgs& a, const QkPrep& p) {
    constexpr int DL = D / 32;
    constexpr int ATTN_PV_ROWS = attn_pv_rows(D, QPW);
    constexpr int KP = ATTN_PRE_PITCH(D);
    extern __shared__ float qs[];  // [ATTN_WARPS * QPW][D] queries of the block, pre-scaled; then PRE keys and values
    f16* pk = reinterpret_cast<f16*>(qs + ATTN_WARPS * QPW * D);  // [PRE][KP] keys k_begin .., then [PRE][KP] values
    f16* pv = pk + PRE * KP;
    f16* nk = pv + PRE * KP;  // PREP: [ATTN_NEW_KEYS][KP] this pass's keys from first_new, the values, then
    f16* nv = nk + ATTN_NEW_KEYS * KP;  // [ATTN_WARPS][D] f32 rows for prep_row
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = blockIdx.x, t0 = blockIdx.y * a.tile_tokens, split = blockIdx.z, splits = gridDim.z;
    const int G = a.num_heads / a.num_kv_heads;
    const int num_q = min(a.tile_tokens, a.T - t0) * G;

    // keys visible to the tile, and this split's share of them: a split takes at least 2^min_keys_log2 keys, so
    // at short lengths the higher splits stay idle (their partials say "no keys") instead of each filling its
    // queries for a handful of keys; the grid itself is fixed, so a captured graph fits every length
    const int last_t = min(t0 + a.tile_tokens, a.T) - 1;
    const int kv_len = a.positions[last_t] + 1;
    const int active = max(1, min(splits, (kv_len + (1 << a.min_keys_log2) - 1) >> a.min_keys_log2));
    const int k_begin = split < active ? (int)((i64)kv_len * split / active) : kv_len;
    const int k_end = split < active ? (int)((i64)kv_len * (split + 1) / active) : kv_len;
    const bool idle = k_begin >= k_end && splits > 1;
    const f16* kc = a.kcache + (i64)kvh * a.capacity * D;
    const f16* vc = a.vcache + (i64)kvh * a.capacity * D;
    int pre_end = k_begin;  // keys k_begin .. pre_end - 1 come from shared memory
    if (PRE > 0 && !idle) {
        pre_end = max(k_begin, min(min(k_end, k_begin + PRE), a.positions[0]));
        for (int i = threadIdx.x; i < (pre_end - k_begin) * (D / 8); i += blockDim.x) {
            const int r = i / (D / 8), c = 8 * (i % (D / 8));
            cp_async16(smem_u32(pk + r * KP + c), kc + (i64)(k_begin + r) * D + c);
            cp_async16(smem_u32(pv + r * KP + c), vc + (i64)(k_begin + r) * D + c);
        }
        cp_async_commit();
    }
    PDL_ENTER();
    const int first_new = PREP ? max(k_begin, a.positions[0]) : k_end;  // PREP: keys from here on are this pass's
    if (idle) {  // idle split: an empty partial, without loading the queries
        for (int qi = threadIdx.x; qi < num_q; qi += blockDim.x) {
            const int t = t0 + qi / G, h = kvh * G + qi % G;
            const i64 row = ((i64)split * a.T + t) * a.num_heads + h;
            a.part_ml[row * 2] = NEG_INF;
            a.part_ml[row * 2 + 1] = 0.f;
        }
        return;
    }
    if constexpr (PREP) {
        float* rowbuf = reinterpret_cast<float*>(nv + ATTN_NEW_KEYS * KP) + warp * D;
        for (int j = 0; j < QPW; ++j) {  // the warp's own queries
            const int qi = warp * QPW + j;
            float* row = qs + qi * D;
            if (qi < num_q) {
                float out[8];
                prep_row<D>(p, t0 + qi / G, 0, kvh * G + qi % G, rowbuf, out, lane);
#pragma unroll
                for (int e = 0; e < DL; ++e) row[lane + 32 * e] = out[e] * a.scale;
            } else {
                for (int d = lane; d < D; d += 32) row[d] = 0.f;
            }
        }
        const bool writer = blockIdx.y == gridDim.y - 1;
        for (int key = first_new + warp; key < k_end; key += ATTN_WARPS) {  // this pass's keys in the split
            const int t = key - a.positions[0];
            for (int kind = 1; kind <= 2; ++kind) {
                float out[8];
                prep_row<D>(p, t, kind, kvh, rowbuf, out, lane);
                f16* row = (kind == 1 ? nk : nv) + (key - first_new) * KP;
                f16* cache = (kind == 1 ? p.kcache : p.vcache) + ((i64)kvh * p.capacity + key) * D;
#pragma unroll
                for (int e = 0; e < DL; ++e) {
                    const f16 h = f32_to_f16(out[e]);
                    row[lane + 32 * e] = h;
                    if (writer) cache[lane + 32 * e] = h;
                }
            }
        }
    } else {
        for (int i = threadIdx.x; i < ATTN_WARPS * QPW * D; i += blockDim.x) {
            const int qi = i / D, d = i % D;
            float v = 0.f;
            if (qi < num_q) {
                const int t = t0 + qi / G, h = kvh * G + qi % G;
                v = a.q[(i64)t * a.ld_q + (i64)h * a.q_head_stride + d] * a.scale;
            }
            qs[i] = v;
        }
    }
    if (PRE > 0) cp_async_wait<0>();
    __syncthreads();
    if (warp * QPW >= num_q) return;  // a warp without queries (no block barrier follows)
    int qpos[QPW];
#pragma unroll
    for (int j = 0; j < QPW; ++j) {
        const int qi = warp * QPW + j;
        qpos[j] = qi < num_q ? a.positions[t0 + qi / G] : -1;  // -1: an empty slot sees no key
    }
    float o[QPW][DL], m[QPW], l[QPW];
#pragma unroll
    for (int j = 0; j < QPW; ++j) {
        m[j] = NEG_INF;
        l[j] = 0.f;
#pragma unroll
        for (int e = 0; e < DL; ++e) o[j][e] = 0.f;
    }
    const float* qw = qs + warp * QPW * D;

    for (int k0 = k_begin; k0 < k_end; k0 += 32) {
        // scores: lane = key k0 + lane
        const int key = k0 + lane;
        float s[QPW];
#pragma unroll
        for (int j = 0; j < QPW; ++j) s[j] = 0.f;
        if (key < k_end) {
            const f16* kr = PREP && key >= first_new ? nk + (key - first_new) * KP
                          : PRE > 0 && key < pre_end ? pk + (key - k_begin) * KP : kc + (i64)key * D;
#pragma unroll 8
            for (int d0 = 0; d0 < D; d0 += 8) {
                const uint4 raw = *reinterpret_cast<const uint4*>(kr + d0);
                float kv[8];
                const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    kv[2 * e] = f16_to_f32((f16)(words[e] & 0xFFFFu));
                    kv[2 * e + 1] = f16_to_f32((f16)(words[e] >> 16));
                }
#pragma unroll
                for (int j = 0; j < QPW; ++j) {
                    const float4 qa = *reinterpret_cast<const float4*>(qw + j * D + d0);
                    const float4 qb = *reinterpret_cast<const float4*>(qw + j * D + d0 + 4);
                    s[j] += qa.x * kv[0] + qa.y * kv[1] + qa.z * kv[2] + qa.w * kv[3] + qb.x * kv[4] + qb.y * kv[5] +
                            qb.z * kv[6] + qb.w * kv[7];
                }
            }
        }
        // online softmax
        float p[QPW];
#pragma unroll
        for (int j = 0; j < QPW; ++j) {
            const bool visible = key < k_end && key <= qpos[j];
            const float sj = visible ? s[j] : NEG_INF;
            const float m_new = fmaxf(m[j], warp_max(sj));
            const float corr = m_new == NEG_INF ? 1.f : __expf(m[j] - m_new);
            p[j] = visible ? __expf(sj - m_new) : 0.f;
            l[j] = l[j] * corr + p[j];
            m[j] = m_new;
#pragma unroll
            for (int e = 0; e < DL; ++e) o[j][e] *= corr;
        }
        // o += p v: lane owns dims lane * DL ..; U value rows loaded before any is used, so a chunk of 32 keys
        // waits for the memory 32 / U times, not 32 (a key past the split has p = 0 and its row reads as 0)
        const int num_keys = min(32, k_end - k0);
        for (int kk0 = 0; kk0 < num_keys; kk0 += ATTN_PV_ROWS) {
            float v[ATTN_PV_ROWS][DL];
#pragma unroll
            for (int u = 0; u < ATTN_PV_ROWS; ++u) {
                if (kk0 + u < num_keys) {
                    const int key_u = k0 + kk0 + u;
                    load_row_f16<D>(PREP && key_u >= first_new ? nv + (key_u - first_new) * KP
                                    : PRE > 0 && key_u < pre_end ? pv + (key_u - k_begin) * KP : vc + (i64)key_u * D,
                                    v[u], lane);
                } else {
#pragma unroll
                    for (int e = 0; e < DL; ++e) v[u][e] = 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < ATTN_PV_ROWS; ++u)
#pragma unroll
                for (int j = 0; j < QPW; ++j) {
                    const float pj = __shfl_sync(FULL_MASK, p[j], kk0 + u);
#pragma unroll
                    for (int e = 0; e < DL; ++e) o[j][e] += pj * v[u][e];
                }
        }
    }

#pragma unroll
    for (int j = 0; j < QPW; ++j) {
        const int qi = warp * QPW + j;
        const float lsum = warp_sum(l[j]);
        if (qi >= num_q) continue;
        const int t = t0 + qi / G, h = kvh * G + qi % G;
        if (splits == 1) {
            const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
            for (int e = 0; e < DL; ++e) {
                const int d = lane * DL + e;
                float val = o[j][e] * inv;
                if (a.gate) val *= sigmoidf_(a.gate[(i64)t * a.ld_gate + (i64)h * a.gate_head_stride + d]);
                a.out[(i64)t * a.ld_out + (i64)h * D + d] = val;
            }
        } else {
            const i64 row = ((i64)split * a.T + t) * a.num_heads + h;
#pragma unroll
            for (int e = 0; e < DL; ++e) a.part_o[row * D + lane * DL + e] = o[j][e];
            if (lane == 0) {
                a.part_ml[row * 2] = m[j];
                a.part_ml[row * 2 + 1] = lsum;
            }
        }
    }
}

template <int D, int QPW, int PRE>
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn(AttnArgs a) {
    attn_body<D, QPW, PRE, false>(a, QkPrep{});
}

template <int D, int QPW, int PRE>
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn_prep(AttnArgs a, QkPrep p) {
    attn_body<D, QPW, PRE, true>(a, p);
}

// Merge the splits' partials: out = sum_s e^(m_s - m) o_s / sum_s e^(m_s - m) l_s, times the optional gate.
// One block per (t, h): the split weights are formed once in shared memory, then threads sweep D.
__global__ void __launch_bounds__(256) attn_combine(AttnArgs a, int splits, int D) {
    PDL_ENTER();
    __shared__ float weight[256];
    __shared__ float scratch[32];
    const int t = blockIdx.x, h = blockIdx.y;
    const int s = threadIdx.x;
    const SplitWeight sw = split_weight(a.part_ml, ((i64)s * a.T + t) * a.num_heads + h, s < splits, scratch);
    weight[s] = sw.wt;
    __syncthreads();
    const int used = sw.used;
    const float inv = sw.inv;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
#pragma unroll 8
        for (int si = 0; si < used; ++si)
            acc += weight[si] * a.part_o[(((i64)si * a.T + t) * a.num_heads + h) * D + d];
        float val = acc * inv;
        if (a.gate) val *= sigmoidf_(a.gate[(i64)t * a.ld_gate + (i64)h * a.gate_head_stride + d]);
        a.out[(i64)t * a.ld_out + (i64)h * D + d] = val;
    }
}
