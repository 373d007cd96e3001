// Q4_K x small batch with int8 activations: y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), T <= 5.
//
// The f16 mmvqs spend ~330 instructions on each 16-row superblock (bench/NOTES.md v9-v10: the decoding and mma
// issue, not the loads, bound them). Here a nibble needs no conversion: masking a word of the Q4_K quants gives
// four unsigned 8-bit weights (the high nibbles as 16 q), and mma.m16n8k32 multiplies them by int8 activations
// exactly, one mma per 32-wide sub-block; the sub-block scales are applied to the int32 sums (one IMAD each).
// ~270 instructions a unit (sm_90). Measured on the H200 (bench/NOTES.md v12): 1.15-1.25 x the f16 kernel at one
// token on rows of 6,144 and 17,408, no faster on the 5,120-wide rows, 1.1-1.6 x at 2-4 tokens.
//
// Activations ("act8", written by kernels/act.cu beside the f16 layout): each token's superblock as two int8
// levels, x ~ s q_hi + s_lo q_lo with s = max|x| / 127 over the superblock and s_lo = s / 254, so each value is
// kept to max|x| / 64516 (a relative 1.5e-5 of the largest; f16 keeps 4.9e-4 of each value). Up to 4 tokens, as
// in the packed f16 mode (mmvq.cuh), column n of the mma carries token n's hi level and column T + n its lo level;
// the epilogue scales each column by its own s and folds T + n into n. Above 4 the lo levels take a second mma
// on the same weight fragments. Per group of 8 tokens and superblock sb:
//   q8   [sb][level][8 tokens][256] int8, position p at byte 64 (p / 64) + 16 (p % 32 / 8) + 8 (p / 32 % 2) + p % 8,
//        so lane c's B fragments of sub-blocks 2c', 2c' + 1 are the 16 bytes at 64 c' + 16 c;
//   scale8 [sb][level][8] f32;   sums8, sums8_lo [sb][8 tokens][8] f16: each sub-block's sum of s q_hi + s_lo q_lo
//        (a hi + lo pair), for the min term exactly as the f16 kernels take it.
#include "quants.cuh"
#include "i8q4k.cuh"

#define I8_ZERO_BYTES 256  // the zero column of lanes without one

__device__ __forceinline__ constexpr int i8_slots(int T) { return 2 * T; }
// A stage: the weights, then 2T column slots, 2T sums records (16 bytes) and 2T column scales (f32), padded to
// 16 bytes so that every stage starts aligned for cp.async.
__device__ __forceinline__ constexpr int i8_stage_bytes(int T) {
    return Q4KStage8::BYTES + (I8_SLOT_PITCH + 16) * i8_slots(T) + ((4 * i8_slots(T) + 15) & ~15);
}

// Every copy a lane issues per stage. The source pointers advance by one stage's superblocks after each stage
// (loop-carried, so the compiler keeps them in registers instead of forming each address again from the
// thread index: ~90 instructions of copies a stage that way, ~70 like this).
template <int T>
struct I8Copies {
    const u8* q[4];     // quants: rows lane / 8 + 4 j, 16-byte part lane % 8 (128 bytes per superblock)
    const u8* words;    // lanes 0-15: 16 bytes of the tile's words (stage_words_copy), 256 bytes per superblock
    const u8* col[T];   // activation chunks lane + 32 m: slot (lane + 32 m) / 16 (hi tokens, then lo), 4 KB
    const u8* meta[2];  // lanes below 2T: their slot's sums record (128 bytes per superblock) and scale (64)
    u32 qdst, col_dst, meta_dst[2], words_dst;
    bool words_on;

    // Pointers at superblock sb0 of the tile whose first row is row0: the weights' (init_w) and the activations'
    // (init_x), so that the first stages' weights can be copied before the PDL wait.
    __device__ __forceinline__ void init(const Planes& P, const i8* q8, const float* scale8, const f16* sums,
                                         const f16* sums_lo, int row0, int rows, int nb, int lane, int sb0) {
        init_w(P, row0, rows, nb, lane, sb0);
        init_x(q8, scale8, sums, sums_lo, lane, sb0);
    }

    __device__ __forceinline__ void init_w(const Planes& P, int row0, int rows, int nb, int lane, int sb0) {
        using S = Q4KStage8;
        const int part = lane & 7;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            q[j] = P.p[0] + ((u64)stage_row_base(row0, (lane >> 3) + 4 * j, rows, nb) + sb0) * 128 + 16 * part;
        qdst = S::QS + (lane >> 3) * S::QS_PITCH + 16 * part;  // + 4 QS_PITCH j
        words = P.p[1] + ((u64)stage_unit0(row0, nb) + sb0) * TILE_UNIT + 16 * lane;
        words_dst = S::SC + 16 * lane;
        words_on = lane < 16;
    }

