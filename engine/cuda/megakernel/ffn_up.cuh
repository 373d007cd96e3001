// OP_FFN_UP: act_ffn[:, row_begin:row_end] = silu(ffn_gate act_h) * ffn_up act_h (at one row act_h is the normed x
// it forms itself: norm_own.cuh norm_into_own), FFN_UP_CHUNK FFN indices at a
// time: whole 32-wide sub-blocks of the act layout (a sub-block's sum must come from one instruction, or from the
// last piece of a split unit: run_piece), one matmul batch of MV_BATCH tiles of gate, then of up. VM:
// solvers.ffn_up.
#pragma once
#include "norm_own.cuh"
#include "pieces.cuh"
#include "prefetch.cuh"

#define FFN_UP_CHUNK (MK_TILE_ROWS * MV_BATCH)
static_assert(FFN_UP_CHUNK % 32 == 0 && 2 * MK_MAX_ROWS * FFN_UP_CHUNK <= MK_OP_FLOATS,
              "gate and up fill the ops' buffers below the matmul rings");

struct FfnUpOp {
    static constexpr int OPCODE = OP_FFN_UP;
    static constexpr int WAITS_ON = OP_FFN_NORM;
    struct Parsed {
        int layer, row_begin, row_end, sb_begin, sb_end, piece, pieces, slot;  // instructions.py's FfnUp, in order
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), row_begin(w[INST_ARGS + 1]), row_end(w[INST_ARGS + 2]),
              sb_begin(w[INST_ARGS + 3]), sb_end(w[INST_ARGS + 4]), piece(w[INST_ARGS + 5]),
              pieces(w[INST_ARGS + 6]), slot(w[INST_ARGS + 7]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {
            const LayerRefs& L = layer_refs(g, p.layer);
            prefetch_rows(L.w[LW_FFN_GATE], p.row_begin, p.row_end);
            prefetch_rows(L.w[LW_FFN_UP], p.row_begin, p.row_end);
        }
    };
    struct Primer {  // the consumer's first matmul: the gate batch of its first chunk (MK_MV_PRIME_NEXT)
        static __device__ bool first(const Globals& g, const Parsed& p, int stage, MvFirst& f) {
            if (p.pieces > 1) return false;
            f = MvFirst{&layer_refs(g, p.layer).w[LW_FFN_GATE], p.row_begin, min(p.row_begin + FFN_UP_CHUNK, p.row_end),
                        norm_in_matmul(g, stage) ? &g.act_own : &g.act_h};
            return true;
        }
    };
    struct Storer {  // vals[t][j] = silu(gate) * up for the chunk, then into the act layout
        static __device__ void run(const Globals& g, int rows, int f0, int n, const float* gate, float* vals) {
            for (int o = ctid(); o < rows * FFN_UP_CHUNK; o += MK_CONSUMER_THREADS) {
                const int t = o / FFN_UP_CHUNK, j = o % FFN_UP_CHUNK;
                if (j < n) vals[t * FFN_UP_CHUNK + j] *= silu_ref(gate[t * FFN_UP_CHUNK + j]);  // vals held up
            }
            consumers_sync();
            act_store(g.act_ffn, f0, n, rows, vals, FFN_UP_CHUNK);
        }
    };
    // A piece of a split 32-index unit (schedule.py split_tiles): its superblocks' gate products into columns
    // 0-31 of its part, the up products into 32-63; the last piece to arrive applies SwiGLU to the sums.
    static __device__ void run_piece(const Globals& g, const Parsed& p, const ActRef& a, int rows, float* gate,
                                     float* up, Smem& s) {
        const LayerRefs& L = layer_refs(g, p.layer);
        const WeightRef &wg = L.w[LW_FFN_GATE], &wu = L.w[LW_FFN_UP];
        const int n = p.row_end - p.row_begin;
        if (piece_ok(g, wg, p.row_begin, p.row_end, 32, p.piece, p.pieces) &&
            piece_ok(g, wu, p.row_begin, p.row_end, 32, p.piece, p.pieces)) {
            float* part = piece_part(g, p.slot, p.pieces, p.piece);
            piece_product(g, wg, p.row_begin, p.row_end, p.sb_begin, p.sb_end, a, rows, s.scratch, part);
            piece_product(g, wu, p.row_begin, p.row_end, p.sb_begin, p.sb_end, a, rows, s.scratch, part + 32);
            if (piece_arrive(g, p.slot, p.pieces, s)) {
                for (int o = ctid(); o < n * rows; o += MK_CONSUMER_THREADS) {
                    const int t = o / n, j = o % n;
                    gate[t * FFN_UP_CHUNK + j] = piece_sum(g, p.slot, p.pieces, t, j);
                    up[t * FFN_UP_CHUNK + j] = piece_sum(g, p.slot, p.pieces, t, 32 + j);
                }
                consumers_sync();
                Storer::run(g, rows, p.row_begin, n, gate, up);
                if (ctid() == 0) g.mv_count[p.slot] = 0u;
            }
        }
        consumers_sync();
    }
    struct Consumer {
        // act_h by reference where it is the input (a local copy's fields are read from the stack: mix_in.cuh)
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const LayerRefs& L = layer_refs(g, p.layer);
            if (!norm_in_matmul(g, stage)) return product(g, p, stage, g.act_h, s);
            const bool smem = p.pieces == 1 && levels_from_smem(g, L.w[LW_FFN_GATE], p.row_begin) &&
                              levels_from_smem(g, L.w[LW_FFN_UP], p.row_begin);
            const ActRef own = norm_into_own(g, stage, L.v[LV_POST_NORM], smem, s);
            product(g, p, stage, own, s);
        }
        static __device__ void product(const Globals& g, const Parsed& p, int stage, const ActRef& a, Smem& s) {
            const LayerRefs& L = layer_refs(g, p.layer);
            const int rows = stage_rows(g, stage);
            float* gate = s.scratch + MV_SCRATCH_FLOATS;              // [rows][FFN_UP_CHUNK]: after out and red
            float* up = gate + MK_MAX_ROWS * FFN_UP_CHUNK;           // [rows][FFN_UP_CHUNK]
            if (p.pieces > 1) return run_piece(g, p, a, rows, gate, up, s);
            for (int f0 = p.row_begin; f0 < p.row_end; f0 += FFN_UP_CHUNK) {
                const int f1 = min(f0 + FFN_UP_CHUNK, p.row_end);
                int flags = 0;  // the up batch's, from the gate batch (MK_MV_CARRY: its first units primed)
                for (int half = 0; half < 2; ++half) {
                    float* dst = half ? up : gate;
                    flags = mv_rows(g, L.w[half ? LW_FFN_UP : LW_FFN_GATE], f0, f1, a, 0, rows, s.scratch,
                                    [&](int r0, int n, const float* out) {
                                        for (int o = ctid(); o < n * rows; o += MK_CONSUMER_THREADS)
                                            dst[(o % rows) * FFN_UP_CHUNK + r0 - f0 + o / rows] =
                                                out[(o / rows) * 8 + o % rows];
                                    },
                                    half ? nullptr : &L.w[LW_FFN_UP], flags);
                }
                Storer::run(g, rows, f0, f1 - f0, gate, up);
                consumers_sync();
            }
        }
    };
};
