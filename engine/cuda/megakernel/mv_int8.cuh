// The megakernel matmul's int8 activations (matvec.cuh's int8 kinds): which matmuls take them (MK_MV_I8 and the
// knobs beside it), how a row's two levels reach the units (with each unit's stage, once a batch, or into
// registers), and the unit arithmetic on them - kernels/i8q4k.cuh's and i8q6k.cuh's, the per-op int8 matmuls'.
#pragma once
#include "mk_common.cuh"
#include "i8q4k.cuh"
#include "i8q6k.cuh"

// One row's int8 activations (the act's int8 copy, act8_store) staged with a Q4_K unit's weights (MK_MV_I8): the
// unit's superblock of the row's hi and lo levels (256 bytes each, at kernels/i8q4k.cuh's slot pitch), their
// sub-block sums records (f16 hi, then lo parts: 16 bytes each) and the 16-byte run of each level's scales that
// holds the row's. All by cp.async.cg (L2): the act changes during the launch, and .ca could hand an SM a line
// its L1 kept from an earlier layer.
#ifndef MK_MV_I8
// 0: f16 activations only; 1: int8 at one row; 2: at 1-8 rows, the others' levels loaded from L2 into registers
// (fewer instructions, but slower on the H200 at d = 4: 24.26 against 23.52 ms a cycle, bench/MEGAKERNEL.md round 6)
#define MK_MV_I8 1
#endif
// No int8 activations; one row's in each unit's stage; rows' in registers; one row's staged once a batch; 2 to
// MK_ACT8_ROWS_MAX rows' staged once a batch (MK_MV_I8ROWS).
enum MvAct8 { A8_NONE, A8_STAGED, A8_REGS, A8_SMEM, A8_ROWS };
// MK_MV_ACT8_SMEM (default since round 7: d = 0 14.22 against 14.69 ms, bench/MEGAKERNEL.md): at one row, the
// batch's superblocks of the row's levels are copied once into the start of the ring area (Act8Stage's layout a
// superblock, up to MK_ACT8_MAX_SB of them) instead of with every unit: no activation copies in the unit loop, 1/8
// of the L2 reads (a superblock's were read once per tile), rings of weights alone after them.
#ifndef MK_MV_ACT8_SMEM
#define MK_MV_ACT8_SMEM 1
#endif
// Superblocks of a row the area holds: the 27B's 5,120 / 6,144-wide acts in one batch, act_ffn's 68 in two (and
// still 3 Q4_K stages a warp in 132 KB; in 96 KB, 24 leaves Q6_K its 2)
#define MK_ACT8_MAX_SB (MK_SMEM_BYTES >= 128 * 1024 ? 34 : 24)
// MK_MV_I8B (with MK_MV_ACT8_SMEM; default since round 7, 271 against 312 instructions a unit: FFN_UP's loops
// 14.4 against 14.9 us): kernels/mmvq_i8b.cu's arithmetic for the unit - each
// mma's B carries one sub-block of a group of four in its two columns (hi, lo level), so four mmas fill one set
// of sums and 8 IMADs apply the sub-block scales (32 with i8_level); each lane's partial rows stay in registers
// across a tile's units and go to the tile's partials once, summed over the quad, when the tile changes.
#ifndef MK_MV_I8B
#define MK_MV_I8B 1
#endif
// MK_MV_I8Q6 (with MK_MV_ACT8_SMEM; default since round 7: LM_HEAD 612 against 702 us at d = 0): Q6_K of one row
// (LM_HEAD, attn_v) on int8 levels too, kernels/mmvq_i8q6.cu's arithmetic at one token (its f16 units waited an L2
// round trip for their activations each: Q6_K's stages leave no room for them in the ring).
#ifndef MK_MV_I8Q6
#define MK_MV_I8Q6 1
#endif
struct Act8Stage {
    static constexpr int SLOTS = 0, SUMS = 2 * I8_SLOT_PITCH, SCALES = SUMS + 32, BYTES = SCALES + 32;
    // Lane l: 16 bytes of level l / 16; lanes 0-1 the sums records, lanes 2-3 the levels' scales.
    struct Src {
        const i8* q;
        const u8* meta;
        u32 dst_q, dst_meta;
    };
    static __device__ __forceinline__ Src source(const ActRef& a, int n0, int lane) {
        const int level = lane >> 4;
        Src x;
        x.q = a.q8 + (level * 8 + n0) * 256 + 16 * (lane & 15);
        x.dst_q = SLOTS + I8_SLOT_PITCH * level + 16 * (lane & 15);
        x.meta = lane < 2 ? reinterpret_cast<const u8*>((lane ? a.sums8_lo : a.sums8) + 8 * n0)
                          : reinterpret_cast<const u8*>(a.scale8 + 8 * (lane & 1) + (n0 & ~3));
        x.dst_meta = SUMS + 16 * (lane & 3);
        return x;
    }
    // Superblock sb's copies into the stage at dst (activation bytes: [sb][2 levels][8 rows][256]; sums records
    // [sb][8 rows][8] f16; scales [sb][2 levels][8 rows] f32).
    static __device__ __forceinline__ void copy(u32 dst, const Src& x, int sb, int lane) {
        cp_async16(dst + x.dst_q, x.q + 4096 * sb);
        if (lane < 4) cp_async16(dst + x.dst_meta, x.meta + (lane < 2 ? 128 : 64) * sb);
    }
    // Every consumer thread's share of the copies of superblocks [sb0, sb1) of row n0 into area (one Act8Stage
    // layout a superblock), committed as one cp.async group.
    static __device__ __forceinline__ void copy_all(u32 area, const ActRef& a, int n0, int sb0, int sb1) {
        for (int k = ctid(); k < (sb1 - sb0) * 36; k += MK_CONSUMER_THREADS) {
            const int sb = sb0 + k / 36, part = k % 36, l = part & 1;
            const u32 dst = area + (sb - sb0) * BYTES;
            if (part < 32)
                cp_async16(dst + SLOTS + I8_SLOT_PITCH * (part >> 4) + 16 * (part & 15),
                           a.q8 + (i64)sb * 4096 + ((part >> 4) * 8 + n0) * 256 + 16 * (part & 15));
            else if (part < 34)
                cp_async16(dst + SUMS + 16 * l, (l ? a.sums8_lo : a.sums8) + ((i64)sb * 8 + n0) * 8);
            else
                cp_async16(dst + SCALES + 16 * l, a.scale8 + (i64)sb * 16 + 8 * l + (n0 & ~3));
        }
        cp_async_commit();
    }
};

