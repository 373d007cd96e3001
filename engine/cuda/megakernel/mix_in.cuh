// OP_MIX_IN: rows [row_begin, row_end) of one mixer input matrix (a LW_* slot) times act_h (at one row the normed x
// it forms itself: norm_own.cuh norm_into_own). Attention q/k/v and
// DeltaNet gate/alpha/beta land in proj at the matrix's column offset; DeltaNet attn_qkv rows (conv channels) go
// through the causal conv: the window's committed rows (the last pass's accepted prefix applied first) and this
// pass's rows, SiLU, into conv_out; the window then holds the committed rows and this pass's inputs.
// VM: solvers.mix_in / conv_rows.
#pragma once
#include "norm_own.cuh"
#include "prefetch.cuh"

struct MixInOp {
    static constexpr int OPCODE = OP_MIX_IN;
    static constexpr int WAITS_ON = OP_ATTN_NORM;
    struct Parsed {
        int layer, matrix, row_begin, row_end;  // fields, in the order of instructions.py's MixIn
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), matrix(w[INST_ARGS + 1]), row_begin(w[INST_ARGS + 2]), row_end(w[INST_ARGS + 3]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {
            prefetch_rows(layer_refs(g, p.layer).w[p.matrix], p.row_begin, p.row_end);
        }
    };
    struct Primer {  // MK_MV_PRIME_NEXT
        static __device__ bool first(const Globals& g, const Parsed& p, int stage, MvFirst& f) {
            f = MvFirst{&layer_refs(g, p.layer).w[p.matrix], p.row_begin, p.row_end,
                        norm_in_matmul(g, stage) ? &g.act_own : &g.act_h};
            return true;
        }
    };
    struct Storer {
        static __device__ int proj_offset(const Globals& g, int matrix) {
            switch (matrix) {
                case LW_ATTN_Q: return g.off_q;
                case LW_ATTN_K: return g.off_k;
                case LW_ATTN_V: return g.off_v;
                case LW_ATTN_GATE: return g.off_gate;
                case LW_SSM_ALPHA: return g.off_alpha;
                default: return g.off_beta;
            }
        }
        // conv channel c for the pass's rows: in[t] is its new input of row t. The channel's sequence is [the
        // window's K - 1 committed rows | this pass's inputs]; win holds its last 7 values, newest last, and
        // shifts by one a row, so every index into it is a constant (an array indexed by a run-time value would
        // live in local memory). K <= 8 (run() checks).
        static __device__ void conv(const Globals& g, const LayerRefs& L, int rows, int c, const float* in) {
            const int K = g.conv_kernel, C = g.conv_dim, n_prev = ctl_get(g, CTL_COMMIT_N);
            float* window = static_cast<float*>(L.s[LS_WINDOW]);
            const float* wc = L.v[LV_SSM_CONV1D] + (i64)c * K;
            float win[7];
#pragma unroll
            for (int p = 0; p < 7; ++p) {  // committed row i = p - 8 + K at slot p, right-aligned
                const int i = p - 8 + K;
                win[p] = i >= 0 ? ld_cg(window + (i64)(n_prev + i) * C + c) : 0.f;
            }
#pragma unroll
            for (int p = 0; p < 7; ++p) {  // the commit: those rows move to the window's start
                const int i = p - 8 + K;
                if (i >= 0) window[(i64)i * C + c] = win[p];
            }
            for (int t = 0; t < rows; ++t) {
                const float x = in[t];
                float acc = 0.f;  // ops.causal_conv1d's order: tap j ascending, the value K - 1 - j rows back
#pragma unroll
                for (int back = 7; back >= 0; --back)
                    if (back < K) acc += (back == 0 ? x : win[7 - back]) * wc[K - 1 - back];
                g.conv_out[(i64)t * C + c] = silu_ref(acc);
                window[(i64)(K - 1 + t) * C + c] = x;
#pragma unroll
                for (int p = 0; p < 6; ++p) win[p] = win[p + 1];
                win[6] = x;
            }
        }
        static __device__ void run(const Globals& g, const Parsed& p, int rows, int r0, int n, const float* out) {
            const LayerRefs& L = layer_refs(g, p.layer);
            if (p.matrix == LW_ATTN_QKV) {
                if (g.conv_kernel > 8) {  // conv's register window holds 7 rows back
                    if (ctid() == 0) mk_fail(g, ERR_BAD_SHAPE, blockIdx.x, -1, g.conv_kernel, 8, 0, 0);
                    return;
                }
                for (int c = ctid(); c < n; c += MK_CONSUMER_THREADS) conv(g, L, rows, r0 + c, out + c * 8);
                return;
            }
            const int off = proj_offset(g, p.matrix);
            for (int o = ctid(); o < n * rows; o += MK_CONSUMER_THREADS) {
                const int r = o / rows, t = o % rows;
                g.proj[(i64)t * g.proj_width + off + r0 + r] = out[r * 8 + t];
            }
        }
    };
    struct Consumer {
        static __device__ void product(const Globals& g, const Parsed& p, const WeightRef& w, int rows,
                                       const ActRef& a, Smem& s) {
            mv_rows(g, w, p.row_begin, p.row_end, a, 0, rows, s.scratch,
                    [&](int r0, int n, const float* out) { Storer::run(g, p, rows, r0, n, out); });
        }
        // act_h by reference where it is the input: a local copy (58e31cf) put 12 more stack stores in this
        // consumer's SASS, the likely cause of MIX_IN's +1.4 us an instruction there (round 8; SASS now as 6f462a1's)
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage);
            const LayerRefs& L = layer_refs(g, p.layer);
            const WeightRef& w = L.w[p.matrix];
            if (norm_in_matmul(g, stage)) {
                const ActRef own = norm_into_own(g, stage, L.v[LV_ATTN_NORM], levels_from_smem(g, w, p.row_begin), s);
                product(g, p, w, rows, own, s);
            } else {
                product(g, p, w, rows, g.act_h, s);
            }
        }
    };
};
