// The int8-activation product of one Q4_K unit (16 rows x one superblock staged in shared memory) against two-level
// int8 columns (act8.cuh): shared by the per-op matmuls (kernels/mmvq_i8.cu, whose header describes the activation
// layout, and kernels/mmvq_i8b.cu) and the megakernel's one-row matmul (megakernel/matvec.cuh).
#pragma once
#include "mmvq.cuh"

#define I8_SLOT_PITCH 320  // a 256-byte column slot + 64: two slots of a quarter-warp's reads sit in other banks

using Q4KStage8 = Q4KStage<160>;

// A row's scale and min of sub-blocks c and c + 4, from its 12 scale bytes s (the Q4_K packing).
__device__ __forceinline__ void i8b_scales(const u8* s, int c, int& sc, int& mn, int& sc4, int& mn4) {
    const int b0 = s[c], b1 = s[c + 4], b2 = s[c + 8];
    sc = b0 & 63;
    mn = b1 & 63;
    sc4 = (b2 & 15) | ((b0 >> 2) & 48);
    mn4 = (b2 >> 4) | ((b1 >> 2) & 48);
}

// mmvq_i8b's unit sums: the lane's quants q[r][j] (8 bytes of chunk j of its two rows r) against its B column (xa:
// sub-block a of sub-blocks 0-3 at one level, xb: of 4-7; zero in the other three mmas of each group), each group
// of four mmas' sums scaled once by the rows' scales of sub-block c (sc) and c + 4 (sc4): tot = (row 0, column 2c),
// (row 0, 2c + 1), (row 1, 2c), (row 1, 2c + 1).
__device__ __forceinline__ void i8b_unit_sums(const uint2 (&q)[2][4], uint2 xa, uint2 xb, int a, const int (&sc)[2],
                                              const int (&sc4)[2], int (&tot)[4]) {
#pragma unroll
    for (int f = 0; f < 2; ++f) {  // sub-blocks 4f .. 4f + 3
        int sums[4] = {0, 0, 0, 0};
        const uint2 b = f ? xb : xa;
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // sub-block 4f + i: the low (i even) or high nibbles of chunk 2f + i / 2
            const int j = 2 * f + (i >> 1);
            const u32 m = (i & 1) ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
            const u32 w[4] = {q[0][j].x & m, q[1][j].x & m, q[0][j].y & m, q[1][j].y & m};
            const bool mine = a == i;
            mma_u8s8_16832_acc(sums, w, mine ? b.x : 0u, mine ? b.y : 0u);
        }
        const int s0 = f ? sc4[0] : sc[0], s1 = f ? sc4[1] : sc[1];
        tot[0] += sums[0] * s0;
        tot[1] += sums[1] * s0;
        tot[2] += sums[2] * s1;
        tot[3] += sums[3] * s1;
    }
}

// The 6-bit scales of a Q4_K block's eight sub-blocks, one per word (the 12 scale bytes as three words).
__device__ __forceinline__ void k4_scales8(u32 s0, u32 s2, u32 (&sc)[8]) {
    const u32 lo = s0 & 0x3F3F3F3Fu, hi = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // byte j, zero-extended: one prmt each
        sc[j] = prmt(lo, 0u, 0x4440u + j);
        sc[4 + j] = prmt(hi, 0u, 0x4440u + j);
    }
}

// One staged row's part of a unit: its quants (8 bytes of each 32-byte chunk), scales and d / dmin.
struct I8Row {
    uint2 q[4];
    u32 sc[8];
    u32 mins;  // m of sub-blocks 2c, 2c + 1 as exact f16x2 (the min mma's A)
    float d, dmin;
};