// MK_MV_I8ROWS=1 (the default since round 12: d = 4 -1.6 ms on the H200 in round 11, -1.5 on the H100 in round 12,
// d = 0 unchanged): Q4_K matmuls of 2 to MK_ACT8_ROWS_MAX rows (the verify and draft rows of d = 1..4) on the
// act's int8 levels too, kernels/mmvq_i8v.cu's arithmetic: whole rows in the int8 mma's
// columns (4 rows a mma, a second past 4), each weight fragment masked once for all of them. At 5 rows the f16
// matmul's unit loops are its arithmetic's (round 9, d = 4: FFN_UP's up batch 33.7 us against 14.6 at one row,
// MIX_IN 34.6 against 15.4, for the same bytes), where the per-op path's int8 form costs ~1.3 x its one-row cost.
// The batch's superblocks of the rows' levels go to the start of the ring area once (Act8Rows), at most
// MK_ACT8_ROWS_SB of them (a wider weight takes them in chunks: mv_chunks): 20 where the kernel has 140 KB (sm_90:
// the 27B's 5,120-wide rows in one batch, 2 Q4_K stages a warp; round 12 on the H100, d = 4 17.79 ms against 18.72
// with 10 in 132 KB and 3 stages, d = 0 unchanged), else 10 (2 stages in 96 KB). Only acts with an int8 copy at
// several rows: act_h (the norms write it at every row) and, with MK_ACT8_FILL_ROWS (off: it lost), act_ffn and
// act_mix. (MK_MV_I8ROWS and MK_ACT8_ROWS_MAX: mk_common.cuh.)
#ifndef MK_ACT8_ROWS_SB
#define MK_ACT8_ROWS_SB (MK_SMEM_BYTES >= 140 * 1024 ? 20 : 10)
#endif
// The rows' levels of a batch's superblocks: row t's level l (0 hi, 1 lo) in region 2t + l, superblock r of the
// batch 256 r bytes in (the act8 copy's byte order: a lane's 16 bytes of a 64-byte chunk hold its k of the chunk's
// two sub-blocks), regions at a pitch of 64 mod 128 (a quarter-warp's hi and lo readers in other banks, as
// mmvq_i8v's); then each (superblock, row)'s sums record (8 hi f16, 8 lo f16) and its two level scales (f32).
struct Act8Rows {
    static constexpr int PITCH = 256 * MK_ACT8_ROWS_SB + 64, SUMS = 2 * MK_ACT8_ROWS_MAX * PITCH;
    static constexpr int SCALES = SUMS + 32 * MK_ACT8_ROWS_MAX * MK_ACT8_ROWS_SB;
    static constexpr int BYTES = SCALES + 8 * MK_ACT8_ROWS_MAX * MK_ACT8_ROWS_SB;
    static_assert(BYTES % 16 == 0, "the ring stages after it start on 16 bytes");
    static __device__ __forceinline__ int rec(int r, int t) { return MK_ACT8_ROWS_MAX * r + t; }
    // Every consumer thread's share of the copies of rows n0 .. n0 + rows - 1 over superblocks [sb0, sb1) into
    // area, committed as one cp.async group (act8 layout: bytes [sb][level][8 rows][256], sums [sb][8 rows][8]
    // f16, scales [sb][level][8 rows] f32).
    static __device__ __forceinline__ void copy_all(u32 area, const ActRef& a, int n0, int rows, int sb0, int sb1) {
        const u8* q = reinterpret_cast<const u8*>(a.q8);
        const int items = (sb1 - sb0) * rows;  // (superblock, row) pairs: 32 level chunks, 2 sums halves, 2 scales
        for (int k = ctid(); k < items * 36; k += MK_CONSUMER_THREADS) {
            const int pair = k / 36, part = k % 36, r = pair / rows, t = pair % rows, sb = sb0 + r;
            if (part < 32) {
                const int l = part >> 4, chunk = part & 15;
                cp_async16(area + (2 * t + l) * PITCH + 256 * r + 16 * chunk,
                           q + (i64)sb * 4096 + 256 * (8 * l + n0 + t) + 16 * chunk);
            } else if (part < 34) {
                const int l = part - 32;
                cp_async16(area + SUMS + 32 * rec(r, t) + 16 * l, (l ? a.sums8_lo : a.sums8) + (i64)sb * 64 + 8 * (n0 + t));
            } else {
                const int l = part - 34;
                cp_async4(area + SCALES + 8 * rec(r, t) + 4 * l, a.scale8 + (i64)sb * 16 + 8 * l + n0 + t);
            }
        }
        cp_async_commit();
    }
};

