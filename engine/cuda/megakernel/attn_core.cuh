// OP_ATTN_CORE: one key split of causal attention for the query heads of one KV head. The split that holds this
// pass's new positions first normalises, ropes and stores their keys and values into the f16 cache; then every
// query (head, row) of the KV head streams the split's keys once with an online softmax and leaves a partial
// (o, max, sum) for OP_ATTN_COMBINE. VM: solvers.attn_core.
#pragma once
#include "attn_common.cuh"

struct AttnCoreOp {
    static constexpr int OPCODE = OP_ATTN_CORE;
    static constexpr int WAITS_ON = OP_MIX_IN;
    struct Parsed {
        int layer, kv_head, split, num_splits;  // fields, in the order of instructions.py's AttnCore
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), kv_head(w[INST_ARGS + 1]), split(w[INST_ARGS + 2]), num_splits(w[INST_ARGS + 3]) {}
    };
    struct Loader {  // the cache rows depend on the position: left to the hardware
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    // This pass's keys and values at positions [first, end) into the cache (a warp per position).
    static __device__ void store_new(const Globals& g, const LayerRefs& L, int kvh, int pos0, int first, int end,
                                     float* bufs) {
        const int D = g.head_dim, lane = threadIdx.x & 31;
        f16* kc = static_cast<f16*>(L.s[LS_K]) + (i64)kvh * g.capacity * D;
        f16* vc = static_cast<f16*>(L.s[LS_V]) + (i64)kvh * g.capacity * D;
        float* buf = bufs + cwarp() * 256;
        for (int p = first + cwarp(); p < end; p += MK_CONSUMER_WARPS) {
            const float* row = g.proj + (i64)(p - pos0) * g.proj_width;
            norm_rope_row(row + g.off_k + kvh * D, L.v[LV_K_NORM], D, g.rope_dim, g.rope_inv_freq, g.eps, p, 1.f, buf);
            for (int d = lane; d < D; d += 32) {
                kc[(i64)p * D + d] = f32_to_f16(buf[d]);
                vc[(i64)p * D + d] = f32_to_f16(ld_cg(row + g.off_v + kvh * D + d));
            }
        }
    }
    struct Storer {  // the partials of the warp's queries
        static __device__ void run(const Globals& g, const Parsed& p, int G, int nq, const float (&o)[ATTN_MAX_QPW][8],
                                   const float (&m)[ATTN_MAX_QPW], const float (&l)[ATTN_MAX_QPW]) {
            const int lane = threadIdx.x & 31, D = g.head_dim, DL = D / 32;
#pragma unroll
            for (int jj = 0; jj < ATTN_MAX_QPW; ++jj) {
                const int qi = cwarp() + MK_CONSUMER_WARPS * jj;
                if (qi >= nq) continue;  // warp-uniform
                const float lsum = warp_sum(l[jj]);
                float* part = attn_part_at(g, p.split, qi / G, p.kv_head * G + qi % G);
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    if (e < DL) part[lane * DL + e] = lsum > 0.f ? o[jj][e] : 0.f;
                if (lane == 0) {
                    part[D] = lsum > 0.f ? m[jj] : NEG_INF;
                    part[D + 1] = lsum;
                }
            }
        }
    };
    // Eight f16 at p (16-byte aligned, shared memory) as floats.
    static __device__ __forceinline__ void f16x8_to_f32(const void* p, float (&out)[8]) {
        const uint4 w = *reinterpret_cast<const uint4*>(p);
        const u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            out[2 * e] = f16_to_f32((f16)(words[e] & 0xFFFFu));
            out[2 * e + 1] = f16_to_f32((f16)(words[e] >> 16));
        }
    }
    // The register arrays (o, m, l, sc, pr: a warp's query slots) are indexed only by unrolled loops with constant
    // bounds, the head's width DL and the warp's slot count nj entering as guards: a loop bounded by a run-time
    // value leaves an array in local memory (the first GPU runs' attention kept o there, ~50 us a key block).
    // Shared memory of one instruction: per-warp rope buffers, the staged queries, one block of 32 keys and values.
    static __device__ __forceinline__ int kpitch(int D) { return 2 * D + 16; }  // 16 bytes of padding: rows in other banks
    static __device__ __forceinline__ int smem_bytes(int D, int nq) {
        return MK_CONSUMER_WARPS * 256 * 4 + nq * D * 4 + 32 * kpitch(D) + 32 * 2 * D;
    }
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const LayerRefs& L = layer_refs(g, p.layer);
            const int rows = stage_rows(g, stage), pos0 = stage_pos0(g, stage), D = g.head_dim;
            const int G = g.num_heads / g.num_kv_heads, nq = G * rows;
            if (D > 256 || D % 32 || nq > MK_CONSUMER_WARPS * ATTN_MAX_QPW || smem_bytes(D, nq) > MK_SMEM_BYTES) {
                if (ctid() == 0) mk_fail(g, ERR_BAD_SHAPE, blockIdx.x, -1, D, nq, 0, 0);
                return;
            }
            int begin, end;
            split_range(pos0 + rows, p.split, p.num_splits, begin, end);
            float* bufs = s.scratch;                            // [8 warps][256]
            float* qs = s.scratch + MK_CONSUMER_WARPS * 256;    // [nq][D]
            store_new(g, L, p.kv_head, pos0, max(begin, pos0), end, bufs);
            for (int qi = cwarp(); qi < nq; qi += MK_CONSUMER_WARPS) {
                const int t = qi / G, h = p.kv_head * G + qi % G;
                const float* src = g.proj + (i64)t * g.proj_width + g.off_q + (i64)h * 2 * D;
                float* buf = bufs + cwarp() * 256;
                norm_rope_row(src, L.v[LV_Q_NORM], D, g.rope_dim, g.rope_inv_freq, g.eps, pos0 + t, rsqrtf((float)D), buf);
                for (int d = threadIdx.x & 31; d < D; d += 32) qs[qi * D + d] = buf[d];
            }
            float o[ATTN_MAX_QPW][8], m[ATTN_MAX_QPW], l[ATTN_MAX_QPW];
            keys(g, L, p, pos0, G, nq, begin, end, qs, reinterpret_cast<u8*>(qs + nq * D), o, m, l);
            Storer::run(g, p, G, nq, o, m, l);
        }
        // Keys and values [k0, k0 + 32) of the KV head into shared memory (kb: rows at kpitch, vb: rows of 2 D
        // bytes), by cp.async from every consumer thread at once (no registers held), so a block costs one L2
        // latency; the caller waits and syncs.
        static __device__ void stage_block(const f16* kc, const f16* vc, int k0, int nk, int D, u8* kb, u8* vb) {
            const int chunks = D / 8;  // 16 bytes each, per row
            const u32 ks = smem_u32(kb), vs = smem_u32(vb);
            for (int c = ctid(); c < nk * chunks; c += MK_CONSUMER_THREADS) {
                const int key = c / chunks, part = c % chunks;
                cp_async16(ks + key * kpitch(D) + 16 * part, kc + (i64)(k0 + key) * D + 8 * part);
                cp_async16(vs + key * 2 * D + 16 * part, vc + (i64)(k0 + key) * D + 8 * part);
            }
            cp_async_commit();
        }
        // The split's keys, 32 at a time (lane = key for the scores, lane = dims for the values), each block staged
        // in shared memory by all warps first.
        static __device__ void keys(const Globals& g, const LayerRefs& L, const Parsed& p, int pos0, int G, int nq,
                                    int begin, int end, const float* qs, u8* kb, float (&o)[ATTN_MAX_QPW][8],
                                    float (&m)[ATTN_MAX_QPW], float (&l)[ATTN_MAX_QPW]) {
            const int lane = threadIdx.x & 31, D = g.head_dim, DL = D / 32;
            const int nj = cwarp() < nq ? (nq - 1 - cwarp()) / MK_CONSUMER_WARPS + 1 : 0;  // this warp's queries
            const f16* kc = static_cast<const f16*>(L.s[LS_K]) + (i64)p.kv_head * g.capacity * D;
            const f16* vc = static_cast<const f16*>(L.s[LS_V]) + (i64)p.kv_head * g.capacity * D;
            u8* vb = kb + 32 * kpitch(D);
            int qpos[ATTN_MAX_QPW];
#pragma unroll
            for (int jj = 0; jj < ATTN_MAX_QPW; ++jj) {
                const int qi = cwarp() + MK_CONSUMER_WARPS * jj;
                qpos[jj] = qi < nq ? pos0 + qi / G : -1;  // -1: an empty slot sees no key
                m[jj] = NEG_INF;
                l[jj] = 0.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) o[jj][e] = 0.f;
            }
            for (int k0 = begin; k0 < end; k0 += 32) {
                const int key = k0 + lane, num_keys = min(32, end - k0);
                consumers_sync();  // the queries are staged, the new keys stored, the last block read by every warp
                stage_block(kc, vc, k0, num_keys, D, kb, vb);
                cp_async_wait<0>();
                consumers_sync();
                float sc[ATTN_MAX_QPW];
#pragma unroll
                for (int jj = 0; jj < ATTN_MAX_QPW; ++jj) sc[jj] = 0.f;
                if (lane < num_keys) {
                    const u8* krow = kb + lane * kpitch(D);
                    for (int d = 0; d < D; d += 8) {
                        float kf[8];
                        f16x8_to_f32(krow + 2 * d, kf);
#pragma unroll
                        for (int jj = 0; jj < ATTN_MAX_QPW; ++jj) {
                            const int qi = cwarp() + MK_CONSUMER_WARPS * jj;
                            if (jj < nj) {
                                const float4* q = reinterpret_cast<const float4*>(qs + qi * D + d);
                                const float4 qa = q[0], qb = q[1];
                                sc[jj] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                                          qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                            }
                        }
                    }
                }
                float pr[ATTN_MAX_QPW];
#pragma unroll
                for (int jj = 0; jj < ATTN_MAX_QPW; ++jj) {
                    pr[jj] = 0.f;
                    if (jj >= nj) continue;  // warp-uniform
                    const bool visible = lane < num_keys && key <= qpos[jj];
                    const float sj = visible ? sc[jj] : NEG_INF;
                    const float m_new = fmaxf(m[jj], warp_max(sj));
                    const float corr = m_new == NEG_INF ? 1.f : expf(m[jj] - m_new);
                    pr[jj] = visible ? expf(sj - m_new) : 0.f;
                    l[jj] = l[jj] * corr + pr[jj];
                    m[jj] = m_new;
#pragma unroll
                    for (int e = 0; e < 8; ++e) o[jj][e] *= corr;
                }
                for (int kk = 0; kk < num_keys; ++kk) {
                    const f16* vrow = reinterpret_cast<const f16*>(vb + kk * 2 * D) + lane * DL;
                    float v[8];
                    if (DL == 8) {  // Qwen3.8's 256-wide heads: one 16-byte read
                        f16x8_to_f32(vrow, v);
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; ++e) v[e] = e < DL ? f16_to_f32(vrow[e]) : 0.f;
                    }
#pragma unroll
                    for (int jj = 0; jj < ATTN_MAX_QPW; ++jj) {
                        if (jj >= nj) continue;  // warp-uniform
                        const float pj = __shfl_sync(FULL_MASK, pr[jj], kk);
#pragma unroll
                        for (int e = 0; e < 8; ++e) o[jj][e] += pj * v[e];  // lanes past DL add zeros
                    }
                }
            }
        }
    };
};
