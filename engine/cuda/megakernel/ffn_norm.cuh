// OP_FFN_NORM: act_h superblocks [sb_begin, sb_end) = RMSNorm(x) * post_attention_norm (the FFN's input). VM: solvers.ffn_norm.
#pragma once
#include "norm_act.cuh"
#include "norm_own.cuh"

struct FfnNormOp {
    static constexpr int OPCODE = OP_FFN_NORM;
    static constexpr int WAITS_ON = OP_MIX_OUT;
    struct Parsed {
        int layer, sb_begin, sb_end;  // fields, in the order of instructions.py
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), sb_begin(w[INST_ARGS + 1]), sb_end(w[INST_ARGS + 2]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            if (norm_in_matmul(g, stage)) return;  // at one row its matmuls norm x themselves
            norm_into_act(g, stage, layer_refs(g, p.layer).v[LV_POST_NORM], p.sb_begin, p.sb_end, nullptr, s);
        }
    };
};