// One Q4_K unit (Q4KStage8 weights at st) against `rows` rows' levels of superblock r of the batch (area:
// Act8Rows), mmvq_i8v's i8v_superblock on the stage's layout: mma rows g and g + 8 are tile rows g and g + 8
// (i8_read_row), mma m's B column n is row 4 m + n / 2 at level n % 2 (past the last row, the last again: no
// branches; never stored). Adds tile row g + 8 i's product with row 4 m + c to dst[(g + 8 i) * 8 + 4 m + c] (the
// warp's tile partials [16][8], as mv_fold_batch reads them), for 4 m + c < rows. NM = 2 past 4 rows.
template <int NM>
__device__ __forceinline__ void mv_unit_i8rows(const u8* st, const u8* area, int r, int rows, int g, int c,
                                               float* dst) {
    using A = Act8Rows;
    __builtin_assume(__isShared(dst));  // the warp's partials: shared loads and stores, not generic ones
    I8Row w0, w1;
    i8_read_row(w0, st, g, c);
    i8_read_row(w1, st, g + 8, c);
    int tot[NM][4];  // per mma: (row g, hi), (row g, lo), (row g + 8, hi), (row g + 8, lo), x 16
#pragma unroll
    for (int m = 0; m < NM; ++m) tot[m][0] = tot[m][1] = tot[m][2] = tot[m][3] = 0;
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles of chunk p) and 2p + 1 (its high nibbles)
        uint4 b[NM];
