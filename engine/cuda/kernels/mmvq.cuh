// What the mmvq kernels share (kernels/mmvq.cu, kernels/mmvq_persist.cu): the act layout, the min-term mma, and
// the per-superblock product of the cp.async-pipelined kernels with its column packing.
#pragma once
#include "common.cuh"
#include "quants.cuh"
#include "stage.cuh"

#define MMVQ_MAX_WARPS 8
#define MMVQ_NCOLS 8

// Activation layout ("act", quants.cuh act_index): positions past K hold zeros. Sums: sums[(sb * 8 + n) * 8 + j] =
// sum of x[n][256 sb + 32 j .. + 31] (f16).

// The min term of Q4_K/Q5_K: sum over sub-blocks of m * (sum of x over the sub-block), k-slots 2c, 2c+1 only.
__device__ __forceinline__ void min_mma(float (&cm)[4], u32 m0, u32 m1, u32 sums_pair) {
    u32 bm[2] = {sums_pair, 0u};
    u32 am[4] = {m0, m1, 0u, 0u};
    mma_f16_16816(cm, am, bm);
}

// ---- the pipelined kernels' product (K-quants, weights staged through shared memory) ----
//
// Columns: for T <= 4 the mma's 8 columns carry each token twice: column n the f16 activations and the hi
// sub-block sums, column T + n the activations' rounding residue (precise mode; zeros otherwise) and the lo
// sums; the epilogue adds the two columns. So precise mode and the exact min term cost no second mma at T <= 4.
// For T > 4, TWO runs the residue as a second mma per step (precise), and the lo sums get a second min mma.

// One superblock from B fragments already loaded (b; bl for TWO: the residue's).
template <int QT, bool TWO>
__device__ __forceinline__ void mmvq_cp_product(const typename QTraits<QT>::Row (&r)[2], const u32 (&b)[SB_STEPS][2],
                                                const u32 (&bl)[TWO ? SB_STEPS : 1][2], u32 sum1, u32 sum2,
                                                bool two_sums, int c, float (&acc)[4]) {
    using Q = QTraits<QT>;
    static_assert(Q::BLOCK_SCALE, "the pipelined mmvq is for the K-quants (a per-superblock scale d)");
    typename Q::Consts k[2];
    Q::prepare(r[0], c, k[0]);
    Q::prepare(r[1], c, k[1]);
    // one accumulator chain: splitting it in two or four bought nothing (bench/NOTES.md v10)
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        u32 f[4];
        Q::frag(r[0], k[0], c, s, f[0], f[2]);
        Q::frag(r[1], k[1], c, s, f[1], f[3]);
        mma_f16_16816(blk, f, b[s]);
        if constexpr (TWO) mma_f16_16816(blk, f, bl[s]);
    }
    const float d0 = Q::dscale(r[0]), d1 = Q::dscale(r[1]);
    acc[0] += d0 * blk[0];
    acc[1] += d0 * blk[1];
    acc[2] += d1 * blk[2];
    acc[3] += d1 * blk[3];
    if constexpr (Q::HAS_MIN) {
        float cm[4] = {0.f, 0.f, 0.f, 0.f};
        min_mma(cm, k[0].mins, k[1].mins, sum1);
        if (two_sums) min_mma(cm, k[0].mins, k[1].mins, sum2);
        const float m0 = Q::mscale(r[0]), m1 = Q::mscale(r[1]);
        acc[0] -= m0 * cm[0];
        acc[1] -= m0 * cm[1];
        acc[2] -= m1 * cm[2];
        acc[3] -= m1 * cm[3];
    }
}

// The lane's B fragments of one superblock from global memory (through L1): step s at a + 128 s; null: zeros.
__device__ __forceinline__ void load_b_global(u32 (&b)[SB_STEPS][2], const f16* a) {
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        const uint2 v = a ? ld_cached_u2(a + 128 * s) : make_uint2(0u, 0u);
        b[s][0] = v.x;
        b[s][1] = v.y;
    }
}

// One superblock: b from column source a (null: a zero column), bl from a2 (TWO only).
template <int QT, bool TWO>
__device__ __forceinline__ void mmvq_cp_compute(const typename QTraits<QT>::Row (&r)[2], const f16* a, const f16* a2,
                                                u32 sum1, u32 sum2, bool two_sums, int c, float (&acc)[4]) {
    u32 b[SB_STEPS][2], bl[TWO ? SB_STEPS : 1][2];
    load_b_global(b, a);
    if constexpr (TWO) load_b_global(bl, a2);
    mmvq_cp_product<QT, TWO>(r, b, bl, sum1, sum2, two_sums, c, acc);
}

