// OP_HEAD_NORM: act_h = hidden = RMSNorm(x) * output_norm for the trunk; in the MTP stages mtp_hidden from mtp_x
// with the MTP block's shared_head_norm. VM: solvers.head_norm.
#pragma once
#include "norm_act.cuh"

struct HeadNormOp {
    static constexpr int OPCODE = OP_HEAD_NORM;
    static constexpr int WAITS_ON = OP_FFN_DOWN;
    struct Parsed {
        int sb_begin, sb_end;  // fields, in the order of instructions.py's HeadNorm
        __device__ explicit Parsed(const i32* w) : sb_begin(w[INST_ARGS + 0]), sb_end(w[INST_ARGS + 1]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const bool mtp = stage_is_mtp(g, stage);
            const float* weight = mtp ? layer_refs(g, g.num_layers).v[LV_HEAD_NORM] : g.output_norm;
            // the MTP pass's act: OP_DRAFT_HEAD reads its last row alone, on the one-row int8 path
            norm_into_act(g, stage, weight, p.sb_begin, p.sb_end, mtp ? g.mtp_hidden : g.hidden, s, mtp);
        }
    };
};
