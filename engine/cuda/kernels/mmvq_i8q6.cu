// Q6_K x 1-8 tokens with int8 activations: y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual).
//
// The f16 Q6_K kernels turn every 6-bit weight into an f16 (q - 32) * scale and multiply f16 hi + lo activations:
// ffn_down ran at 2.35 TB/s, the slowest bytes of the 27B pass (bench/NOTES.md v20). Here a weight needs no
// conversion to float: its low nibble and two high bits give q - 32 as a signed byte in a few logic ops, and
// mma.m16n8k32 multiplies it by the act8 copy's int8 levels exactly (kernels/mmvq_i8.cu: the same copy, the same
// ring of cp.async stages, the same launch), the 16-wide sub-block scales applied to the int32 sums.
//
// Positions. Lane (g, c) reads what mmvq_i8's Q4_K lanes read: of 64-position chunk j, the 8 bytes of ql' chunk j
// at 8c, whose low nibbles are positions 64j + 8c .. + 7 (k 4c .. 4c + 3 and 16 + 4c .. + 3 of the chunk's "low"
// mma) and high nibbles 64j + 32 + 8c .. + 7 (its "high" mma); the act8 copy's 16 bytes at 64j + 16c hold the same
// positions. Their high bits: qh' chunk j's bytes 8 (c % 2) .. + 7, at bit 4 (c / 2) (low) and 4 (c / 2) + 2
// (high), in repack.py's order.
//
// Sub-blocks of 16. One mma's 32 k hold two of Q6_K's sub-blocks: lanes c = 0, 1 carry the first, lanes 2, 3 the
// second. So each sub-block gets columns of its own: a column's B is its (token, level) activations from the lanes
// of its sub-block and zero from the others, and a set of sums holds S = 8 / P sub-blocks side by side (P = 2T
// columns a sub-block: the T tokens' hi levels, then their lo levels; past 4 tokens P = T, a pass a level). A
// lane's two columns always belong to one sub-block, so one IMAD a sum applies its scale. T = 1: a chunk's four
// sub-blocks in one set (2 mmas); T = 2: two sets (2 mmas); T = 3, 4: a set a sub-block (4 mmas, half of each
// mma's k zero); T = 5-8: the same for each level (8 mmas). The epilogue folds every column into its token.
#include "quants.cuh"
#include "i8q6k.cuh"

#define Q6I8_SLOT_PITCH 320  // a 256-byte column slot + 64, as mmvq_i8's: two slots of a quarter-warp's reads sit apart

// A stage: the tile's 16 rows of ql' [16][160] | qh' [16][80] | scales [16][16] | d words [16][4] (pitches that
// keep a half-warp's 8-byte reads of four rows in different banks), then 2T column slots and their 2T scales.
using Q6I8Stage = Q6KStage8;  // kernels/i8q6k.cuh

__device__ __forceinline__ constexpr int q6i8_stage_bytes(int T) {  // mirrored by engine/cuda/ops.py
    return Q6I8Stage::BYTES + Q6I8_SLOT_PITCH * 2 * T + ((8 * T + 15) & ~15);
}

// Every copy a lane issues per stage (the pointers advance by `step` superblocks after each).
template <int T>
struct Q6I8Copies {
    const u8* ql[4];   // ql' 16-byte part lane % 8 of rows lane / 8 + 4 j
    const u8* qh[2];   // qh' 16-byte part lane % 4 of rows lane / 4 + 8 j
    const u8* sc;      // lanes 0-15: row lane's 16 scales
    const u8* d;       // lanes 16-31: the plane of d (row lane - 16's at block index idx)
    u64 idx, ntot;
    const u8* col[T];  // activation chunks lane + 32 m: slot (lane + 32 m) / 16 (hi tokens, then lo), 4 KB a superblock
    const u8* scale;   // lanes below 2T: their slot's level scale
    u32 ql_dst, qh_dst, sc_dst, col_dst, scale_dst;

    // The weights' pointers (init_w) and the activations' (init_x), at superblock sb0 of the tile at row0: the
    // first stages' weights are copied before the PDL wait, their activations after it.
    __device__ __forceinline__ void init_w(const Planes& P, int row0, int rows, int nb, int lane, int sb0) {
        using S = Q6I8Stage;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            ql[j] = P.p[0] + ((u64)stage_row_base(row0, (lane >> 3) + 4 * j, rows, nb) + sb0) * 128 + 16 * (lane & 7);
#pragma unroll
        for (int j = 0; j < 2; ++j)
            qh[j] = P.p[1] + ((u64)stage_row_base(row0, (lane >> 2) + 8 * j, rows, nb) + sb0) * 64 + 16 * (lane & 3);
        ql_dst = S::QL + (lane >> 3) * S::QL_PITCH + 16 * (lane & 7);  // + 4 QL_PITCH j
        qh_dst = S::QH + (lane >> 2) * S::QH_PITCH + 16 * (lane & 3);  // + 8 QH_PITCH j
        idx = (u64)stage_row_base(row0, lane & 15, rows, nb) + sb0;
        ntot = (u64)rows * nb;
        sc = P.p[2] + idx * 16;
        d = P.p[3];
        sc_dst = lane < 16 ? S::SC + 16 * lane : S::D + 4 * (lane - 16);
    }