#pragma unroll
        for (int m = 0; m < NM; ++m) {
            const int t = min(4 * m + (g >> 1), rows - 1);
            b[m] = *reinterpret_cast<const uint4*>(area + (2 * t + (g & 1)) * A::PITCH + 256 * r + 64 * p + 16 * c);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 mask = h ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
            const u32 wq[4] = {w0.q[p].x & mask, w1.q[p].x & mask, w0.q[p].y & mask, w1.q[p].y & mask};
            const int s0 = (int)w0.sc[2 * p + h] << (h ? 0 : 4), s1 = (int)w1.sc[2 * p + h] << (h ? 0 : 4);
#pragma unroll
            for (int m = 0; m < NM; ++m) {
                int sums[4];
                mma_u8s8_16832(sums, wq, h ? b[m].z : b[m].x, h ? b[m].w : b[m].y);
                tot[m][0] += sums[0] * s0;
                tot[m][1] += sums[1] * s0;
                tot[m][2] += sums[2] * s1;
                tot[m][3] += sums[3] * s1;
            }
        }
    }
    // the min term: the rows' mins x the act rows' sub-block sums, one f16 mma (B column g: row g / 2 + 4 (g % 2),
    // the hi sums at k < 8, the lo at k >= 8): (row g, act row c), (row g, c + 4), (row g + 8, c), (row g + 8, c + 4)
    const int tb = min((g >> 1) + 4 * (g & 1), rows - 1);
    const u8* rec = area + A::SUMS + 32 * A::rec(r, tb);
    const u32 am[4] = {w0.mins, w1.mins, w0.mins, w1.mins};
    const u32 bm[2] = {*reinterpret_cast<const u32*>(rec + 4 * c), *reinterpret_cast<const u32*>(rec + 16 + 4 * c)};
    float mt[4] = {0.f, 0.f, 0.f, 0.f};
    mma_f16_16816(mt, am, bm);
    const float d[2] = {0.0625f * w0.d, 0.0625f * w1.d}, dmin[2] = {w0.dmin, w1.dmin};  // the sums are 16 x
#pragma unroll
    for (int m = 0; m < NM; ++m) {
        const int t = 4 * m + c;
        const float2 lv = *reinterpret_cast<const float2*>(area + A::SCALES + 8 * A::rec(r, min(t, rows - 1)));
        if (t < rows) {
#pragma unroll
            for (int i = 0; i < 2; ++i)
                dst[(g + 8 * i) * 8 + t] += d[i] * ((float)tot[m][2 * i] * lv.x + (float)tot[m][2 * i + 1] * lv.y) -
                                            dmin[i] * mt[2 * i + m];
        }
    }
}

