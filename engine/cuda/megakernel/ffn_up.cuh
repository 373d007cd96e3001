// OP_FFN_UP: act_ffn[:, row_begin:row_end] = silu(ffn_gate act_h) * ffn_up act_h, 32 FFN indices at a time (a
// sub-block of the act layout, whose sum must come from one instruction). VM: solvers.ffn_up.
#pragma once
#include "matvec.cuh"

struct FfnUpOp {
    static constexpr int OPCODE = OP_FFN_UP;
    static constexpr int WAITS_ON = OP_FFN_NORM;
    struct Parsed {
        int layer, row_begin, row_end;  // fields, in the order of instructions.py's FfnUp
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), row_begin(w[INST_ARGS + 1]), row_end(w[INST_ARGS + 2]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {
            const LayerRefs& L = layer_refs(g, p.layer);
            prefetch_rows(L.w[LW_FFN_GATE], p.row_begin, p.row_end);
            prefetch_rows(L.w[LW_FFN_UP], p.row_begin, p.row_end);
        }
    };
    struct Storer {  // vals[t][j] = silu(gate) * up for the chunk, then into the act layout
        static __device__ void run(const Globals& g, int rows, int f0, int n, const float* gate, float* vals) {
            for (int o = ctid(); o < rows * 32; o += MK_CONSUMER_THREADS) {
                const int t = o / 32, j = o % 32;
                if (j < n) vals[t * 32 + j] *= silu_ref(gate[t * 32 + j]);  // vals held up
            }
            consumers_sync();
            act_store(g.act_ffn, f0, n, rows, vals, 32);
        }
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const LayerRefs& L = layer_refs(g, p.layer);
            const int rows = stage_rows(g, stage);
            float* gate = s.scratch + 128 + MK_CONSUMER_WARPS * 128;  // [rows][32]
            float* up = gate + MK_MAX_ROWS * 32;                     // [rows][32]
            for (int f0 = p.row_begin; f0 < p.row_end; f0 += 32) {
                const int f1 = min(f0 + 32, p.row_end);
                for (int half = 0; half < 2; ++half) {
                    float* dst = half ? up : gate;
                    mv_rows(g, L.w[half ? LW_FFN_UP : LW_FFN_GATE], f0, f1, g.act_h, 0, rows, s.scratch,
                            [&](int r0, int n, const float* out) {
                                for (int o = ctid(); o < n * rows; o += MK_CONSUMER_THREADS)
                                    dst[(o % rows) * 32 + r0 - f0 + o / rows] = out[(o / rows) * 8 + o % rows];
                            });
                }
                Storer::run(g, rows, f0, f1 - f0, gate, up);
                consumers_sync();
            }
        }
    };
};