// ---- activations staged beside the weights (mmvq.cu mmvq_cpa, packed columns only: T <= 4) ----
//
// Read through L1, each superblock's activation fragments mostly missed it (bench/NOTES.md v10: the same loads
// from one always-resident superblock ran 1.2 x faster over ffn gate|up), and every unit waited an L2 round trip
// for them before its mma chain. In mmvq_cpa the stage carries them: after the weight bytes, nslot slots of
// [16 steps][32 bytes] at a pitch of 544 bytes (the four slots a half-warp reads sit in different banks): slot
// j < T token j of act, slot T + j token j of act_lo (precise; nslot = 2T, else T); then the sub-block sums,
// [2T][16 bytes]: hi sums of tokens 0..T-1, then the lo sums. Packed lane g reads slot g at fixed offsets (no
// address arithmetic per step); a lane without a slot reads the warp's zero step row (ACT_ZERO_BYTES, once
// per warp after its ring).
#define ACT_SLOT_PITCH 544
#define ACT_ZERO_BYTES 512
__device__ __forceinline__ int staged_act_slots(int T, bool lo) { return lo ? 2 * T : T; }
__device__ __forceinline__ int staged_act_bytes(int T, bool lo, bool has_min) {
    return ACT_SLOT_PITCH * staged_act_slots(T, lo) + (has_min ? 32 * T : 0);
}

// The copies of superblock sb's activations (act, act_lo: the group's bases) into the stage part at dst. Copy
// q = lane + 32 m: slot q / 32 (hi tokens first, then lo), step (q / 2) % 16, half q % 2; lanes below 2T then
// copy one sums chunk each.
// OPENJET_STAGE_ACT_L1 (a measurement build, bench/gpu_stream.py): the copies allocate in L1 (cp.async.ca), so
// the next block on the SM finds the activations there instead of in L2.
#ifdef OPENJET_STAGE_ACT_L1
#define STAGE_ACT_COPY cp_async16_ca
#else
#define STAGE_ACT_COPY cp_async16
#endif
template <bool HAS_MIN>
__device__ __forceinline__ void staged_act_copy(u32 dst, const f16* act, const f16* act_lo, const f16* sums,
                                                const f16* sums_lo, int sb, int T, bool lo, int lane) {
    const int nslot = staged_act_slots(T, lo), s = lane >> 1, h = lane & 1;
    const u64 off = (u64)sb * 4096 + 256 * s + 16 * h;
    for (int j = 0; j < nslot; ++j) {  // one copy per lane and slot
        const int tok = j < T ? j : j - T;
        const u8* src = reinterpret_cast<const u8*>(j < T ? act : act_lo) + off + 32 * tok;
        STAGE_ACT_COPY(dst + ACT_SLOT_PITCH * j + 32 * s + 16 * h, src);
    }
    if (HAS_MIN && lane < 2 * T) {
        const f16* src = lane < T ? sums + (u64)sb * 64 + 8 * lane : sums_lo + (u64)sb * 64 + 8 * (lane - T);
        STAGE_ACT_COPY(dst + ACT_SLOT_PITCH * nslot + 16 * lane, src);
    }
}

// The lane's B fragments of one superblock from its column of a stage (staged_act_copy) or the zero row.
__device__ __forceinline__ void load_b_staged(u32 (&b)[SB_STEPS][2], const u8* column) {
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        const uint2 v = *reinterpret_cast<const uint2*>(column + 32 * s);
        b[s][0] = v.x;
        b[s][1] = v.y;
    }
}

// The B column of lane (g, c): token g (hi), or when packed token g - T's residue (lo). The pointers are those
// of superblock 0; null means a zero column (or no second sum).
struct CpColumns {
    const f16* a;   // the first mma's column
    const f16* a2;  // the second mma's column (TWO: the residue of token g)
    const u32* s1;  // the sub-block sums of the min term (hi, or lo where the lane carries the residue)
    const u32* s2;  // the lo sums as a second min mma (unpacked only)
    bool packed;    // columns T + n fold into n in the epilogue
};

template <bool LO, bool TWO>
__device__ __forceinline__ CpColumns cp_columns(const f16* act, const f16* sums, const f16* act_lo,
                                                const f16* sums_lo, int T, int g, int c) {
    CpColumns k;
    k.packed = !TWO && T <= 4;
    const bool hi = g < T, lo = k.packed && !hi && g < 2 * T;
    const int tok = hi ? g : g - T;
    k.a = hi ? act + tok * 16 + 4 * c : (LO && lo) ? act_lo + tok * 16 + 4 * c : nullptr;
    k.a2 = (TWO && hi) ? act_lo + tok * 16 + 4 * c : nullptr;
    k.s1 = hi ? reinterpret_cast<const u32*>(sums + tok * 8 + 2 * c)
         : lo ? reinterpret_cast<const u32*>(sums_lo + tok * 8 + 2 * c) : nullptr;
    k.s2 = (!k.packed && hi) ? reinterpret_cast<const u32*>(sums_lo + tok * 8 + 2 * c) : nullptr;
    return k;
}

