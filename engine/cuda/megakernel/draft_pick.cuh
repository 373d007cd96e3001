// OP_DRAFT_PICK: this MTP step's draft token, the argmax over the draft head's partials, into CTL_DRAFTS + step.
// VM: solvers.draft_pick.
#pragma once
#include "penalties.cuh"

struct DraftPickOp {
    static constexpr int OPCODE = OP_DRAFT_PICK;
    static constexpr int WAITS_ON = OP_DRAFT_HEAD;
    struct Parsed {
        __device__ explicit Parsed(const i32* w) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            if (!stage_drafts(g, stage) || cwarp() != 0) return;
            const int lane = threadIdx.x & 31;
            float bv = NEG_INF;
            int bi = 0x7fffffff;
            for (int i = lane; i < g.num_draft_parts; i += 32)
                argmax_merge(bv, bi, ld_cg(g.draft_part_v + i), ld_cg(g.draft_part_i + i));
            for (int o = 16; o > 0; o >>= 1)
                argmax_merge(bv, bi, __shfl_xor_sync(FULL_MASK, bv, o), __shfl_xor_sync(FULL_MASK, bi, o));
            if (lane == 0) g.ctl[CTL_DRAFTS + mtp_step(g, stage)] = bi;
        }
    };
};
