// The RMSNorm producer shared by OP_ATTN_NORM, OP_FFN_NORM and OP_HEAD_NORM: superblocks of act_h from the stage's
// residual stream (VM: solvers._norm_into_act).
#pragma once
#include "mk_common.cuh"
#include "mv_int8.cuh"

// Whether act_h gets its int8 copy at `rows` rows: wherever a matmul reads it - one row (MK_MV_I8), several with
// MK_MV_I8=2 (A8_REGS) or MK_MV_I8ROWS. Until 2026-12-05 the norms wrote it at every row count, unread past one row
// by default: ~2-3 us of a 5-row norm instruction (bench/MEGAKERNEL.md round 6), 136 of them a d = 4 cycle (round
// 10: d = 4 20.92 against 21.15 ms). MK_ACT8_ALL_ROWS=1 (a benchmark knob) writes it at every row count again.
// The MTP pass's head norm is the exception its caller names (last_row_alone): OP_DRAFT_HEAD reads that act's
// last row as one row, through the int8 copy, whatever the row count.
#ifndef MK_ACT8_ALL_ROWS
#define MK_ACT8_ALL_ROWS 0
#endif
__device__ __forceinline__ bool act_h_int8_at(int rows) {
    return rows == 1 || MK_MV_I8 >= 2 || MK_MV_I8ROWS || MK_ACT8_ALL_ROWS;
}

// act_h superblocks [sb_begin, sb_end) = RMSNorm(x rows) * weight; `hidden` (if given) gets the f32 values too.
__device__ __noinline__ void norm_into_act(const Globals& g, int stage, const float* weight, int sb_begin, int sb_end,
                              float* hidden, Smem& s, bool last_row_alone = false) {
    const int rows = stage_rows(g, stage), H = g.hidden_size;
    const float* x = stage_x(g, stage);
    float* inv = s.scratch;  // [MK_MAX_ROWS]
    float* vals = s.scratch + MK_MAX_ROWS;  // [rows][256]
    rows_inv_rms(x, rows, H, H, g.eps, inv, vals);  // vals is free until the values go in
    for (int sb = sb_begin; sb < sb_end; ++sb) {
        for (int o = ctid(); o < rows * QK_SB; o += MK_CONSUMER_THREADS) {
            const int t = o / QK_SB, k = sb * QK_SB + o % QK_SB;
            const float v = k < H ? ld_cg(x + (i64)t * H + k) * inv[t] * weight[k] : 0.f;
            vals[o] = v;
            if (hidden && k < H) hidden[(i64)t * H + k] = v;
        }
        consumers_sync();
        act_store(g.act_h, sb * QK_SB, QK_SB, rows, vals, QK_SB);
        if (g.act_h.q8 && (act_h_int8_at(rows) || last_row_alone))  // the int8 matmuls' copy
            act8_store(g.act_h, sb, rows, vals, QK_SB);
        consumers_sync();
    }
}