__device__ __forceinline__ void i8_read_row(I8Row& r, const u8* st, int lr, int c) {
    const u8* q = st + Q4KStage8::QS + lr * Q4KStage8::QS_PITCH + 8 * c;
#pragma unroll
    for (int j = 0; j < 4; ++j) r.q[j] = *reinterpret_cast<const uint2*>(q + 32 * j);
    const u32* s = reinterpret_cast<const u32*>(st + Q4KStage8::SC + 12 * lr);
    const u32 s0 = s[0], s1 = s[1], s2 = s[2];
    k4_scales8(s0, s2, r.sc);
    u32 sc_pair, mn_pair;  // the scales of the pair go unused (the compiler drops them): this kernel has all 8
    k4_scale_pairs(s0, s1, s2, c, sc_pair, mn_pair);
    r.mins = bytes01_to_h2(mn_pair);
    const u32 dm = *reinterpret_cast<const u32*>(st + Q4KStage8::DM + 4 * lr);
    r.d = f16_to_f32((f16)(dm & 0xFFFFu));
    r.dmin = f16_to_f32((f16)(dm >> 16));
}

// The int32 sums of one level over the superblock: per sub-block one mma on the lane's weight fragments and
// the level's B (16 bytes per chunk), times the sub-block scale. Returned as 16 x the value (the high nibbles
// arrive as 16 q, so the low-nibble sub-blocks are scaled up to match): |16 even + odd| < 2^29 (15 x 127 x 32
// x 63 x 4 x 16 twice), exact in int32.
__device__ __forceinline__ void i8_level(const I8Row& r0, const I8Row& r1, const uint4 (&b)[4], int (&tot)[4]) {
    int even[4] = {0, 0, 0, 0}, odd[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        int d[4];
        const u32 lo[4] = {r0.q[j].x & 0x0F0F0F0Fu, r1.q[j].x & 0x0F0F0F0Fu, r0.q[j].y & 0x0F0F0F0Fu,
                           r1.q[j].y & 0x0F0F0F0Fu};
        mma_u8s8_16832(d, lo, b[j].x, b[j].y);  // sub-block 2j
        even[0] += (int)r0.sc[2 * j] * d[0];
        even[1] += (int)r0.sc[2 * j] * d[1];
        even[2] += (int)r1.sc[2 * j] * d[2];
        even[3] += (int)r1.sc[2 * j] * d[3];
        const u32 hi[4] = {r0.q[j].x & 0xF0F0F0F0u, r1.q[j].x & 0xF0F0F0F0u, r0.q[j].y & 0xF0F0F0F0u,
                           r1.q[j].y & 0xF0F0F0F0u};
        mma_u8s8_16832(d, hi, b[j].z, b[j].w);  // sub-block 2j + 1, 16 x
        odd[0] += (int)r0.sc[2 * j + 1] * d[0];
        odd[1] += (int)r0.sc[2 * j + 1] * d[1];
        odd[2] += (int)r1.sc[2 * j + 1] * d[2];
        odd[3] += (int)r1.sc[2 * j + 1] * d[3];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) tot[i] = odd[i] + 16 * even[i];
}

// acc += the level's sums (i8_level) scaled per row (d) and column (s0: column 2c, s1: 2c + 1, times 1/16).
__device__ __forceinline__ void i8_scale_add(const I8Row& r0, const I8Row& r1, const int (&tot)[4], float s0,
                                             float s1, float (&acc)[4]) {
    acc[0] += (float)tot[0] * (r0.d * s0);
    acc[1] += (float)tot[1] * (r0.d * s1);
    acc[2] += (float)tot[2] * (r1.d * s0);
    acc[3] += (float)tot[3] * (r1.d * s1);
}

// The min term: acc -= dmin * sum over sub-blocks of m * (the column's sub-block sum).
__device__ __forceinline__ void i8_min_term(const I8Row& r0, const I8Row& r1, u32 sum, u32 sum2, bool two,
                                            float (&acc)[4]) {
    float cm[4] = {0.f, 0.f, 0.f, 0.f};
    min_mma(cm, r0.mins, r1.mins, sum);
    if (two) min_mma(cm, r0.mins, r1.mins, sum2);
    acc[0] -= r0.dmin * cm[0];
    acc[1] -= r0.dmin * cm[1];
    acc[2] -= r1.dmin * cm[2];
    acc[3] -= r1.dmin * cm[3];
}
