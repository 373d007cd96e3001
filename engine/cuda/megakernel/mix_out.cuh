// OP_MIX_OUT: x[:, row_begin:row_end] += (attn_output or ssm_out) act_mix; each row of x has one owner, so the
// residual update needs no atomics. VM: solvers.mix_out.
#pragma once
#include "pieces.cuh"
#include "prefetch.cuh"

// x[t, r0 + r] += out[r * 8 + t] for the tile's rows (the owner of those rows is this instruction).
__device__ __forceinline__ void residual_store(float* x, int ld, int rows, int r0, int n, const float* out) {
    for (int o = ctid(); o < n * rows; o += MK_CONSUMER_THREADS) {
        const int r = o / rows, t = o % rows;
        float* dst = x + (i64)t * ld + r0 + r;
        *dst = ld_cg(dst) + out[r * 8 + t];
    }
}

struct MixOutOp {
    static constexpr int OPCODE = OP_MIX_OUT;
    static constexpr int WAITS_ON = OP_DN_RULE;  // or OP_ATTN_COMBINE in attention layers
    struct Parsed {
        int layer, row_begin, row_end, sb_begin, sb_end, piece, pieces, slot;  // instructions.py's MixOut, in order
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), row_begin(w[INST_ARGS + 1]), row_end(w[INST_ARGS + 2]),
              sb_begin(w[INST_ARGS + 3]), sb_end(w[INST_ARGS + 4]), piece(w[INST_ARGS + 5]),
              pieces(w[INST_ARGS + 6]), slot(w[INST_ARGS + 7]) {}
    };
    static __device__ const WeightRef& weight(const Globals& g, const Parsed& p) {
        const LayerRefs& L = layer_refs(g, p.layer);
        return L.w[L.w[LW_ATTN_OUTPUT].ptr ? LW_ATTN_OUTPUT : LW_SSM_OUT];
    }
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) { prefetch_rows(weight(g, p), p.row_begin, p.row_end); }
    };
    struct Primer {  // MK_MV_PRIME_NEXT
        static __device__ bool first(const Globals& g, const Parsed& p, int stage, MvFirst& f) {
            f = MvFirst{&weight(g, p), p.row_begin, p.row_end, &g.act_mix};
            return p.pieces == 1;
        }
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const int rows = stage_rows(g, stage);
            float* x = stage_x(g, stage);
            auto store = [&](int r0, int n, const float* out) { residual_store(x, g.hidden_size, rows, r0, n, out); };
            if (p.pieces > 1)
                mv_piece(g, weight(g, p), p.row_begin, p.row_end, p.sb_begin, p.sb_end, p.piece, p.pieces, p.slot,
                         g.act_mix, rows, s, store);
            else
                mv_rows(g, weight(g, p), p.row_begin, p.row_end, g.act_mix, 0, rows, s.scratch, store);
        }
    };
};
