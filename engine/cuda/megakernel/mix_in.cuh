// OP_MIX_IN: rows [row_begin, row_end) of one mixer input matrix (a LW_* slot) times act_h. Attention q/k/v and
// DeltaNet gate/alpha/beta land in proj at the matrix's column offset; DeltaNet attn_qkv rows (conv channels) go
// through the causal conv: the window's committed rows (the last pass's accepted prefix applied first) and this
// pass's rows, SiLU, into conv_out; the window then holds the committed rows and this pass's inputs.
// VM: solvers.mix_in / conv_rows.
#pragma once
#include "matvec.cuh"

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
        // conv channel c = r0 + r for the pass's rows: out[r * 8 + t] is its new input of row t
        static __device__ void conv(const Globals& g, const LayerRefs& L, int rows, int c, const float* in) {
            const int K = g.conv_kernel, C = g.conv_dim, n_prev = ctl_get(g, CTL_COMMIT_N);
            float* window = static_cast<float*>(L.s[LS_WINDOW]);
            const float* wc = L.v[LV_SSM_CONV1D] + (i64)c * K;
            float hist[8];
            for (int j = 0; j < K - 1; ++j) hist[j] = ld_cg(window + (i64)(n_prev + j) * C + c);
            for (int t = 0; t < rows; ++t) {
                float acc = 0.f;  // ops.causal_conv1d's order: window row t + j times tap j, j ascending
                for (int j = 0; j < K; ++j) acc += (t + j < K - 1 ? hist[t + j] : in[t + j - (K - 1)]) * wc[j];
                g.conv_out[(i64)t * C + c] = silu_ref(acc);
            }
            for (int j = 0; j < K - 1; ++j) window[(i64)j * C + c] = hist[j];
            for (int t = 0; t < rows; ++t) window[(i64)(K - 1 + t) * C + c] = in[t];
        }
        static __device__ void run(const Globals& g, const Parsed& p, int rows, int r0, int n, const float* out) {
            const LayerRefs& L = layer_refs(g, p.layer);
            if (p.matrix == LW_ATTN_QKV) {
                if (ctid() < n) {
                    float in[MK_MAX_ROWS];
                    for (int t = 0; t < rows; ++t) in[t] = out[ctid() * 8 + t];
                    conv(g, L, rows, r0 + ctid(), in);
                }
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
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage);
            mv_rows(g, layer_refs(g, p.layer).w[p.matrix], p.row_begin, p.row_end, g.act_h, 0, rows, s.scratch,
                    [&](int r0, int n, const float* out) { Storer::run(g, p, rows, r0, n, out); });
        }
    };
};