// Several rows' int8 activations for one superblock, loaded from L2 into registers (A8_REGS), as mmvq_i8 lays
// out its columns: packed (rows <= 4), lane (g, c) supplies column g = slot g (row g's hi level, then row g - n's
// lo level) and its accumulator columns 2c, 2c + 1 take those slots' scales; unpacked, column g < n is row g's hi
// level in b and its lo level in bl (a second mma), with the two levels' scales apart.
struct MvAct8Regs {
    uint4 b[4], bl[4];
    u32 sum, sum_lo;
    float s0, s1, s0_lo, s1_lo;  // columns 2c, 2c + 1 (times 1/16: i8_level's sums are 16 x the value)
};
struct MvAct8Src {
    const i8* q[2];       // the lane's column's level bytes (hi, lo), superblock 0; null: a zero column
    const f16* sums[2];   // its sums records
    const float* sc[4];   // the scales of accumulator columns 2c, 2c + 1 (hi; lo when unpacked); null: none
};
__device__ __forceinline__ MvAct8Src mv_act8_src(const ActRef& a, int n0, int ncols, bool packed, int g, int c) {
    MvAct8Src x;
    auto slot = [&](int j, int& level, int& tok) {  // packed slot j: -1 past the columns
        level = j < ncols ? 0 : 1;
        tok = j < ncols ? j : j - ncols;
        return j < 2 * ncols;
    };
    int level, tok;
    if (packed) {
        const bool on = slot(g, level, tok);
        x.q[0] = on ? a.q8 + (level * 8 + n0 + tok) * 256 + 16 * c : nullptr;
        x.sums[0] = on ? (level ? a.sums8_lo : a.sums8) + (n0 + tok) * 8 + 2 * c : nullptr;
        x.q[1] = nullptr;
        x.sums[1] = nullptr;
        for (int k = 0; k < 2; ++k) {
            const bool has = slot(2 * c + k, level, tok);
            x.sc[k] = has ? a.scale8 + 8 * level + n0 + tok : nullptr;
            x.sc[2 + k] = nullptr;
        }
    } else {
        const bool on = g < ncols;
        for (int l = 0; l < 2; ++l) {
            x.q[l] = on ? a.q8 + (l * 8 + n0 + g) * 256 + 16 * c : nullptr;
            x.sums[l] = on ? (l ? a.sums8_lo : a.sums8) + (n0 + g) * 8 + 2 * c : nullptr;
        }
        for (int k = 0; k < 2; ++k) {
            const bool has = 2 * c + k < ncols;
            x.sc[k] = has ? a.scale8 + n0 + 2 * c + k : nullptr;
            x.sc[2 + k] = has ? a.scale8 + 8 + n0 + 2 * c + k : nullptr;
        }
    }
    return x;
}
// Superblock sb's values of the lane's columns (byte runs [sb][2][8][256], sums [sb][8][8], scales [sb][2][8]).
__device__ __forceinline__ void mv_act8_load(const MvAct8Src& x, int sb, bool packed, MvAct8Regs& r) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        r.b[j] = x.q[0] ? ld_cg_u4(x.q[0] + 4096 * sb + 64 * j) : make_uint4(0u, 0u, 0u, 0u);
        r.bl[j] = !packed && x.q[1] ? ld_cg_u4(x.q[1] + 4096 * sb + 64 * j) : make_uint4(0u, 0u, 0u, 0u);
    }
    r.sum = x.sums[0] ? ld_cg_u32(x.sums[0] + 64 * sb) : 0u;
    r.sum_lo = !packed && x.sums[1] ? ld_cg_u32(x.sums[1] + 64 * sb) : 0u;
    r.s0 = x.sc[0] ? 0.0625f * ld_cg(x.sc[0] + 16 * sb) : 0.f;
    r.s1 = x.sc[1] ? 0.0625f * ld_cg(x.sc[1] + 16 * sb) : 0.f;
    r.s0_lo = !packed && x.sc[2] ? 0.0625f * ld_cg(x.sc[2] + 16 * sb) : 0.f;
    r.s1_lo = !packed && x.sc[3] ? 0.0625f * ld_cg(x.sc[3] + 16 * sb) : 0.f;
}

