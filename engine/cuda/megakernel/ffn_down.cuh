// OP_FFN_DOWN: x[:, row_begin:row_end] += ffn_down act_ffn. VM: solvers.ffn_down.
#pragma once
#include "pieces.cuh"
#include "prefetch.cuh"
#include "mix_out.cuh"

struct FfnDownOp {
    static constexpr int OPCODE = OP_FFN_DOWN;
    static constexpr int WAITS_ON = OP_FFN_UP;
    struct Parsed {
        int layer, row_begin, row_end, sb_begin, sb_end, piece, pieces, slot;  // instructions.py's FfnDown, in order
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), row_begin(w[INST_ARGS + 1]), row_end(w[INST_ARGS + 2]),
              sb_begin(w[INST_ARGS + 3]), sb_end(w[INST_ARGS + 4]), piece(w[INST_ARGS + 5]),
              pieces(w[INST_ARGS + 6]), slot(w[INST_ARGS + 7]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {
            prefetch_rows(layer_refs(g, p.layer).w[LW_FFN_DOWN], p.row_begin, p.row_end);
        }
    };
    struct Primer {  // MK_MV_PRIME_NEXT
        static __device__ bool first(const Globals& g, const Parsed& p, int stage, MvFirst& f) {
            f = MvFirst{&layer_refs(g, p.layer).w[LW_FFN_DOWN], p.row_begin, p.row_end, &g.act_ffn};
            return p.pieces == 1;
        }
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage);
            float* x = stage_x(g, stage);
            const WeightRef& w = layer_refs(g, p.layer).w[LW_FFN_DOWN];
            auto store = [&](int r0, int n, const float* out) { residual_store(x, g.hidden_size, rows, r0, n, out); };
            if (p.pieces > 1)
                mv_piece(g, w, p.row_begin, p.row_end, p.sb_begin, p.sb_end, p.piece, p.pieces, p.slot, g.act_ffn,
                         rows, s, store);
            else
                mv_rows(g, w, p.row_begin, p.row_end, g.act_ffn, 0, rows, s.scratch, store);
        }
    };
};
