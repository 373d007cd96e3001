// OP_LM_HEAD: logits[:, row_begin:row_end] = output act_h (raw, what the host may read), and per row the
// penalised maximum over these columns and its token into partial `part` (VERIFY reduces them).
// VM: solvers.lm_head.
#pragma once
#include "prefetch.cuh"
#include "penalties.cuh"

struct LmHeadOp {
    static constexpr int OPCODE = OP_LM_HEAD;
    static constexpr int WAITS_ON = OP_HEAD_NORM;
    struct Parsed {
        int row_begin, row_end, part;  // fields, in the order of instructions.py's LmHead
        __device__ explicit Parsed(const i32* w)
            : row_begin(w[INST_ARGS + 0]), row_end(w[INST_ARGS + 1]), part(w[INST_ARGS + 2]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) { prefetch_rows(g.output, p.row_begin, p.row_end); }
    };
    struct Primer {  // MK_MV_PRIME_NEXT
        static __device__ bool first(const Globals& g, const Parsed& p, int stage, MvFirst& f) {
            f = MvFirst{&g.output, p.row_begin, p.row_end, &g.act_h};
            return true;
        }
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage);
            const bool keeper = ctid() < rows;  // thread t keeps row t's running maximum
            const bool plain = ctl_get(g, CTL_PENALTIES) == 0;  // every row's maximum is the raw logits'
            Penalties pen;
            if (keeper && !plain) pen = Penalties::for_row(g, ctid());
            float bv = NEG_INF;
            int bi = 0x7fffffff;
            mv_rows(g, g.output, p.row_begin, p.row_end, g.act_h, 0, rows, s.scratch,
                    [&](int r0, int n, const float* out) {
                        for (int o = ctid(); o < n * rows; o += MK_CONSUMER_THREADS) {
                            const int r = o / rows, t = o % rows;
                            g.logits[(i64)t * g.vocab + r0 + r] = out[r * 8 + t];
                        }
                        if (plain)  // the matmul's partials (after out) are free once out is folded
                            consumers_argmax(out, n, rows, r0, s.scratch + MV_OUT_FLOATS, bv, bi);
                        else if (keeper)
                            for (int r = 0; r < n; ++r)
                                argmax_merge(bv, bi, pen.apply(g, r0 + r, out[r * 8 + ctid()]), r0 + r);
                    });
            if (keeper) {
                g.lm_part_v[(i64)ctid() * g.num_lm_parts + p.part] = bv;
                g.lm_part_i[(i64)ctid() * g.num_lm_parts + p.part] = bi;
            }
        }
    };
};