// One Q4_K unit of a stage (Q4KStage8 weights; act: its superblock's Act8Stage) against one row's two int8
// levels, added into acc as the packed f16 product leaves it (column 0 the hi level's share, column 1 the lo level's; mv_fold_batch
// adds them): kernels/i8q4k.cuh's arithmetic, exact int32 sums per sub-block scaled once per level. Lanes of
// columns 2-7 (g >= 2) multiply zeros.
__device__ __forceinline__ void mv_unit_i8(const u8* st, const u8* act, int n0, int g, int c, float (&acc)[4]) {
    I8Row r0, r1;
    i8_read_row(r0, st, g, c);
    i8_read_row(r1, st, g + 8, c);
    const bool mine = g < 2;
    uint4 b[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        b[j] = mine ? *reinterpret_cast<const uint4*>(act + Act8Stage::SLOTS + I8_SLOT_PITCH * g + 16 * c + 64 * j)
                    : make_uint4(0u, 0u, 0u, 0u);
    int tot[4];
    i8_level(r0, r1, b, tot);
    // column 2c + l is level l's for c == 0: its scale is at the row's place in the level's 16-byte run
    const float* sc = reinterpret_cast<const float*>(act + Act8Stage::SCALES);
    const float s_hi = c == 0 ? 0.0625f * sc[n0 & 3] : 0.f, s_lo = c == 0 ? 0.0625f * sc[4 + (n0 & 3)] : 0.f;
    i8_scale_add(r0, r1, tot, s_hi, s_lo, acc);
    const u32 sum = mine ? *reinterpret_cast<const u32*>(act + Act8Stage::SUMS + 16 * g + 4 * c) : 0u;
    i8_min_term(r0, r1, sum, 0u, false, acc);
}

// One Q4_K unit (Q4KStage8 weights at st; act: its superblock's Act8Stage, row n0's) the mmvq_i8b way, added to
// the lane's partial sums run[r] of tile row g + 8 r (its sub-blocks c and c + 4; the quad's four lanes together
// hold a row's whole superblock). Column 2a + l of the mmas is sub-block a of a group of four at level l.
__device__ __forceinline__ void mv_unit_i8b(const u8* st, const u8* act, int n0, int g, int c, float (&run)[2]) {
    using S = Q4KStage8;
    uint2 q[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            q[r][j] = *reinterpret_cast<const uint2*>(st + S::QS + (g + 8 * r) * S::QS_PITCH + 32 * j + 8 * c);
    const int a = g >> 1;  // the sub-block of a group of four this lane's B column carries, at level g % 2
    const u8* xv = act + Act8Stage::SLOTS + (g & 1) * I8_SLOT_PITCH + 64 * (a >> 1) + 16 * c + 8 * (a & 1);
    const uint2 xa = *reinterpret_cast<const uint2*>(xv), xb = *reinterpret_cast<const uint2*>(xv + 128);
    int sc[2], mn[2], sc4[2], mn4[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) i8b_scales(st + S::SC + 12 * (g + 8 * r), c, sc[r], mn[r], sc4[r], mn4[r]);
    int tot[4] = {0, 0, 0, 0};  // (row g, hi), (row g, lo), (row g + 8, hi), (row g + 8, lo), times the scales
    i8b_unit_sums(q, xa, xb, a, sc, sc4, tot);
    const float* lv = reinterpret_cast<const float*>(act + Act8Stage::SCALES);
    const float kf = (c & 1) ? 0.0625f : 1.f;  // lanes c odd hold the high-nibble sub-blocks' sums: 16 q
    const float hi = kf * lv[n0 & 3], lo = kf * lv[4 + (n0 & 3)];
    const f16* su = reinterpret_cast<const f16*>(act + Act8Stage::SUMS);  // 8 hi sums, then the 8 lo
    const float xs = f16_to_f32(su[c]) + f16_to_f32(su[8 + c]);
    const float xs4 = f16_to_f32(su[c + 4]) + f16_to_f32(su[12 + c]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u32 dm = *reinterpret_cast<const u32*>(st + S::DM + 4 * (g + 8 * r));
        const float d = f16_to_f32((f16)(dm & 0xFFFFu)), dmin = f16_to_f32((f16)(dm >> 16));
        run[r] += d * ((float)tot[2 * r] * hi + (float)tot[2 * r + 1] * lo);
        run[r] -= dmin * ((float)mn[r] * xs + (float)mn4[r] * xs4);
    }
}

// The lane's partial rows run (mv_unit_i8b) into column 0 of tile partials dst[16][8], summed over the quad.
__device__ __forceinline__ void mv_run_flush(float (&run)[2], float* dst, int g, int c) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        run[r] += __shfl_xor_sync(FULL_MASK, run[r], 1);
        run[r] += __shfl_xor_sync(FULL_MASK, run[r], 2);
    }
    if (c == 0) {
        dst[g * 8] += run[0];
        dst[(g + 8) * 8] += run[1];
    }
    run[0] = run[1] = 0.f;
}

