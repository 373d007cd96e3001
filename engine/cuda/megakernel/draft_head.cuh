// OP_DRAFT_HEAD: draft logits of the MTP pass's last row over rows [row_begin, row_end) of the draft vocabulary
// (the first draft_vocab rows of the MTP output head), and their maximum and token into partial `part`.
// VM: solvers.draft_head.
#pragma once
#include "prefetch.cuh"
#include "penalties.cuh"

struct DraftHeadOp {
    static constexpr int OPCODE = OP_DRAFT_HEAD;
    static constexpr int WAITS_ON = OP_HEAD_NORM;
    struct Parsed {
        int row_begin, row_end, part;  // fields, in the order of instructions.py's DraftHead
        __device__ explicit Parsed(const i32* w)
            : row_begin(w[INST_ARGS + 0]), row_end(w[INST_ARGS + 1]), part(w[INST_ARGS + 2]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {
            prefetch_rows(g.mtp_output, p.row_begin, p.row_end);
        }
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            if (!stage_drafts(g, stage)) return;
            const int last = stage_rows(g, stage) - 1;
            float bv = NEG_INF;
            int bi = 0x7fffffff;
            mv_rows(g, g.mtp_output, p.row_begin, p.row_end, g.act_h, last, 1, s.scratch,
                    [&](int r0, int n, const float* out) {
                        for (int r = ctid(); r < n; r += MK_CONSUMER_THREADS) g.draft_logits[r0 + r] = out[r * 8];
                        consumers_argmax(out, n, 1, r0, s.scratch + MV_OUT_FLOATS, bv, bi);
                    });
            if (ctid() == 0) {
                g.draft_part_v[p.part] = bv;
                g.draft_part_i[p.part] = bi;
            }
        }
    };
};
