// OP_EMBED: x[t, col_begin:col_end] = token_embd[ids[t], col_begin:col_end] for the pass's rows.
// VM: solvers.embed. Waits on nothing: it is the first group of a trunk pass.
#pragma once
#include "dequant.cuh"

struct EmbedOp {
    static constexpr int OPCODE = OP_EMBED;
    static constexpr int WAITS_ON = OP_NOOP;
    struct Parsed {
        int col_begin, col_end;  // fields, in the order of instructions.py's Embed
        __device__ explicit Parsed(const i32* w) : col_begin(w[INST_ARGS + 0]), col_end(w[INST_ARGS + 1]) {}
    };
    struct Loader {  // the rows depend on the ids: nothing to prefetch ahead
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage);
            for (int t = 0; t < rows; ++t) {
                const int token = ctl_get(g, CTL_IDS + t);
                weight_row(g, g.token_embd, token, p.col_begin, p.col_end, g.x + (i64)t * g.hidden_size + p.col_begin,
                           MK_CONSUMER_THREADS, ctid());
            }
        }
    };
};
