// Pieces of split units (schedule.py split_tiles, off by default since round 4): a tile's or an FFN unit's
// superblock ranges on different SMs, their products added by the last piece to arrive.
#pragma once
#include "matvec.cuh"

// A piece leaves its product in g.mv_part[slot * pieces + piece] ([row][MK_PIECE_WIDTH], f32) and counts itself in
// g.mv_count[slot]; the piece that arrives last adds the unit's pieces in piece order (whoever finishes last, the
// same sum), stores the result and leaves the count at zero for the next group.

// The piece `piece` of slot's parts.
__device__ __forceinline__ float* piece_part(const Globals& g, int slot, int pieces, int piece) {
    return g.mv_part + ((i64)slot * pieces + piece) * MK_MAX_ROWS * MK_PIECE_WIDTH;
}

// Count this piece (after its part is written by every consumer); true in every consumer thread of the last one.
__device__ __forceinline__ bool piece_arrive(const Globals& g, int slot, int pieces, Smem& s) {
    fence_release();  // the part is out before it is counted
    consumers_sync();
    if (ctid() == 0) s.flag = atomicAdd(g.mv_count + slot, 1u) == (u32)(pieces - 1);
    consumers_sync();
    const bool last = s.flag;
    if (last) fence_acquire();  // every other piece, counted before ours, is visible (read through L2)
    return last;
}

// Column `col` of the sum of slot's pieces for activation row t.
__device__ __forceinline__ float piece_sum(const Globals& g, int slot, int pieces, int t, int col) {
    float v = 0.f;
    for (int q = 0; q < pieces; ++q) v += ld_cg(piece_part(g, slot, pieces, q) + t * MK_PIECE_WIDTH + col);
    return v;
}

// Whether rows [row_begin, row_end) of w can be a piece: a staged weight and at most `width` rows.
__device__ __forceinline__ bool piece_ok(const Globals& g, const WeightRef& w, int row_begin, int row_end, int width,
                                         int piece, int pieces) {
    const bool ok = mv_staged(w, row_begin) && row_end - row_begin <= width && 0 <= piece && piece < pieces;
    if (!ok && ctid() == 0) mk_fail(g, ERR_BAD_SHAPE, blockIdx.x, -1, w.qtype, row_begin, piece, pieces);
    return ok;
}

// The products of rows [row_begin, row_end) (at most MV_BATCH tiles) over superblocks [sb0, sb1) into
// dst[t * MK_PIECE_WIDTH + r] for activation rows t < ncols.
__device__ __forceinline__ void piece_product(const Globals& g, const WeightRef& w, int row_begin, int row_end,
                                              int sb0, int sb1, const ActRef& a, int ncols, float* scratch,
                                              float* dst) {
    const float* out = scratch;
    const int n = row_end - row_begin;
    mv_batch(g, w, row_begin, 0, (n + MK_TILE_ROWS - 1) / MK_TILE_ROWS, sb0, sb1, a, 0, ncols, scratch);
    for (int o = ctid(); o < n * ncols; o += MK_CONSUMER_THREADS) {  // rows past n repeat the weight's last one
        const int t = o / n, r = o % n;
        dst[t * MK_PIECE_WIDTH + r] = out[(r >> 4) * 128 + (r & 15) * 8 + t];
    }
    consumers_sync();  // out is free again
}

// A piece of a split tile (FFN_DOWN, MIX_OUT): the tile's sum goes to store as mv_rows would hand it.
template <class Store>
__device__ void mv_piece(const Globals& g, const WeightRef& w, int row_begin, int row_end, int sb0, int sb1,
                         int piece, int pieces, int slot, const ActRef& a, int ncols, Smem& s, Store&& store) {
    if (piece_ok(g, w, row_begin, row_end, MK_TILE_ROWS, piece, pieces)) {
        piece_product(g, w, row_begin, row_end, sb0, sb1, a, ncols, s.scratch, piece_part(g, slot, pieces, piece));
        if (piece_arrive(g, slot, pieces, s)) {
            const int n = row_end - row_begin;
            for (int o = ctid(); o < n * ncols; o += MK_CONSUMER_THREADS)
                s.scratch[(o % n) * 8 + o / n] = piece_sum(g, slot, pieces, o / n, o % n);
            consumers_sync();
            store(row_begin, n, s.scratch);
            if (ctid() == 0) g.mv_count[slot] = 0u;
        }
    }
    consumers_sync();
}