// One Q6_K unit (Q6KStage8 weights at st; act: its superblock's Act8Stage, row n0's) against one row's two int8
// levels, as mmvq_i8q6 does at one token: a 64-position chunk's four 16-wide sub-blocks in one set of sums
// (column 2u + l: sub-block u at level l), the low and high nibbles' mma each carrying two of them. Added to the
// lane's partial rows run[r] (tile row g + 8 r; mv_run_flush sums the quad). idx0, idx1: the rows' block indices
// (the parity of the d word's half).
__device__ __forceinline__ void mv_unit_i8q6(const u8* st, const u8* act, int n0, int g, int c, u32 idx0, u32 idx1,
                                             float (&run)[2]) {
    using S = Q6KStage8;
    const int half = c >> 1, u = g >> 1;
    const uint4 sc0 = *reinterpret_cast<const uint4*>(st + S::SC + 16 * g);
    const uint4 sc1 = *reinterpret_cast<const uint4*>(st + S::SC + 16 * (g + 8));
    const u32 scw0[4] = {sc0.x, sc0.y, sc0.z, sc0.w}, scw1[4] = {sc1.x, sc1.y, sc1.z, sc1.w};
    const u8* col = act + Act8Stage::SLOTS + (g & 1) * I8_SLOT_PITCH + 16 * c;  // column g's level
    int isum[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u32 a[2][4];
        q6_frags(st, g, c, j, a);
        const uint4 b = *reinterpret_cast<const uint4*>(col + 64 * j);
        int d[4] = {0, 0, 0, 0};
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // the lane's k of mma h belong to sub-block 2h + half of the chunk
            const bool on = u == 2 * h + half;
            mma_s8s8_16832_acc(d, a[h], on ? (h ? b.z : b.x) : 0u, on ? (h ? b.w : b.y) : 0u);
        }
        const int s0 = sbyte(scw0[j], 8 * c), s1 = sbyte(scw1[j], 8 * c);  // columns 2c, 2c + 1: sub-block c
        isum[0] += s0 * d[0];
        isum[1] += s0 * d[1];
        isum[2] += s1 * d[2];
        isum[3] += s1 * d[3];
    }
    const float d0 = f16_to_f32((f16)q6k_d_of_word(*reinterpret_cast<const u32*>(st + S::D + 4 * g), idx0));
    const float d1 = f16_to_f32((f16)q6k_d_of_word(*reinterpret_cast<const u32*>(st + S::D + 4 * (g + 8)), idx1));
    const float* lv = reinterpret_cast<const float*>(act + Act8Stage::SCALES);
    const float hi = lv[n0 & 3], lo = lv[4 + (n0 & 3)];  // columns 2c (level 0) and 2c + 1 (level 1)
    run[0] += d0 * ((float)isum[0] * hi + (float)isum[1] * lo);
    run[1] += d1 * ((float)isum[2] * hi + (float)isum[3] * lo);
}

// The same against several rows' levels in registers (A8_REGS): unpacked, the lo levels take a second pass of
// mmas on the same fragments.
__device__ __forceinline__ void mv_unit_i8_regs(const u8* st, const MvAct8Regs& x, bool packed, int g, int c,
                                                float (&acc)[4]) {
    I8Row r0, r1;
    i8_read_row(r0, st, g, c);
    i8_read_row(r1, st, g + 8, c);
    int tot[4];
    i8_level(r0, r1, x.b, tot);
    i8_scale_add(r0, r1, tot, x.s0, x.s1, acc);
    if (!packed) {
        i8_level(r0, r1, x.bl, tot);
        i8_scale_add(r0, r1, tot, x.s0_lo, x.s1_lo, acc);
    }
    i8_min_term(r0, r1, x.sum, x.sum_lo, !packed, acc);
}
