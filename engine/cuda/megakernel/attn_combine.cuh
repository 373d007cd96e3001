// OP_ATTN_COMBINE: merge the key splits' partials of one KV head's query heads,
// out = sum_s e^(m_s - m) o_s / sum_s e^(m_s - m) l_s, times qwen35's sigmoid output gate, into act_mix.
// VM: solvers.attn_combine.
#pragma once
#include "attn_common.cuh"

struct AttnCombineOp {
    static constexpr int OPCODE = OP_ATTN_COMBINE;
    static constexpr int WAITS_ON = OP_ATTN_CORE;
    struct Parsed {
        int layer, kv_head, num_splits;  // fields, in the order of instructions.py's AttnCombine
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), kv_head(w[INST_ARGS + 1]), num_splits(w[INST_ARGS + 2]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage), D = g.head_dim, G = g.num_heads / g.num_kv_heads, lane = threadIdx.x & 31;
            const int width = G * D;
            float* vals = s.scratch;  // [rows][G * D]
            if (rows * width * 4 > MK_SMEM_BYTES) {
                if (ctid() == 0) mk_fail(g, ERR_BAD_SHAPE, blockIdx.x, -1, rows, width, 1, 0);
                return;
            }
            for (int qi = cwarp(); qi < G * rows; qi += MK_CONSUMER_WARPS) {
                const int t = qi / G, j = qi % G, h = p.kv_head * G + j;
                float mx = NEG_INF;
                for (int sp = 0; sp < p.num_splits; ++sp) mx = fmaxf(mx, ld_cg(attn_part_at(g, sp, t, h) + D));
                float den = 0.f;
                for (int sp = 0; sp < p.num_splits; ++sp) {
                    const float* part = attn_part_at(g, sp, t, h);
                    const float ms = ld_cg(part + D);
                    den += ms == NEG_INF ? 0.f : expf(ms - mx) * ld_cg(part + D + 1);
                }
                const float* gate = g.proj + (i64)t * g.proj_width + g.off_q + (i64)h * 2 * D + D;
                for (int d = lane; d < D; d += 32) {
                    float num = 0.f;
                    for (int sp = 0; sp < p.num_splits; ++sp) {
                        const float* part = attn_part_at(g, sp, t, h);
                        const float ms = ld_cg(part + D);
                        if (ms != NEG_INF) num += expf(ms - mx) * ld_cg(part + d);
                    }
                    vals[t * width + j * D + d] = num / den * sigmoid_ref(ld_cg(gate + d));
                }
            }
            consumers_sync();
            act_store(g.act_mix, p.kv_head * width, width, rows, vals, width);
        }
    };
};