// Superblock sb of the lane's two rows r (already read from a stage) into acc.
template <int QT, bool TWO>
__device__ __forceinline__ void cp_superblock(const CpColumns& k, const typename QTraits<QT>::Row (&r)[2], int sb,
                                              int c, float (&acc)[4]) {
    u32 sum1 = 0u, sum2 = 0u;
    if (QTraits<QT>::HAS_MIN) {
        sum1 = k.s1 ? __ldg(k.s1 + 32 * sb) : 0u;
        sum2 = k.s2 ? __ldg(k.s2 + 32 * sb) : 0u;
    }
    mmvq_cp_compute<QT, TWO>(r, k.a ? k.a + 2048 * sb : nullptr, k.a2 ? k.a2 + 2048 * sb : nullptr, sum1, sum2,
                             !k.packed, c, acc);
}

// The warps' partial sums of the block's 16 rows, reduced and stored: token n the sum of columns n, n + T, ...
// below `used` (0: 2T when packed, the lo levels' columns T + n folded into n, else T).
__device__ __forceinline__ void mmvq_store(const float (&acc)[4], float* __restrict__ y, const float* __restrict__ bias,
                                           const float* __restrict__ residual, int row0, int rows, int T, int ldy,
                                           bool packed, int used = 0) {
    __shared__ float red[MMVQ_MAX_WARPS][16][MMVQ_NCOLS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    red[warp][g][2 * c] = acc[0];
    red[warp][g][2 * c + 1] = acc[1];
    red[warp][g + 8][2 * c] = acc[2];
    red[warp][g + 8][2 * c + 1] = acc[3];
    __syncthreads();
    if (used == 0) used = packed ? 2 * T : T;
    for (int o = threadIdx.x; o < 16 * MMVQ_NCOLS; o += blockDim.x) {
        const int lr = o / MMVQ_NCOLS, col = o % MMVQ_NCOLS, row = row0 + lr;
        if (col >= T || row >= rows) continue;
        float v = 0.f;
        for (int wi = 0; wi < num_warps; ++wi) {
            float w = red[wi][lr][col];  // a warp's columns first, so packed sums still round as v += (hi + lo)
            for (int n = col + T; n < used; n += T) w += red[wi][lr][n];
            v += w;
        }
        if (bias) v += bias[row];
        if (residual) v += residual[(i64)col * ldy + row];
        y[(i64)col * ldy + row] = v;
    }
}

// ---- a tile's superblocks in two halves (mmvq_i8, mmvq_q6_i8 at HALVES; engine/cuda/ops.py DOWN_HALVES) ----
//
// ffn_down's 320 tiles on 132 SMs: a block a tile puts 3 blocks on 56 SMs and 2 on the others, and the launch lasts
// as long as the SMs with 3. In two blocks a tile (640 of 34 superblocks: 4 or 5 an SM) the work evens out. The
// halves are not summed here (a count, a fence and a second read at the tail of every tile cost more than the
// balance gained, bench/NOTES.md Z21): the first stores y = its sum + bias + residual, the second y2 = its sum, and
// the next kernel that reads the row (the next layer's input RMSNorm, kernels/act.cu) adds them.
struct MmvqHalf {
    int tile;   // the block's tile
    int begin;  // its first superblock of the tile's row
    int len;    // its superblocks
    int piece;  // 0: the first half (stores y), 1: the second (y2)
};

template <bool HALVES>
__device__ __forceinline__ MmvqHalf mmvq_half(int nb) {
    if (!HALVES) return {(int)blockIdx.x, 0, nb, 0};
    const int piece = blockIdx.x & 1, first = nb / 2;  // blocks 2t, 2t + 1: the halves of tile t
    return {(int)(blockIdx.x >> 1), piece ? first : 0, piece ? nb - first : first, piece};
}

// mmvq_store of one half: the first with bias and residual into y, the second bare into y2.
__device__ __forceinline__ void mmvq_store_half(const float (&acc)[4], const MmvqHalf& half, float* __restrict__ y,
                                                float* __restrict__ y2, const float* __restrict__ bias,
                                                const float* __restrict__ residual, int row0, int rows, int T,
                                                int ldy, bool packed, int used = 0) {
    if (half.piece == 0)
        mmvq_store(acc, y, bias, residual, row0, rows, T, ldy, packed, used);
    else
        mmvq_store(acc, y2, nullptr, nullptr, row0, rows, T, ldy, packed, used);
}
