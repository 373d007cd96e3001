// The RMSNorm producer shared by OP_ATTN_NORM, OP_FFN_NORM and OP_HEAD_NORM: superblocks of act_h from the stage's
// residual stream (VM: solvers._norm_into_act).
#pragma once
#include "mk_common.cuh"
#include "mv_int8.cuh"
#include "matvec.cuh"  // MK_RING_OFFSET

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

// MK_NORM_STAGE (1, the default; 0: x through registers from L2 as before, a benchmark knob): the norm copies its
// rows of x into the ring area with cp.async, every copy in flight at once, then sums and scales them from shared
// memory: one L2 round trip an instruction. From L2 the sum of squares waited a round trip for every 4,096
// positions of all rows (rows_inv_rms) and the values one a row: ~10 at 5 rows, where an ATTN_NORM / FFN_NORM took
// ~10.8 us against ~5.9 at one row (bench/MEGAKERNEL.md round 13). Measured there on the H100: 5 rows 10.9 ->
// 9.7 us, 2 rows 8.4 -> 7.3; one row 5.9 -> 6.2 (two round trips cost less than the copies' wait and barrier), so
// one row keeps the L2 path. Rows that do not fit beside the scratch area (more than 5 of the 27B's 5,120 at 140
// KB) take it too.
#ifndef MK_NORM_STAGE
#define MK_NORM_STAGE 1
#endif

// Whether `rows` rows of x (width H) are copied to shared memory (norm_stage_rows) rather than read from L2.
__device__ __forceinline__ bool norm_staged(const float* x, int rows, int H) {
    return MK_NORM_STAGE && rows >= 2 && (H & 3) == 0 && (reinterpret_cast<u64>(x) & 15) == 0 &&
           (i64)rows * H * 4 <= MK_SMEM_BYTES - MK_RING_OFFSET;
}

// x [rows, H] into the ring area (free between an instruction's matmuls), 16 bytes a copy, all issued before any
// lands; the consumers wait for all of them. With MK_MV_PRIME_NEXT a primed batch that no matmul claimed may still
// be landing in the rings: it lands first.
__device__ __forceinline__ float* norm_stage_rows(const float* x, int rows, int H, Smem& s) {
    if (MK_MV_PRIMING) {
        cp_async_wait<0>();
        consumers_sync();
    }
    u8* area = reinterpret_cast<u8*>(s.scratch) + MK_RING_OFFSET;
    const u32 dst = smem_u32(area);
    for (int i = ctid(); i < rows * H / 4; i += MK_CONSUMER_THREADS) cp_async16(dst + 16u * i, x + 4 * i);
    cp_async_commit();
    cp_async_wait<0>();
    consumers_sync();
    return reinterpret_cast<float*>(area);
}

// act_h superblocks [sb_begin, sb_end) = RMSNorm(x rows) * weight; `hidden` (if given) gets the f32 values too.
__device__ __noinline__ void norm_into_act(const Globals& g, int stage, const float* weight, int sb_begin, int sb_end,
                              float* hidden, Smem& s, bool last_row_alone = false) {
    const int rows = stage_rows(g, stage), H = g.hidden_size;
    const float* x = stage_x(g, stage);
    float* inv = s.scratch;  // [MK_MAX_ROWS]
    float* vals = s.scratch + MK_MAX_ROWS;  // [rows][256]
    const bool staged = norm_staged(x, rows, H);
    const float* xs = staged ? norm_stage_rows(x, rows, H, s) : nullptr;
    if (staged)
        rows_inv_rms<true>(xs, rows, H, H, g.eps, inv, vals);  // vals is free until the values go in
    else
        rows_inv_rms(x, rows, H, H, g.eps, inv, vals);
    for (int sb = sb_begin; sb < sb_end; ++sb) {
        for (int o = ctid(); o < rows * QK_SB; o += MK_CONSUMER_THREADS) {
            const int t = o / QK_SB, k = sb * QK_SB + o % QK_SB;
            const i64 at = (i64)t * H + k;
            const float v = k < H ? (staged ? xs[at] : ld_cg(x + at)) * inv[t] * weight[k] : 0.f;
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
