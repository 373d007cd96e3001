// OP_FINISH: what the next launch needs, by mode: the trunk hidden of the last committed row (MODE_CYCLE,
// MODE_PREFILL, MODE_CATCHUP), the penalty counts of the emitted tokens (MODE_CYCLE), and the next pass's tokens:
// the pending token and the drafts just made (MODE_CYCLE, MODE_DRAFT). VM: solvers.finish.
#pragma once
#include "mk_common.cuh"

struct FinishOp {
    static constexpr int OPCODE = OP_FINISH;
    static constexpr int WAITS_ON = OP_DRAFT_PICK;
    struct Parsed {
        __device__ explicit Parsed(const i32* w) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int mode = ctl_get(g, CTL_MODE);
            if (mode == MODE_CYCLE || mode == MODE_PREFILL || mode == MODE_CATCHUP) {
                const float* row = g.hidden + (i64)(ctl_get(g, CTL_COMMIT_N) - 1) * g.hidden_size;
                for (int k = ctid(); k < g.hidden_size; k += MK_CONSUMER_THREADS) g.last_hidden[k] = ld_cg(row + k);
            }
            if (ctid() != 0) return;
            const int drafts = (mode == MODE_CYCLE || mode == MODE_DRAFT) && g.has_mtp ? ctl_get(g, CTL_DRAFT_NEXT) : 0;
            if (mode == MODE_CYCLE) {
                const int n = ctl_get(g, CTL_NUM_EMITTED);
                for (int t = 0; t < n; ++t) {
                    const int token = ctl_get(g, CTL_EMITTED + t);
                    g.counts[token] += 1;
                    g.seen[token] = 1;
                }
                g.ctl[CTL_IDS] = ctl_get(g, CTL_EMITTED + n - 1);
            } else if (mode == MODE_DRAFT) {
                g.ctl[CTL_IDS] = ctl_get(g, CTL_MTP_IDS);
            }
            for (int j = 0; j < drafts; ++j) g.ctl[CTL_IDS + 1 + j] = ctl_get(g, CTL_DRAFTS + j);
            g.ctl[CTL_DRAFTS_READY] = drafts;
        }
    };
};