    __device__ __forceinline__ void init_x(const i8* q8, const float* scale8, int lane, int sb0) {
        using S = Q6I8Stage;
#pragma unroll
        for (int m = 0; m < T; ++m) {
            const int slot = (lane >> 4) + 2 * m, level = slot < T ? 0 : 1, tok = slot < T ? slot : slot - T;
            col[m] = reinterpret_cast<const u8*>(q8) + (u64)sb0 * 4096 + (level * 8 + tok) * 256 + 16 * (lane & 15);
        }
        col_dst = S::BYTES + Q6I8_SLOT_PITCH * (lane >> 4) + 16 * (lane & 15);  // + 2 SLOT_PITCH m
        const int slot = lane < 2 * T ? lane : 0, tok = slot < T ? slot : slot - T;
        scale = reinterpret_cast<const u8*>(scale8 + (u64)sb0 * 16 + (slot < T ? 0 : 8) + tok);
        scale_dst = S::BYTES + Q6I8_SLOT_PITCH * 2 * T + 4 * lane;
    }

    // A stage's copies into dst, then the pointers `step` superblocks on: the weights, the activations.
    __device__ __forceinline__ void issue_w(u32 dst, int step, int lane) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            cp_async16_w(dst + ql_dst + 4 * Q6I8Stage::QL_PITCH * j, ql[j]);
            ql[j] += 128 * step;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            cp_async16_w(dst + qh_dst + 8 * Q6I8Stage::QH_PITCH * j, qh[j]);
            qh[j] += 64 * step;
        }
        if (lane < 16) {
            cp_async16_w(dst + sc_dst, sc);
        } else {
            q6k_d_word_copy(dst + sc_dst, d, idx, ntot);
        }
        sc += 16 * step;
        idx += step;
    }

    __device__ __forceinline__ void issue_x(u32 dst, int step, int lane) {
#pragma unroll
        for (int m = 0; m < T; ++m) {
            cp_async16(dst + col_dst + 2 * Q6I8_SLOT_PITCH * m, col[m]);
            col[m] += 4096 * step;
        }
        if (lane < 2 * T) cp_async4(dst + scale_dst, scale);
        scale += 64 * step;
    }

    __device__ __forceinline__ void issue(u32 dst, int step, int lane) {
        issue_w(dst, step, lane);
        issue_x(dst, step, lane);
    }
};

// Launch: a block of W warps per 16-row tile; warp w takes superblocks w, w + W, ... (any W: the last warps may
// take one fewer) through a ring of NS stages; dynamic shared memory W * NS * q6i8_stage_bytes(T). HALVES: two
// blocks a tile, each half of its superblocks (kernels/mmvq.cuh MmvqHalf); the first stores y (with bias and
// residual), the second y2.
template <int T, int NS, bool HALVES = false>
__global__ void __launch_bounds__(MMVQ_MAX_WARPS * 32, 2)
mmvq_q6_i8(const u8* __restrict__ w, const i8* __restrict__ q8, const float* __restrict__ scale8,
           float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K,
           int ldy, float* __restrict__ y2) {
    using S = Q6I8Stage;
    constexpr int L = 2 * T <= MMVQ_NCOLS ? 1 : 2;          // passes: one, or a level each
    constexpr int P = L == 1 ? 2 * T : T;                   // columns a sub-block
    constexpr int SUBS = MMVQ_NCOLS / P >= 4 ? 4 : MMVQ_NCOLS / P;  // sub-blocks a set of sums
    constexpr int SETS = 4 / SUBS, USED = SUBS * P;         // sets a chunk; columns that carry a sub-block
    constexpr int STAGE = q6i8_stage_bytes(T), SCALES = S::BYTES + Q6I8_SLOT_PITCH * 2 * T;
    extern __shared__ __align__(16) u8 stages[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3, half = c >> 1;
    const MmvqHalf part = mmvq_half<HALVES>(K / QK_SB);  // the block's superblocks of its tile
    const int nb = K / QK_SB, row0 = 16 * part.tile;
    u8* ring = stages + warp * NS * STAGE;
    const u32 ring_s = smem_u32(ring);
    const int n = warp < part.len ? (part.len - warp + num_warps - 1) / num_warps : 0;
    const Planes P6 = QTraits<QT_Q6_K>::planes(w, (u64)rows * nb);
    Q6I8Copies<T> cp;
    cp.init_w(P6, row0, rows, nb, lane, part.begin + warp);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s)
        if (s < n) cp.issue_w(ring_s + s * STAGE, num_warps, lane);
    PDL_ENTER();  // the activations are the previous kernel's output (the weights are nobody's: copied before)
    cp.init_x(q8, scale8, lane, part.begin + warp);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (s < n) cp.issue_x(ring_s + s * STAGE, num_warps, lane);
        cp_async_commit();  // stage s's group: its activations (and, for s = 0, the weights copied before)
    }
    // The lane's column g: sub-block u of a set, its slot per pass; on[set][h]: whether the lane's bytes of the
    // chunk's low (h = 0) or high (h = 1) mma belong to that column's sub-block.
    const bool has_col = g < USED;
    const int u = g / P, q = g % P;
    bool on[SETS][2];
