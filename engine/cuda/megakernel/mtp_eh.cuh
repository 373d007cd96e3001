// OP_MTP_EH: mtp_x[:, row_begin:row_end] = eh_proj act_eh (the MTP block's input projection).
// VM: solvers.mtp_eh.
#pragma once
#include "prefetch.cuh"

struct MtpEhOp {
    static constexpr int OPCODE = OP_MTP_EH;
    static constexpr int WAITS_ON = OP_MTP_IN;
    struct Parsed {
        int row_begin, row_end;  // fields, in the order of instructions.py's MtpEh
        __device__ explicit Parsed(const i32* w) : row_begin(w[INST_ARGS + 0]), row_end(w[INST_ARGS + 1]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {
            prefetch_rows(layer_refs(g, g.num_layers).w[LW_EH_PROJ], p.row_begin, p.row_end);
        }
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage);
            mv_rows(g, layer_refs(g, g.num_layers).w[LW_EH_PROJ], p.row_begin, p.row_end, g.act_eh, 0, rows, s.scratch,
                    [&](int r0, int n, const float* out) {
                        for (int o = ctid(); o < n * rows; o += MK_CONSUMER_THREADS) {
                            const int r = o / rows, t = o % rows;
                            g.mtp_x[(i64)t * g.hidden_size + r0 + r] = out[r * 8 + t];
                        }
                    });
        }
    };
};
