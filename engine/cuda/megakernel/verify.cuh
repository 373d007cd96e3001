// OP_VERIFY: the acceptance of a cycle's drafts on the device. Greedy: each row's penalised argmax (reduced from
// the lm_head partials), drafts kept while they equal it; sampling: exact speculative sampling row by row
// (sampler.cuh). Writes the emitted tokens and sets up the commit (CTL_COMMIT_N) and the MTP pass (its rows: the
// committed tokens and the new pending one). MODE_PREFILL commits every row and emits nothing.
// VM: solvers.verify / _accept.
#pragma once
#include "sampler.cuh"

struct VerifyOp {
    static constexpr int OPCODE = OP_VERIFY;
    static constexpr int WAITS_ON = OP_LM_HEAD;
    struct Parsed {
        __device__ explicit Parsed(const i32* w) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    // Row t's greedy token from the partials (a warp).
    static __device__ int greedy_token(const Globals& g, int t) {
        const int lane = threadIdx.x & 31;
        float bv = NEG_INF;
        int bi = 0x7fffffff;
        for (int i = lane; i < g.num_lm_parts; i += 32)
            argmax_merge(bv, bi, ld_cg(g.lm_part_v + (i64)t * g.num_lm_parts + i),
                         ld_cg(g.lm_part_i + (i64)t * g.num_lm_parts + i));
        for (int o = 16; o > 0; o >>= 1)
            argmax_merge(bv, bi, __shfl_xor_sync(FULL_MASK, bv, o), __shfl_xor_sync(FULL_MASK, bi, o));
        return bi;
    }
    struct Storer {
        static __device__ void run(const Globals& g, int rows, const int* emitted, int n) {
            if (ctid() != 0) return;
            const int start = ctl_get(g, CTL_START);
            if (ctl_get(g, CTL_MODE) == MODE_PREFILL) {
                g.ctl[CTL_COMMIT_N] = rows;
                g.ctl[CTL_MTP_ROWS] = rows;
                g.ctl[CTL_NUM_EMITTED] = 0;
                for (int t = 0; t < rows; ++t) g.ctl[CTL_MTP_IDS + t] = ctl_get(g, CTL_IDS + t);
            } else {
                g.ctl[CTL_COMMIT_N] = n;
                g.ctl[CTL_NUM_EMITTED] = n;
                g.ctl[CTL_MTP_ROWS] = n + 1;
                for (int t = 0; t < n; ++t) {
                    g.ctl[CTL_EMITTED + t] = emitted[t];
                    g.ctl[CTL_MTP_IDS + t] = ctl_get(g, CTL_IDS + t);
                }
                g.ctl[CTL_MTP_IDS + n] = emitted[n - 1];
            }
            g.ctl[CTL_MTP_POS] = start;
        }
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage), start = ctl_get(g, CTL_START);
            int* tokens = reinterpret_cast<int*>(s.scratch);  // [MK_MAX_ROWS] greedy tokens, then emitted
            int* emitted = tokens + MK_MAX_ROWS;
            float* work = s.scratch + 2 * MK_MAX_ROWS;
            int n = 0;
            if (ctl_get(g, CTL_MODE) != MODE_PREFILL) {
                const bool greedy = ctl_get(g, CTL_GREEDY) != 0;
                if (greedy) {
                    for (int t = cwarp(); t < rows; t += MK_CONSUMER_WARPS) {
                        const int token = greedy_token(g, t);
                        if ((threadIdx.x & 31) == 0) tokens[t] = token;
                    }
                    consumers_sync();
                }
                int clipped_rows = 0;
                for (int t = 0; t < rows; ++t) {
                    const int draft = t + 1 < rows ? ctl_get(g, CTL_IDS + t + 1) : -1;
                    bool kept, clipped = false;
                    int token;
                    if (greedy) {
                        token = tokens[t];
                        kept = token == draft;
                    } else {
                        token = sample_row(g, t, draft, start + t + 1, kept, clipped, work + 32);
                    }
                    clipped_rows += clipped;
                    if (ctid() == 0) emitted[n] = token;
                    ++n;
                    if (!kept) break;
                }
                if (ctid() == 0 && clipped_rows) atomicAdd(g.ctl + CTL_SAMPLE_CLIPPED, clipped_rows);
                consumers_sync();
            }
            Storer::run(g, rows, emitted, n);
        }
    };
};
