// OP_ATTN_COMBINE: merge the key splits' partials of query heads [head_begin, head_end) of one KV head's group,
// out = sum_s e^(m_s - m) o_s / sum_s e^(m_s - m) l_s, times qwen35's sigmoid output gate, into act_mix.
// VM: solvers.attn_combine.
#pragma once
#include "attn_common.cuh"

struct AttnCombineOp {
    static constexpr int OPCODE = OP_ATTN_COMBINE;
    static constexpr int WAITS_ON = OP_ATTN_CORE;
    struct Parsed {
        int layer, kv_head, num_splits, head_begin, head_end;  // fields, in the order of instructions.py's AttnCombine
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), kv_head(w[INST_ARGS + 1]), num_splits(w[INST_ARGS + 2]),
              head_begin(w[INST_ARGS + 3]), head_end(w[INST_ARGS + 4]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage), D = g.head_dim, lane = threadIdx.x & 31;
            const int G = p.head_end - p.head_begin, h0 = p.kv_head * (g.num_heads / g.num_kv_heads) + p.head_begin;
            const int width = G * D, S = p.num_splits, nq = G * rows;
            float* vals = s.scratch;             // [rows][G * D]
            float* wts = vals + rows * width;    // [nq][S]: e^(m_s - m) / sum_s e^(m_s - m) l_s
            if ((rows * width + nq * S) * 4 > MK_SMEM_BYTES) {
                if (ctid() == 0) mk_fail(g, ERR_BAD_SHAPE, blockIdx.x, -1, rows, width, S, 0);
                return;
            }
            // Each query's split weights: a warp per query, a lane per split.
            for (int qi = cwarp(); qi < nq; qi += MK_CONSUMER_WARPS) {
                const int t = qi / G, h = h0 + qi % G;
                float mx = NEG_INF;
                for (int sp = lane; sp < S; sp += 32) mx = fmaxf(mx, ld_cg(attn_part_at(g, sp, t, h) + D));
                mx = warp_max(mx);
                float den = 0.f;
                for (int sp = lane; sp < S; sp += 32) {
                    const float* part = attn_part_at(g, sp, t, h);
                    const float ms = ld_cg(part + D);
                    const float w = ms == NEG_INF ? 0.f : expf(ms - mx);
                    wts[qi * S + sp] = w;
                    den += w * ld_cg(part + D + 1);
                }
                den = warp_sum(den);
                __syncwarp();
                for (int sp = lane; sp < S; sp += 32) wts[qi * S + sp] /= den;
            }
            consumers_sync();
            // Every output value: its query's weighted sum over the splits (independent loads, 4 at a time).
            for (int o = ctid(); o < rows * width; o += MK_CONSUMER_THREADS) {
                const int t = o / width, j = (o % width) / D, d = o % D, qi = t * G + j, h = h0 + j;
                const float* w = wts + qi * S;
                float num = 0.f;
#pragma unroll 4
                for (int sp = 0; sp < S; ++sp)
                    if (w[sp] != 0.f) num += w[sp] * ld_cg(attn_part_at(g, sp, t, h) + d);
                vals[o] = num * sigmoid_ref(ld_cg(g.proj + (i64)t * g.proj_width + g.off_q + (i64)h * 2 * D + D + d));
            }
            consumers_sync();
            ActRef mix = g.act_mix;  // this layer's written width: act8_fill closes superblocks inside it
            mix.width = g.num_heads * D;
            act_store(mix, h0 * D, width, rows, vals, width);
        }
    };
};