    __device__ __forceinline__ void init_x(const i8* q8, const float* scale8, const f16* sums, const f16* sums_lo,
                                           int lane, int sb0) {
        using S = Q4KStage8;
#pragma unroll
        for (int m = 0; m < T; ++m) {
            const int slot = (lane >> 4) + 2 * m, level = slot < T ? 0 : 1, tok = slot < T ? slot : slot - T;
            col[m] = reinterpret_cast<const u8*>(q8) + (u64)sb0 * 4096 + (level * 8 + tok) * 256 + 16 * (lane & 15);
        }
        col_dst = S::BYTES + I8_SLOT_PITCH * (lane >> 4) + 16 * (lane & 15);  // + 2 I8_SLOT_PITCH m
        const int tok = lane < T ? lane : lane - T, meta0 = S::BYTES + I8_SLOT_PITCH * i8_slots(T);
        meta[0] = reinterpret_cast<const u8*>((lane < T ? sums : sums_lo) + (u64)sb0 * 64 + 8 * tok);
        meta[1] = reinterpret_cast<const u8*>(scale8 + (u64)sb0 * 16 + (lane < T ? 0 : 8) + tok);
        meta_dst[0] = meta0 + 16 * lane;
        meta_dst[1] = meta0 + 16 * i8_slots(T) + 4 * lane;
    }

    // The copies of the current superblock into the stage at dst, then the pointers to the next one (`step`
    // superblocks on).
    __device__ __forceinline__ void issue(u32 dst, int step, bool with_meta) {
        issue_w(dst, step);
        issue_x(dst, step, with_meta);
    }

    __device__ __forceinline__ void issue_w(u32 dst, int step) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            cp_async16_w(dst + qdst + 4 * Q4KStage8::QS_PITCH * j, q[j]);
            q[j] += 128 * step;
        }
        if (words_on) cp_async16_w(dst + words_dst, words);
        words += TILE_UNIT * step;
    }

    __device__ __forceinline__ void issue_x(u32 dst, int step, bool with_meta) {
#pragma unroll
        for (int m = 0; m < T; ++m) {
            cp_async16(dst + col_dst + 2 * I8_SLOT_PITCH * m, col[m]);
            col[m] += 4096 * step;
        }
        if (with_meta) {
            cp_async16(dst + meta_dst[0], meta[0]);
            cp_async4(dst + meta_dst[1], meta[1]);
        }
        meta[0] += 128 * step;
        meta[1] += 64 * step;
    }
};