#pragma unroll
    for (int set = 0; set < SETS; ++set)
#pragma unroll
        for (int h = 0; h < 2; ++h) on[set][h] = has_col && set * SUBS + u == 2 * h + half;
    int slot[L];
#pragma unroll
    for (int lv = 0; lv < L; ++lv) slot[lv] = has_col ? (L == 1 ? q : lv * T + q) : 0;
    // The lane's sums: columns 2c, 2c + 1, of sub-block set * SUBS + m_in of each set; their scales per pass
    const int m_in = min(2 * c / P, SUBS - 1);
    int col_slot[L][2];
#pragma unroll
    for (int lv = 0; lv < L; ++lv)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = 2 * c + e;
            col_slot[lv][e] = col < USED ? (L == 1 ? col % P : lv * T + col) : -1;
        }
    const u32 rbase0 = stage_row_base(row0, g, rows, nb), rbase1 = stage_row_base(row0, g + 8, rows, nb);

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < n; ++i) {
        __syncwarp();  // every lane is done reading the stage the next copy overwrites
        if (i + NS - 1 < n) cp.issue(ring_s + ((i + NS - 1) % NS) * STAGE, num_warps, lane);
        cp_async_commit();
        cp_async_wait<NS - 1>();  // this lane's copies of unit i have landed
        __syncwarp();             // and every other lane's
        const u8* st = ring + (i % NS) * STAGE;
        const int sb = part.begin + warp + i * num_warps;
        const uint4 sc0 = *reinterpret_cast<const uint4*>(st + S::SC + 16 * g);
        const uint4 sc1 = *reinterpret_cast<const uint4*>(st + S::SC + 16 * (g + 8));
        const u32 scw0[4] = {sc0.x, sc0.y, sc0.z, sc0.w}, scw1[4] = {sc1.x, sc1.y, sc1.z, sc1.w};
        int isum[L][4];
#pragma unroll
        for (int lv = 0; lv < L; ++lv)
#pragma unroll
            for (int k = 0; k < 4; ++k) isum[lv][k] = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            u32 a[2][4];  // A fragments of the chunk's low (a[0]) and high (a[1]) mma
            q6_frags(st, g, c, j, a);
#pragma unroll
            for (int lv = 0; lv < L; ++lv) {
                const uint4 b = *reinterpret_cast<const uint4*>(st + S::BYTES + Q6I8_SLOT_PITCH * slot[lv] + 64 * j + 16 * c);
#pragma unroll
                for (int set = 0; set < SETS; ++set) {
                    int d[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        if (set * SUBS > 2 * h + 1 || 2 * h >= set * SUBS + SUBS) continue;  // no sub-block of this half
                        const u32 b0 = on[set][h] ? (h ? b.z : b.x) : 0u, b1 = on[set][h] ? (h ? b.w : b.y) : 0u;
                        mma_s8s8_16832_acc(d, a[h], b0, b1);
                    }
                    const int shift = 8 * (set * SUBS + m_in);  // the lane's sub-block of the chunk: scale byte 4j + m
                    const int s0 = sbyte(scw0[j], shift), s1 = sbyte(scw1[j], shift);
                    isum[lv][0] += s0 * d[0];
                    isum[lv][1] += s0 * d[1];
                    isum[lv][2] += s1 * d[2];
                    isum[lv][3] += s1 * d[3];
                }
            }
        }
        const float d0 = f16_to_f32((f16)q6k_d_of_word(*reinterpret_cast<const u32*>(st + S::D + 4 * g), rbase0 + sb));
        const float d1 =
            f16_to_f32((f16)q6k_d_of_word(*reinterpret_cast<const u32*>(st + S::D + 4 * (g + 8)), rbase1 + sb));
        const float* scales = reinterpret_cast<const float*>(st + SCALES);
#pragma unroll
        for (int lv = 0; lv < L; ++lv) {
            const float s0 = col_slot[lv][0] >= 0 ? scales[col_slot[lv][0]] : 0.f;
            const float s1 = col_slot[lv][1] >= 0 ? scales[col_slot[lv][1]] : 0.f;
            acc[0] += (float)isum[lv][0] * (d0 * s0);
            acc[1] += (float)isum[lv][1] * (d0 * s1);
            acc[2] += (float)isum[lv][2] * (d1 * s0);
            acc[3] += (float)isum[lv][3] * (d1 * s1);
        }
    }
    cp_async_wait<0>();  // nothing may land in shared memory after the block exits
    if constexpr (HALVES)  // token t: columns t, t + T, ... < USED
        mmvq_store_half(acc, part, y, y2, bias, residual, row0, rows, T, ldy, false, USED);
    else
        mmvq_store(acc, y, bias, residual, row0, rows, T, ldy, false, USED);
}
