// OP_DN_COMMIT: the commit alone (the "commit" program, run before a checkpoint is compared or the state handed to
// another path): the last pass's first CTL_COMMIT_N rows applied to value heads [head_begin, head_end) of the
// recurrent state, and conv channels [chan_begin, chan_end) of the window shifted to the committed rows.
// VM: solvers.dn_commit.
#pragma once
#include "dn_common.cuh"

struct DnCommitOp {
    static constexpr int OPCODE = OP_DN_COMMIT;
    static constexpr int WAITS_ON = OP_NOOP;
    struct Parsed {
        int layer, head_begin, head_end, chan_begin, chan_end;  // fields, in the order of instructions.py's DnCommit
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), head_begin(w[INST_ARGS + 1]), head_end(w[INST_ARGS + 2]),
              chan_begin(w[INST_ARGS + 3]), chan_end(w[INST_ARGS + 4]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        template <int KL, int COLS>
        static __device__ void head(const Globals& g, const LayerRefs& L, int h, int n_prev) {
            DnHead<KL, COLS> st;
            float* ssm = static_cast<float*>(L.s[LS_SSM]);
            st.load(ssm, h);
            dn_replay<KL, COLS>(g, L, h, n_prev, st);
            st.store(ssm, h);
        }
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const LayerRefs& L = layer_refs(g, p.layer);
            const int n_prev = ctl_get(g, CTL_COMMIT_N);
            if (n_prev == 0) return;
            for (int h = p.head_begin; h < p.head_end; ++h)
                dn_dispatch(g, [&](auto tag) {
                    using Head = decltype(tag);
                    head<Head::ROWS_PER_LANE, Head::COLS_PER_WARP>(g, L, h, n_prev);
                });
            float* window = static_cast<float*>(L.s[LS_WINDOW]);
            const int K = g.conv_kernel, C = g.conv_dim;
            for (int c = p.chan_begin + ctid(); c < p.chan_end; c += MK_CONSUMER_THREADS) {
                float hist[8];
                for (int j = 0; j < K - 1; ++j) hist[j] = ld_cg(window + (i64)(n_prev + j) * C + c);
                for (int j = 0; j < K - 1; ++j) window[(i64)j * C + c] = hist[j];
            }
        }
    };
};