// y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), W Q4_K, T <= 5 tokens, K a multiple of 256, x in act8 (this
// group's bases). Launch: one block of W warps per TILES consecutive 16-row tiles (the last block may have
// fewer); warp w takes superblocks w, w + W, ... of each tile in turn through a ring of NS stages (weights and
// activation columns by cp.async) that runs on across the tiles, so a warp pays the ring's first wait once per
// block, not once per tile; dynamic shared memory W * (NS * i8_stage_bytes(T) + I8_ZERO_BYTES). HALVES (one tile
// a block): two blocks a tile, each half of its superblocks (kernels/mmvq.cuh MmvqHalf); the first stores y (with
// bias and residual), the second y2.
template <int T, int NS, int TILES, bool HALVES = false>
__global__ void __launch_bounds__(MMVQ_MAX_WARPS * 32, 2)
mmvq_i8(const u8* __restrict__ w, const i8* __restrict__ q8, const float* __restrict__ scale8,
        const f16* __restrict__ sums, const f16* __restrict__ sums_lo, float* __restrict__ y,
        const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K, int ldy,
        float* __restrict__ y2) {
    static_assert(!HALVES || TILES == 1, "halves: one tile a block");
    using S = Q4KStage8;
    constexpr int STAGE = i8_stage_bytes(T), NSLOT = i8_slots(T);
    constexpr int META = S::BYTES + I8_SLOT_PITCH * NSLOT;
    constexpr bool PACKED = T <= 4;  // both levels in one mma's 8 columns
    extern __shared__ __align__(16) u8 stages[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const MmvqHalf part = mmvq_half<HALVES>(K / QK_SB);  // the block's superblocks of its tile
    const int nb = K / QK_SB, tile0 = part.tile * TILES, ntiles = min(TILES, (rows + 15) / 16 - tile0);
    u8* ring = stages + warp * (NS * STAGE + I8_ZERO_BYTES);
    const u32 ring_s = smem_u32(ring);
    // superblocks warp, warp + W, ... of each tile's share (every warp the same count with several tiles a
    // block: the launcher's W divides nb)
    const int n = warp < part.len ? (part.len - warp + num_warps - 1) / num_warps : 0, total = n * ntiles;
    const bool with_meta = lane < NSLOT;
    const Planes P = QTraits<QT_Q4_K>::planes(w, (u64)rows * nb);
    I8Copies<T> cp;
    cp.init_w(P, 16 * tile0, rows, nb, lane, part.begin + warp);
    // The first stages' weights before the PDL wait (nobody writes them), their activations after it; with several
    // tiles a block the first stages may cross into the next tile, so there all of them wait.
    constexpr int EARLY = TILES == 1 ? NS - 1 : 0;
#pragma unroll
    for (int s = 0; s < EARLY; ++s)
        if (s < total) cp.issue_w(ring_s + s * STAGE, num_warps);
    PDL_ENTER();  // the activations are the previous kernel's output
    cp.init_x(q8, scale8, sums, sums_lo, lane, part.begin + warp);
    int next_tile = 1, left_in_tile = n;  // the tile the copier moves to next; units it has left in its tile
    auto issue = [&](u32 dst) {  // the next unit's copies, moving the copier to the next tile at its start
        if constexpr (TILES > 1) {
            if (left_in_tile == 0) {
                cp.init(P, q8, scale8, sums, sums_lo, 16 * (tile0 + next_tile++), rows, nb, lane, warp);
                left_in_tile = n;
            }
            --left_in_tile;
        }
        cp.issue(dst, num_warps, with_meta);
    };
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (s < EARLY && s < total)
            cp.issue_x(ring_s + s * STAGE, num_warps, with_meta);
        else if (s < total)
            issue(ring_s + s * STAGE);
        cp_async_commit();  // stage s's group (the first also holds the weights copied before the wait)
    }
    u8* zero = ring + NS * STAGE;
    for (int k = lane; k < I8_ZERO_BYTES / 16; k += 32) reinterpret_cast<uint4*>(zero)[k] = make_uint4(0u, 0u, 0u, 0u);
    __syncwarp();
    // The lane's columns: packed, slot g (token g's hi level, or token g - T's lo); else slot g (hi) and slot
    // T + g (lo) of token g. A lane without one reads the zero column. Its accumulators' columns 2c, 2c + 1
    // take the scales of those slots (the lo slots' too when unpacked).
    const bool has_col = g < (PACKED ? NSLOT : T);
    const int col_off = has_col ? S::BYTES + I8_SLOT_PITCH * g + 16 * c : NS * STAGE + 16 * c;
    const int col2 = PACKED ? NSLOT : T;  // columns with a scale

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int done_in_tile = 0, tile = 0;
    for (int i = 0; i < total; ++i) {
        __syncwarp();  // every lane is done reading the stage the next copy overwrites
        const int ahead = i + NS - 1;
        if (ahead < total) issue(ring_s + (ahead % NS) * STAGE);
        cp_async_commit();
        cp_async_wait<NS - 1>();  // this lane's copies of unit i have landed
        __syncwarp();             // and every other lane's
        const u8* st = ring + (i % NS) * STAGE;
        const u8* col = (has_col ? st : ring) + col_off;
        const float* sc = reinterpret_cast<const float*>(st + META + 16 * NSLOT);
        I8Row r0, r1;
        i8_read_row(r0, st, g, c);
        i8_read_row(r1, st, g + 8, c);
        uint4 b[4];
        int tot[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const uint4*>(col + 64 * j);
        i8_level(r0, r1, b, tot);
        i8_scale_add(r0, r1, tot, 2 * c < col2 ? 0.0625f * sc[2 * c] : 0.f,
                     2 * c + 1 < col2 ? 0.0625f * sc[2 * c + 1] : 0.f, acc);
        const u32 sum = has_col ? *reinterpret_cast<const u32*>(st + META + 16 * g + 4 * c) : 0u;
        u32 sum_lo = 0u;
        if constexpr (!PACKED) {  // the lo levels: slots T + g
            const u8* col_lo = has_col ? col + T * I8_SLOT_PITCH : col;
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const uint4*>(col_lo + 64 * j);
            i8_level(r0, r1, b, tot);
            i8_scale_add(r0, r1, tot, 2 * c < T ? 0.0625f * sc[T + 2 * c] : 0.f,
                         2 * c + 1 < T ? 0.0625f * sc[T + 2 * c + 1] : 0.f, acc);
            sum_lo = has_col ? *reinterpret_cast<const u32*>(st + META + 16 * (T + g) + 4 * c) : 0u;
        }
        i8_min_term(r0, r1, sum, sum_lo, !PACKED, acc);
        if constexpr (TILES > 1) {
            if (++done_in_tile == n) {  // the tile's last unit: reduce over the warps and store (copies in flight)
                if (tile) __syncthreads();  // every thread is done reading the last tile's sums
                mmvq_store(acc, y, bias, residual, 16 * (tile0 + tile), rows, T, ldy, PACKED);
#pragma unroll
                for (int k = 0; k < 4; ++k) acc[k] = 0.f;
                done_in_tile = 0;
                ++tile;
            }
        }
    }
    cp_async_wait<0>();  // nothing may land in shared memory after the block exits
    if constexpr (HALVES)
        mmvq_store_half(acc, part, y, y2, bias, residual, 16 * tile0, rows, T, ldy, PACKED);
    else if constexpr (TILES == 1)
        mmvq_store(acc, y, bias, residual, 16 * tile0, rows, T, ldy, PACKED);
}
