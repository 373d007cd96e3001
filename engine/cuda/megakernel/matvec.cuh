// The megakernel's matmul: 16-row tiles of a weight times up to 8 activation rows, by all consumer warps, with
// the weight formats and fragment order of kernels/quants.cuh (each weight block decoded once for every row:
// tensor-core mma.m16n8k16, N = 8). Pieces of split tiles: pieces.cuh; the loader's L2 prefetch: prefetch.cuh.
//
// Columns of the mma: with ncols <= 4 rows, column n carries row n's f16 activations and the hi sub-block sums,
// column ncols + n its rounding residue and the lo sums, folded together after the reduction, so the precise
// (f32-level) product costs no extra mma; with more rows the residues take a second mma of the same fragments.
//
// K-quant weights (Q4_K, Q5_K, Q6_K) stream through shared memory (mv_batch_cp): a batch of up to MV_BATCH tiles
// is cut into (tile, superblock) units, each consumer warp takes a contiguous eighth of them through its own ring of
// cp.async stages (kernels/stage.cuh, the per-op mmvq_cp's) without meeting the others, and one barrier later the
// warps' partial sums are added in warp order; at one activation row (d = 0) the row's activations ride in the
// same stages (ActStage), so no unit waits an L2 round trip for them. A Q4_K matmul of one row whose act has an
// int8 copy (act_h) takes that instead (MK_MV_I8: mv_int8.cuh, kernels/i8q4k.cuh's mma.m16n8k32 on the nibbles,
// the two levels packed in columns 0 and 1 as the f16 hi and lo are). The other types read their weights into
// registers, one superblock ahead, a tile at a time (mv_tile).
#pragma once
#include "mk_common.cuh"
#include "stage.cuh"
#include "mv_int8.cuh"

// Tiles a batch takes: 16 where shared memory has 128 KB (FFN_UP's 128-160 rows an SM in one batch of gate and
// one of up: a batch costs its ring's fill and drain and two barriers), 4 in 96 KB.
#ifndef MK_MV_BATCH
#define MK_MV_BATCH (MK_SMEM_BYTES >= 128 * 1024 ? 16 : 4)
#endif
#define MV_BATCH MK_MV_BATCH
// Tiles one warp's unit range of a batch can touch: at most ceil(MV_BATCH / warps) tiles' worth of units, from
// anywhere in a tile. Each warp's partial sums keep only those (red), not the batch's every tile.
#define MV_RED_TILES ((MV_BATCH + MK_CONSUMER_WARPS - 1) / MK_CONSUMER_WARPS + 1)
#define MV_OUT_FLOATS (MV_BATCH * 128)  // out [tiles][16][8]
#define MV_SCRATCH_FLOATS (MV_OUT_FLOATS + MK_CONSUMER_WARPS * MV_RED_TILES * 128)  // then red [warps][tiles][16][8]
// The ops' own buffers, after the matmul's out and red: ffn_up's gate and up values for a batch's rows.
#define MK_OP_FLOATS (2 * MK_MAX_ROWS * MK_TILE_ROWS * MV_BATCH)
// The rings live after the first MK_RING_OFFSET bytes of the scratch area, one per consumer warp.
#define MK_RING_OFFSET (4 * (MV_SCRATCH_FLOATS + MK_OP_FLOATS))
#define MK_RING_WARP_BYTES ((MK_SMEM_BYTES - MK_RING_OFFSET) / MK_CONSUMER_WARPS)
#ifndef MK_MV_PROBE
#define MK_MV_PROBE 0  // a timing probe, results wrong: 1 skips the decode and mma, 2 the weight copies, 3 both
#endif
#ifndef MK_STAGED
#define MK_STAGED 1  // 0: every type through registers (the first GPU runs' matmul; a benchmark knob)
#endif

// Stages a warp's ring asks for: the per-op kernels' depth unless MK_RING_STAGES (a benchmark knob) says more; as
// many as fit in the warp's share of the ring bytes.
#ifndef MK_RING_STAGES
#define MK_RING_STAGES 0
#endif
// RESERVED: bytes at the start of the ring area that the batch keeps for itself (A8_SMEM's activations).
// Stages of S's weights and act_bytes of activations a warp's share of the ring area holds (after `reserved`
// bytes), at most the per-op kernels' depth or MK_RING_STAGES.
template <class S> constexpr int mv_ring_stages(int act_bytes, int reserved) {
    const int want = MK_RING_STAGES ? MK_RING_STAGES : S::STAGES, bytes = S::BYTES + act_bytes;
    const int warp_bytes = (MK_SMEM_BYTES - MK_RING_OFFSET - reserved) / MK_CONSUMER_WARPS;
    return want * bytes <= warp_bytes ? want : warp_bytes / bytes;
}
template <class S, int ACT_BYTES = 0, int RESERVED = 0> struct MvRing {
    static constexpr int BYTES = S::BYTES + ACT_BYTES;  // one unit's stage: its weights, then activations
    static constexpr int STAGES = mv_ring_stages<S>(ACT_BYTES, RESERVED);
    static_assert(STAGES >= 2, "a ring of one stage cannot overlap copies with compute");
    static_assert(MK_RING_OFFSET % 16 == 0 && BYTES % 16 == 0, "cp.async stages start on 16 bytes");
};

// MK_F16_SWAP=1 (a benchmark knob, off until measured): Q4_K's f16 stages (MIX_OUT at one row, every Q4_K matmul
// at 2-5 rows) at the int8 stages' 160-byte pitch instead of 144. At 144 every odd row's 16-byte chunks land 16
// bytes off the 32-byte sector they come from (round 9: the same offset on the whole ring cost the loops 4-12 %);
// at 160 they do not, and an odd row's lanes read their second chunk first, which keeps a quarter-warp's reads of
// two rows in different banks as the 144-byte pitch did (two rows' first loads: 0, 32, 64, 96 and 176, 208, 240,
// 272 mod 128). The row's fragment is the same.
#ifndef MK_F16_SWAP
#define MK_F16_SWAP 0
#endif
template <int PITCH> struct Q4KStageSwap : Q4KStage<PITCH> {
    using B = Q4KStage<PITCH>;
    static __device__ __forceinline__ void read(QTraits<QT_Q4_K>::Row& r, const u8* st, int lr, int c, u32 idx) {
        const int odd = lr & 1;
        const u8* q = st + B::QS + lr * B::QS_PITCH + 32 * c;
        const uint4 first = *reinterpret_cast<const uint4*>(q + 16 * odd);
        const uint4 second = *reinterpret_cast<const uint4*>(q + 16 - 16 * odd);
        r.q[0] = odd ? second : first;
        r.q[1] = odd ? first : second;
        const u32* sc = reinterpret_cast<const u32*>(st + B::SC + 12 * lr);
        r.s[0] = sc[0];
        r.s[1] = sc[1];
        r.s[2] = sc[2];
        r.dm = *reinterpret_cast<const u32*>(st + B::DM + 4 * lr);
    }
};
// The stage of QT's f16 (not int8) kinds.
template <int QT> struct MvF16Stage { using type = Stage<QT>; };
#if MK_F16_SWAP
template <> struct MvF16Stage<QT_Q4_K> { using type = Q4KStageSwap<160>; };
#endif

// The lane's activations for one superblock: the step operands of its column from act pointer `a` (null: a zero
// column) and the sub-block sums word the K-quant offset term takes. Loaded apart from the multiply, so that the
// staged matmul can have the next superblock's on their way (L2) while one is multiplied.
struct MvAct {
    u32 b[SB_STEPS][2];
    u32 sum;
};
template <bool HAS_MIN>
__device__ __forceinline__ void mv_act_load(const f16* a, const u32* sums, int sb, MvAct& x) {
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        const uint2 v = a ? ld_cg_u2(a + 2048 * sb + 128 * s) : make_uint2(0u, 0u);
        x.b[s][0] = v.x;
        x.b[s][1] = v.y;
    }
    x.sum = HAS_MIN && sums ? ld_cg_u32(sums + 32 * sb) : 0u;
}

// One token's activations staged with a unit's weights (MK_MV_ACT_STAGED, ncols = 1): its superblock's mma
// B-operand words for the two packed columns (the f16 hi part, then the residue), [step][column][4 lanes][8 bytes],
// then each column's 16-byte sub-block sums. Copied by cp.async with the weights, so a unit no longer waits an L2
// round trip for its activations (bench/MEGAKERNEL.md round 4: ~a third of FFN_UP's time with the weights gone).
#ifndef MK_MV_ACT_STAGED
#define MK_MV_ACT_STAGED 1
#endif
struct ActStage {
    static constexpr int COLS = 2, FRAG = 0, SUMS = SB_STEPS * COLS * 32, BYTES = SUMS + COLS * 16;
    static constexpr int CHUNKS = SB_STEPS * COLS * 2;  // 16-byte copies of the B words
    // col[j]: column j's x16 part at token n0 (a.x16 / a.x16_lo + 16 n0), sums[j] its sums (a.sums / a.sums_lo + 8 n0).
    static __device__ __forceinline__ void copy(u32 dst, const f16* const (&col)[COLS], const f16* const (&sums)[COLS],
                                                int sb, int lane) {
#pragma unroll
        for (int k = 0; k < CHUNKS / 32; ++k) {
            const int q = lane + 32 * k, st = q / (2 * COLS), j = (q >> 1) % COLS, h = q & 1;
            cp_async16(dst + FRAG + (st * COLS + j) * 32 + 16 * h, col[j] + 2048 * sb + 128 * st + 8 * h);
        }
        if (lane < COLS) cp_async16(dst + SUMS + 16 * lane, sums[lane] + 64 * sb);
    }
    // The lane's MvAct (column g, quad lane c) from a stage's activations, as mv_act_load would load it.
    static __device__ __forceinline__ void read(MvAct& x, const u8* act, int g, int c) {
        const bool mine = g < COLS;
#pragma unroll
        for (int st = 0; st < SB_STEPS; ++st) {
            const uint2 v = mine ? *reinterpret_cast<const uint2*>(act + FRAG + (st * COLS + g) * 32 + 8 * c)
                                 : make_uint2(0u, 0u);
            x.b[st][0] = v.x;
            x.b[st][1] = v.y;
        }
        x.sum = mine ? *reinterpret_cast<const u32*>(act + SUMS + 16 * g + 4 * c) : 0u;
    }
};
static_assert(ActStage::CHUNKS % 32 == 0, "every lane copies the same number of chunks");

// Where mv_superblock takes the residue column of a `two` pass (more than 4 rows) from: LO_L2 loads it step by step
// (L2) to keep registers for the fragments, LO_REGS takes it from an MvAct the caller loaded with the activations.
enum MvLo { LO_L2, LO_REGS };

// One superblock of the lane's two rows against its activations x; the K-quant offset term uses the exact sums of
// what the mma sees. `two` (warp-uniform, more than 4 rows): a second column source (the rows' rounding residues:
// a2 / sums2 for LO_L2, x2 for LO_REGS) multiplies the same decoded fragments, so a weight is decoded once whatever
// the number of rows.
template <int QT, MvLo LO = LO_L2>
__device__ __forceinline__ void mv_superblock(const typename QTraits<QT>::Row (&r)[2], const MvAct& x, const f16* a2,
                                              const u32* sums2, bool two, int sb, int c, float (&acc)[4],
                                              const MvAct* x2 = nullptr) {
    using Q = QTraits<QT>;
    typename Q::Consts k[2];
    Q::prepare(r[0], c, k[0]);
    Q::prepare(r[1], c, k[1]);
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
    float* dst = Q::BLOCK_SCALE ? blk : acc;
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        u32 f[4];
        Q::frag(r[0], k[0], c, s, f[0], f[2]);
        Q::frag(r[1], k[1], c, s, f[1], f[3]);
        mma_f16_16816(dst, f, x.b[s]);
        if (two) {
            u32 bl[2];
            if constexpr (LO == LO_REGS) {
                bl[0] = x2->b[s][0];
                bl[1] = x2->b[s][1];
            } else {
                const uint2 v = a2 ? ld_cg_u2(a2 + 2048 * sb + 128 * s) : make_uint2(0u, 0u);
                bl[0] = v.x;
                bl[1] = v.y;
            }
            mma_f16_16816(dst, f, bl);
        }
    }
    if constexpr (Q::BLOCK_SCALE) {
        const float d0 = Q::dscale(r[0]), d1 = Q::dscale(r[1]);
        acc[0] += d0 * blk[0];
        acc[1] += d0 * blk[1];
        acc[2] += d1 * blk[2];
        acc[3] += d1 * blk[3];
    }
    if constexpr (Q::HAS_MIN) {
        u32 am[4] = {k[0].mins, k[1].mins, 0u, 0u};
        float cm[4] = {0.f, 0.f, 0.f, 0.f};
        u32 bm[2] = {x.sum, 0u};
        mma_f16_16816(cm, am, bm);
        if (two) {
            u32 bm2[2] = {LO == LO_REGS ? x2->sum : sums2 ? ld_cg_u32(sums2 + 32 * sb) : 0u, 0u};
            mma_f16_16816(cm, am, bm2);
        }
        const float m0 = Q::mscale(r[0]), m1 = Q::mscale(r[1]);
        acc[0] -= m0 * cm[0];
        acc[1] -= m0 * cm[1];
        acc[2] -= m1 * cm[2];
        acc[3] -= m1 * cm[3];
    }
}

// The warp's superblocks cw, cw + W, ... of rows ra, rb; the next superblock's weights load while the current one
// is multiplied.
template <int QT>
__device__ __forceinline__ void mv_pass(const Planes& P, int nb, int nsb, int ra, int rb, const f16* a,
                                        const u32* sums, const f16* a2, const u32* sums2, bool two, int c,
                                        float (&acc)[4]) {
    using Q = QTraits<QT>;
    typename Q::Row cur[2], next[2];
    int sb = cwarp();
    if (sb < nsb) {
        Q::load(cur[0], P, nb, ra, sb, c);
        Q::load(cur[1], P, nb, rb, sb, c);
    }
    for (; sb < nsb; sb += MK_CONSUMER_WARPS) {
        if (sb + MK_CONSUMER_WARPS < nsb) {
            Q::load(next[0], P, nb, ra, sb + MK_CONSUMER_WARPS, c);
            Q::load(next[1], P, nb, rb, sb + MK_CONSUMER_WARPS, c);
        }
        MvAct x;
        mv_act_load<Q::HAS_MIN>(a, sums, sb, x);
        mv_superblock<QT>(cur, x, a2, sums2, two, sb, c, acc);
        cur[0] = next[0];
        cur[1] = next[1];
    }
}

// A warp's mma fragment (lane: rows g, g + 8, columns 2c, 2c + 1) into dst[16][8].
__device__ __forceinline__ void mv_frag_store(const float (&acc)[4], float* dst) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    dst[g * 8 + 2 * c] = acc[0];
    dst[g * 8 + 2 * c + 1] = acc[1];
    dst[(g + 8) * 8 + 2 * c] = acc[2];
    dst[(g + 8) * 8 + 2 * c + 1] = acc[3];
}

// dst[16][8] += the warp's fragment: each lane owns its four places, so no lane waits for another.
__device__ __forceinline__ void mv_frag_add(const float (&acc)[4], float* dst) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    float2* lo = reinterpret_cast<float2*>(dst + g * 8 + 2 * c);
    float2* hi = reinterpret_cast<float2*>(dst + (g + 8) * 8 + 2 * c);
    float2 u = *lo, v = *hi;
    u.x += acc[0];
    u.y += acc[1];
    v.x += acc[2];
    v.y += acc[3];
    *lo = u;
    *hi = v;
}

// out[16][8] = the sum over the warps, in warp order, of red[w] ([16][8] each), columns ncols + n folded into n
// when packed. Every consumer thread takes part; the caller syncs around it.
__device__ __forceinline__ void mv_fold(const float* red, int ncols, bool packed, float* out) {
    for (int o = ctid(); o < 128; o += MK_CONSUMER_THREADS) {
        const int r = o >> 3, col = o & 7;
        float v = 0.f;
        if (col < ncols)
            for (int w = 0; w < MK_CONSUMER_WARPS; ++w) {
                const float* t = red + w * 128;
                v += t[r * 8 + col] + (packed ? t[r * 8 + col + ncols] : 0.f);
            }
        out[o] = v;
    }
}

// Consumer warp w's units [i0, i1) of a batch's N: a contiguous share, in warp order.
__device__ __forceinline__ void mv_warp_units(int w, int N, int& i0, int& i1) {
    i0 = w * N / MK_CONSUMER_WARPS;
    i1 = (w + 1) * N / MK_CONSUMER_WARPS;
}

// The first and last tile of warp w's units (tile-major, ns superblocks a tile), hi < lo when it has none: the
// slots of its partials in red.
__device__ __forceinline__ void mv_warp_tiles(int w, int N, int ns, int& lo, int& hi) {
    int i0, i1;
    mv_warp_units(w, N, i0, i1);
    lo = i0 / ns;
    hi = i1 > i0 ? (i1 - 1) / ns : lo - 1;
}

// out[k][16][8] (k < nt) = the sum over the warps, in warp order, of their partials of tile k (red: [warp]
// [MV_RED_TILES][16][8], a warp's first slot its first tile), columns ncols + n folded into n when packed. A warp
// that has no unit of tile k adds nothing (it used to add a zero partial: the same sum). Every consumer thread
// takes part; the caller syncs around it.
//
// MK_FOLD_USED=1 (default since round 9, not yet timed on a GPU): only the elements a store reads (columns below
// ncols: 16 a tile at one row, 1 / 8 of the tile) are summed and written, a thread an element, and each warp's slot
// comes from comparisons (its units against the tile's), not from two divisions a warp: ~100 instructions a
// thread at one row against ~900 (8 iterations over the tile's 128 elements, 16 divisions), whose `fold` phase
// measured ~2 us a batch (~0.7 ms a d = 0 cycle). The sums are the same, in the same order. 0: the old fold.
#ifndef MK_FOLD_USED
#define MK_FOLD_USED 1
#endif
__device__ __noinline__ void mv_fold_batch(const float* red, int ns, int nt, int ncols, bool packed, float* out,
                                           bool add) {
#if MK_FOLD_USED
    const int N = nt * ns, per_tile = 16 * ncols;
    for (int o = ctid(); o < per_tile * nt; o += MK_CONSUMER_THREADS) {
        const int k = o / per_tile, e = o - k * per_tile, r = e / ncols, col = e - r * ncols;
        const int u0 = k * ns, u1 = u0 + ns;  // tile k's units
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < MK_CONSUMER_WARPS; ++w) {
            int i0, i1;
            mv_warp_units(w, N, i0, i1);
            if (i0 < i1 && i0 < u1 && i1 > u0) {  // warp w has units of tile k, in slot k - i0 / ns
                int slot = 0;
#pragma unroll
                for (int j = 0; j + 1 < MV_RED_TILES; ++j) slot += i0 < u0 - j * ns;
                const float* t = red + (w * MV_RED_TILES + slot) * 128;
                v += t[r * 8 + col] + (packed ? t[r * 8 + col + ncols] : 0.f);
            }
        }
        float* dst = out + k * 128 + r * 8 + col;
        *dst = add ? *dst + v : v;  // add: a later superblock chunk of the same tiles (mv_rows)
    }
#else
    int lo[MK_CONSUMER_WARPS], hi[MK_CONSUMER_WARPS];
#pragma unroll
    for (int w = 0; w < MK_CONSUMER_WARPS; ++w) mv_warp_tiles(w, nt * ns, ns, lo[w], hi[w]);
    for (int o = ctid(); o < 128 * nt; o += MK_CONSUMER_THREADS) {
        const int k = o >> 7, r = (o >> 3) & 15, col = o & 7;
        float v = 0.f;
        if (col < ncols) {
#pragma unroll
            for (int w = 0; w < MK_CONSUMER_WARPS; ++w)
                if (lo[w] <= k && k <= hi[w]) {
                    const float* t = red + (w * MV_RED_TILES + k - lo[w]) * 128;
                    v += t[r * 8 + col] + (packed ? t[r * 8 + col + ncols] : 0.f);
                }
        }
        out[o] = add ? out[o] + v : v;  // add: a later superblock chunk of the same tiles (mv_rows)
    }
#endif
}

// Reduce the warps' fragments of one tile (red: [8 warps][16][8]) into out[16][8].
__device__ __forceinline__ void mv_reduce(const float (&acc)[4], int ncols, bool packed, float* out, float* red) {
    mv_frag_store(acc, red + cwarp() * 128);
    consumers_sync();
    mv_fold(red, ncols, packed, out);
    consumers_sync();
}

// The lane's activation column(s) (act rows n0 .. n0 + ncols - 1). packed (ncols <= 4): column g < ncols the f16
// activations of row g, column ncols + n the residues of row n; otherwise every column g < ncols takes row g's
// activations and, in a second mma per step, its residues (col2 / sums2).
struct MvCols {
    const f16* col;
    const u32* sums;
    const f16* col2;
    const u32* sums2;
    bool packed;
};
__device__ __forceinline__ MvCols mv_cols(const ActRef& a, int n0, int ncols, int g, int c) {
    const bool packed = ncols <= 4, hi = g < ncols, lo = packed && !hi && g < 2 * ncols;
    const int tok = n0 + (hi ? g : g - ncols);
    MvCols m;
    m.col = hi ? a.x16 + tok * 16 + 4 * c : lo ? a.x16_lo + tok * 16 + 4 * c : nullptr;
    m.sums = hi ? reinterpret_cast<const u32*>(a.sums + tok * 8 + 2 * c)
           : lo ? reinterpret_cast<const u32*>(a.sums_lo + tok * 8 + 2 * c) : nullptr;
    m.col2 = !packed && hi ? a.x16_lo + tok * 16 + 4 * c : nullptr;
    m.sums2 = !packed && hi ? reinterpret_cast<const u32*>(a.sums_lo + tok * 8 + 2 * c) : nullptr;
    m.packed = packed;
    return m;
}

// out[r * 8 + n] = sum_k W[row0 + r][k] * act[n0 + n][k], r < 16, n < ncols <= 8 (rows past the weight's end
// repeat its last row; their results are not to be stored).
template <int QT>
__device__ __noinline__ void mv_tile(const WeightRef& w, int row0, const ActRef& a, int n0, int ncols, float* out,
                                     float* red) {
    using Q = QTraits<QT>;
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int K = w.cols, nb = Q::QK == 1 ? K : (K + Q::QK - 1) / Q::QK, nsb = (K + QK_SB - 1) / QK_SB;
    const Planes P = Q::planes(w.ptr, (u64)w.rows_total * nb);
    const int last = w.row_offset + w.rows - 1;
    const int ra = min(w.row_offset + row0 + g, last), rb = min(w.row_offset + row0 + g + 8, last);
    const MvCols m = mv_cols(a, n0, ncols, g, c);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    mv_pass<QT>(P, nb, nsb, ra, rb, m.col, m.sums, m.col2, m.sums2, !m.packed, c, acc);
    mv_reduce(acc, ncols, m.packed, out, red);
}

// F32 weights (small matrices only): a warp per row, the activations rebuilt from their hi + lo halves.
__device__ __noinline__ void mv_tile_f32(const WeightRef& w, int row0, const ActRef& a, int n0, int ncols,
                                         float* out) {
    const int lane = threadIdx.x & 31;
    for (int r = cwarp(); r < 16; r += MK_CONSUMER_WARPS) {
        const int row = min(w.row_offset + row0 + r, w.row_offset + w.rows - 1);
        const float* wr = reinterpret_cast<const float*>(w.ptr) + (i64)row * w.cols;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int k = lane; k < w.cols; k += 32) {
            const float wv = wr[k];
#pragma unroll
            for (int n = 0; n < 8; ++n)
                if (n < ncols) {
                    const i64 o = act_offset(k, n0 + n);
                    acc[n] += wv * (f16_to_f32(ld_cg_f16(a.x16 + o)) + f16_to_f32(ld_cg_f16(a.x16_lo + o)));
                }
        }
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const float v = warp_sum(acc[n]);
            if (lane == 0) out[r * 8 + n] = n < ncols ? v : 0.f;
        }
    }
    consumers_sync();
}

// Weight types compiled in: MK_QT_MASK (bit = ggml type id) is set by build.py to the types of the model loaded,
// so a Q4_K_M file compiles four instances instead of seven; without it every type is in.
#ifndef MK_QT_MASK
#define MK_QT_MASK ((1 << QT_Q4_K) | (1 << QT_Q5_K) | (1 << QT_Q6_K) | (1 << QT_Q8_0) | (1 << QT_Q5_0) | (1 << QT_Q4_0) | (1 << QT_F16))
#endif
#define MK_HAS_QT(qt) ((MK_QT_MASK >> (qt)) & 1)

// The one switch from a weight's run-time type to its template instance.
__device__ __noinline__ void mv_dispatch(const Globals& g, const WeightRef& w, int row0, const ActRef& a, int n0, int ncols,
                            float* out, float* red) {
    switch (w.qtype) {
#if MK_HAS_QT(QT_Q4_K)
        case QT_Q4_K: mv_tile<QT_Q4_K>(w, row0, a, n0, ncols, out, red); break;
#endif
#if MK_HAS_QT(QT_Q5_K)
        case QT_Q5_K: mv_tile<QT_Q5_K>(w, row0, a, n0, ncols, out, red); break;
#endif
#if MK_HAS_QT(QT_Q6_K)
        case QT_Q6_K: mv_tile<QT_Q6_K>(w, row0, a, n0, ncols, out, red); break;
#endif
#if MK_HAS_QT(QT_Q8_0)
        case QT_Q8_0: mv_tile<QT_Q8_0>(w, row0, a, n0, ncols, out, red); break;
#endif
#if MK_HAS_QT(QT_Q5_0)
        case QT_Q5_0: mv_tile<QT_Q5_0>(w, row0, a, n0, ncols, out, red); break;
#endif
#if MK_HAS_QT(QT_Q4_0)
        case QT_Q4_0: mv_tile<QT_Q4_0>(w, row0, a, n0, ncols, out, red); break;
#endif
#if MK_HAS_QT(QT_F16)
        case QT_F16: mv_tile<QT_F16>(w, row0, a, n0, ncols, out, red); break;
#endif
        case QT_F32: mv_tile_f32(w, row0, a, n0, ncols, out); break;
        default:
            if (ctid() == 0) mk_fail(g, ERR_BAD_QTYPE, blockIdx.x, -1, w.qtype, 0, 0, 0);
            consumers_sync();
    }
}

// MK_STAGED_LEGACY (on; 0 is the A/B): Q8_0 and Q5_0 rows of whole superblocks go through the rings too
// (kernels/stage.cuh Stage<QT_Q8_0> / <QT_Q5_0>), not a tile at a time through registers (~16 us a tile:
// attention's Q5_0 k, DeltaNet's Q8_0 alpha and beta; d = 0 / 4 cycle 12.69 / 21.52 against 12.73 / 21.78 ms,
// bench/MEGAKERNEL.md round 8). Staged, such a tile still costs ~8 us (its stages are small): the schedule keeps
// them off the K-quants' joint runs (13.05 ms at d = 0 with them in).
#ifndef MK_STAGED_LEGACY
#define MK_STAGED_LEGACY 1
#endif
#define MK_STAGES_LEGACY(qt) (MK_STAGED_LEGACY && MK_HAS_QT(qt))

// Whether rows from row_begin of w go through the rings: K-quants compiled in (and the legacy 32-weight types with
// MK_STAGED_LEGACY, rows of whole superblocks), their first row on a 16-row tile of the tensor (the tiled words of
// Q4_K / Q5_K come a tile at a time).
__device__ __forceinline__ bool mv_staged(const WeightRef& w, int row_begin) {
    if (!MK_STAGED || ((w.row_offset + row_begin) & (MK_TILE_ROWS - 1))) return false;
    const bool legacy = w.cols % QK_SB == 0 && ((w.qtype == QT_Q8_0 && MK_STAGES_LEGACY(QT_Q8_0)) ||
                                                (w.qtype == QT_Q5_0 && MK_STAGES_LEGACY(QT_Q5_0)));
    return legacy || (w.qtype == QT_Q4_K && MK_HAS_QT(QT_Q4_K)) || (w.qtype == QT_Q5_K && MK_HAS_QT(QT_Q5_K)) ||
           (w.qtype == QT_Q6_K && MK_HAS_QT(QT_Q6_K));
}

// The staged instance for a weight: f(MvKind<QT, TWO>{}) with its K-quant type and whether the rows' residues need
// a second mma (more than 4 rows; a template argument, so the packed instance carries no residue pointers or
// branches). Types mv_staged refuses do nothing.
template <int QT, bool TWO, bool ACT = false, int A8 = A8_NONE> struct MvKind {
    static constexpr int QTYPE = QT;
    static constexpr bool RESIDUE_MMA = TWO;
    static constexpr bool ACT_STAGED = ACT;
    static constexpr int INT8 = A8;  // int8 activations (Q4_K, an act with its int8 copy): MvAct8
};
// Whether one row's activations can ride in QT's stages (MK_MV_ACT_STAGED): only where the ring keeps
// MK_MV_ACT_MIN_STAGES stages (3; 2, a benchmark knob not yet run on a GPU, lets Q6_K's 3,648-byte stages take
// them too: its units now wait an L2 round trip for their activations each, ~2 us a unit in LM_HEAD at d = 0).
#ifndef MK_MV_ACT_MIN_STAGES
#define MK_MV_ACT_MIN_STAGES 3
#endif
template <int QT> constexpr bool mv_act_stages() {
    return MK_MV_ACT_STAGED && mv_ring_stages<typename MvF16Stage<QT>::type>(ActStage::BYTES, 0) >= MK_MV_ACT_MIN_STAGES;
}
// Whether a matmul of ncols rows takes act a's int8 copy: an act8_fill act has it where act8_fill_at says
// (one row; up to 5 with MK_ACT8_FILL_ROWS), the norms' act_h where norm_act.cuh writes it.
__device__ __forceinline__ bool mv_act_i8(const ActRef& a, int ncols) {
    return a.q8 != nullptr && (a.fill == nullptr || act8_fill_at(ncols));
}
// Whether one row's int8 levels go to the batch's shared area (A8_SMEM) for a weight of this type.
__device__ __forceinline__ bool mv_act8_smem(int qtype, int ncols, bool i8) {
    return MK_MV_I8 && MK_MV_ACT8_SMEM && i8 && ncols == 1 &&
           ((qtype == QT_Q4_K && MK_HAS_QT(QT_Q4_K)) || (qtype == QT_Q6_K && MK_HAS_QT(QT_Q6_K) && MK_MV_I8Q6));
}
// Whether 2 to MK_ACT8_ROWS_MAX rows' int8 levels go to the batch's shared area (A8_ROWS, MK_MV_I8ROWS).
__device__ __forceinline__ bool mv_act8_rows(int qtype, int ncols, bool i8) {
    return MK_MV_I8ROWS && MK_MV_I8 && i8 && ncols >= 2 && ncols <= MK_ACT8_ROWS_MAX && qtype == QT_Q4_K &&
           MK_HAS_QT(QT_Q4_K);
}
// i8: the act has its int8 copy (mv_act_i8); nsb: the batch's superblocks.
template <class F>
__device__ __forceinline__ void mv_staged_kind(int qtype, int ncols, bool i8, int nsb, F&& f) {
    // int8 activations where the act has them (mv_int8.cuh), else f16: one row's in the stages where they fit
    const bool a8_smem = mv_act8_smem(qtype, ncols, i8) && nsb <= MK_ACT8_MAX_SB;
    const bool a8_rows = mv_act8_rows(qtype, ncols, i8) && nsb <= MK_ACT8_ROWS_SB;
#define MK_F16_KIND(QTYPE)                                              \
    if (ncols > 4)                                                      \
        f(MvKind<QTYPE, true>{});                                       \
    else if (ncols == 1 && mv_act_stages<QTYPE>())                      \
        f(MvKind<QTYPE, false, mv_act_stages<QTYPE>()>{});              \
    else                                                                \
        f(MvKind<QTYPE, false>{});
    switch (qtype) {
#if MK_HAS_QT(QT_Q4_K)
        case QT_Q4_K:
            if (a8_smem)
                f(MvKind<QT_Q4_K, false, false, A8_SMEM>{});
#if MK_MV_I8ROWS  // (instances only where the knob asks for them)
            else if (a8_rows && ncols > 4)
                f(MvKind<QT_Q4_K, true, false, A8_ROWS>{});  // a second mma for the rows past 4
            else if (a8_rows)
                f(MvKind<QT_Q4_K, false, false, A8_ROWS>{});
#endif
            else if (MK_MV_I8 && i8 && ncols == 1)
                f(MvKind<QT_Q4_K, false, false, A8_STAGED>{});
            else if (MK_MV_I8 >= 2 && i8 && ncols > 4)
                f(MvKind<QT_Q4_K, true, false, A8_REGS>{});  // the lo levels in a second pass of mmas
            else if (MK_MV_I8 >= 2 && i8)
                f(MvKind<QT_Q4_K, false, false, A8_REGS>{});
            else
                MK_F16_KIND(QT_Q4_K)
            break;
#endif
#if MK_HAS_QT(QT_Q5_K)
        case QT_Q5_K:
            MK_F16_KIND(QT_Q5_K)
            break;
#endif
#if MK_HAS_QT(QT_Q6_K)
        case QT_Q6_K:
            if (a8_smem)  // mv_act8_smem: with MK_MV_I8Q6
                f(MvKind<QT_Q6_K, false, false, A8_SMEM>{});
            else
                MK_F16_KIND(QT_Q6_K)
            break;
#endif
#if MK_STAGES_LEGACY(QT_Q8_0)
        case QT_Q8_0:
            MK_F16_KIND(QT_Q8_0)
            break;
#endif
#if MK_STAGES_LEGACY(QT_Q5_0)
        case QT_Q5_0:
            MK_F16_KIND(QT_Q5_0)
            break;
#endif
        default: break;  // mv_staged said no
    }
#undef MK_F16_KIND
}

#ifndef MK_MV_ROTATE
#define MK_MV_ROTATE 0  // a benchmark knob (bench/MEGAKERNEL.md round 6): rotate each warp's order of its units
#endif

// Unit i's superblock and tile in a batch, advanced one unit at a time (no division per unit).
struct MvPos {
    int sb, t;
    __device__ void next(int sb0, int sb1) {
        if (++sb == sb1) sb = sb0, ++t;
    }
};

// One warp's share of a batch - units [i0, i1) of tiles [b0, b0 + nt) from row_begin over superblocks [sb0, sb1),
// tile-major - and its ring of cp.async stages.
template <bool B, class T, class F> struct MvPick { using type = T; };
template <class T, class F> struct MvPick<false, T, F> { using type = F; };
template <int QT, bool ACT, int A8 = A8_NONE> struct MvUnits {
    using S8 = typename MvPick<QT == QT_Q6_K, Q6KStage8, Q4KStage8>::type;  // the int8 readers' conflict-free pitches
    using S = typename MvPick<A8 != A8_NONE, S8, typename MvF16Stage<QT>::type>::type;
    static constexpr int RESERVED = A8 == A8_SMEM ? MK_ACT8_MAX_SB * Act8Stage::BYTES  // the batch's levels
                                    : A8 == A8_ROWS ? Act8Rows::BYTES : 0;
    using R = MvRing<S, A8 == A8_STAGED ? Act8Stage::BYTES : ACT ? ActStage::BYTES : 0, RESERVED>;
    static constexpr u32 NS = R::STAGES;
    Planes P;
    u64 ntot;
    int nb, first, end, sb0, sb1, i0, i1;
    MvPos start, wrap;  // the first unit's (i0 + rot) and unit i0's, where the order wraps to after unit i1 - 1
    int rot;
    u8* ring;
    u32 ring_s;
    __device__ MvUnits(const WeightRef& w, int row_begin, int b0, int nt, int sb0_, int sb1_, u8* rings)
        : ntot((u64)w.rows_total * (w.cols / QTraits<QT>::QK)), nb(w.cols / QTraits<QT>::QK),
          first(w.row_offset + row_begin + MK_TILE_ROWS * b0), end(w.row_offset + w.rows), sb0(sb0_), sb1(sb1_) {
        P = QTraits<QT>::planes(w.ptr, ntot);
        const int ns = sb1 - sb0;
        mv_warp_units(cwarp(), nt * ns, i0, i1);
        // MK_MV_ROTATE: each warp starts its range at a different place, so the SMs' warps do not all read the same
        // activation superblock at once (tile-major ranges of whole tiles all start at superblock 0)
        rot = MK_MV_ROTATE && i1 > i0 ? (int)((blockIdx.x * 7u + cwarp() * 3u) % (u32)(i1 - i0)) : 0;
        start = MvPos{sb0 + (i0 + rot) % ns, (i0 + rot) / ns};
        wrap = MvPos{sb0 + i0 % ns, i0 / ns};
        ring = rings + RESERVED + cwarp() * NS * R::BYTES;
        ring_s = smem_u32(ring);
    }
    __device__ u32 stage(int i) const { return ring_s + ((u32)(i - i0) % NS) * R::BYTES; }
    // The position after q, the k-th unit of the warp's order (k from i0): wraps from unit i1 - 1 to i0.
    __device__ void advance(MvPos& q, int k) const {
        if (MK_MV_ROTATE && k + 1 - i0 == i1 - i0 - rot)
            q = wrap;
        else
            q.next(sb0, sb1);
    }
    // The lane's copies of the weights of the unit at q into the stage at dst (row bases from S::init per copy:
    // consecutive units may be different tiles).
    __device__ void copy_weights(u32 dst, const MvPos& q, int lane) const {
        if (MK_MV_PROBE & 2) return;
        typename S::Lane L;
        S::init(L, first + MK_TILE_ROWS * q.t, end, nb, lane);
        S::copy(dst, P, L, q.sb, lane, ntot);
    }
};

// One unit's copies into its stage at dst: the weights, then (ACT) one row's f16 activations or (I8) its int8
// levels (act_col, act_sums, act8 as mv_batch_cp forms them), as the batch's copier and mv_prime issue them.
template <bool ACT, bool I8, class M>
__device__ __forceinline__ void mv_copy_unit(const M& m, u32 dst, const MvPos& q, int lane,
                                             const f16* const (&act_col)[ActStage::COLS],
                                             const f16* const (&act_sums)[ActStage::COLS], const Act8Stage::Src& act8) {
    m.copy_weights(dst, q, lane);
    if (ACT) ActStage::copy(dst + M::S::BYTES, act_col, act_sums, q.sb, lane);
    if (I8) Act8Stage::copy(dst + M::S::BYTES, act8, q.sb, lane);
}

// MK_MV_CARRY=1 (a benchmark knob, off until measured): a batch whose successor is known and of the same staged
// kind (FFN_DOWN's second superblock chunk, the next MV_BATCH tiles, FFN_UP's up batch after its gate) asks for
// that batch's first NS - 1 units as soon as its own loop ends, so their weights fly during the barrier, the fold
// and the store instead of after them; FFN_UP's up batch also keeps the gate batch's levels in the batch area.
#ifndef MK_MV_CARRY
#define MK_MV_CARRY 0
#endif
// The batch after this one (mv_rows decides, mv_carries checks): its weight, rows, tiles and superblocks.
struct MvNext {
    const WeightRef* w;
    int row_begin, b0, nt, sb0, sb1;
};
// A batch's flags: MV_PRIMED, its first NS - 1 units are in its warps' rings already (the batch before issued
// them); MV_KEEP_LEVELS, its A8_SMEM levels are those the batch before copied (same act, same superblocks).
enum { MV_PRIMED = 1, MV_KEEP_LEVELS = 2 };

// MK_MV_PRIME_NEXT=1 (a benchmark knob, off until measured): while consumer thread 0 waits for an instruction's
// dependencies, every warp asks for the first NS - 1 units of the instruction's first matmul batch (weights do not
// depend on the group before; only kinds whose stages hold weights alone: not the act staged a unit). The DRAM
// round trip of the ring's fill then hides in the wait. (Round 5's MK_MV_PRIME, an earlier form, lost 0.3 ms on
// a kernel with a controller warp and f16 activations.) Round 13 (H100): FFN_DOWN 41.1 -> 38.7 us and MIX_OUT
// 19.9 -> 17.5 at d = 4, FFN_UP (int8 rows) 60.0 -> 62.7 and the one-row int8 matmuls slower; a form priming only
// FFN_DOWN's and MIX_OUT's f16 kinds from 2 rows gained at most 0.17 ms at d = 4 and cost up to 0.2 at d = 0
// (removed; bench/MEGAKERNEL.md round 13).
#ifndef MK_MV_PRIME_NEXT
#define MK_MV_PRIME_NEXT 0
#endif
// Whether batches may start primed (an instance per flag, mv_dispatch_batch).
#define MK_MV_PRIMING (MK_MV_CARRY || MK_MV_PRIME_NEXT)
// The batch the wait primed: its weight and rows (null: none), for mv_rows's first batch to claim; thread 0 sets
// it before the instruction's first barrier and clears it after the first batch's loops.
__shared__ const WeightRef* mk_primed_w;
__shared__ int mk_primed_rows[2];

// A batch: tiles [b0, b0 + nt) of rows [row_begin, row_end) of a K-quant weight, over its superblocks [sb0, sb1)
// (all of them but for a piece of a split tile). The warp takes units
// [cw N / 8, (cw + 1) N / 8) of the batch's N (superblock, tile) units through its ring (filled at the start,
// drained at the end of the batch) and adds each unit's products into part[cw][tile] in shared memory (zero for the
// tiles its range does not touch), so its sums of a tile run in superblock order. Units are tile-major: a warp's
// units are runs of one tile's superblocks. (Superblock-major runs, one activation load for a superblock's tiles,
// measured slower twice: 19.39 against 18.36 ms a d = 0 cycle in round 3, 22.55 against 17.52 in round 4, where
// the activations held across a run spilled.)
// FLAGS (MK_MV_CARRY): MV_PRIMED, MV_KEEP_LEVELS, an instance each (a run-time flag cost the plain instance's
// loop a spilled register).
template <int QT, bool TWO, bool ACT, int A8, int FLAGS = 0>
__device__ __noinline__ void mv_batch_cp(const WeightRef& w, int row_begin, int b0, int nt, int sb0, int sb1,
                                         const ActRef& a, int n0, int ncols, float* part, u8* rings) {
    using Q = QTraits<QT>;
    using M = MvUnits<QT, ACT, A8>;
    constexpr bool I8 = A8 == A8_STAGED;
    using S = typename M::S;
    constexpr u32 NS = M::NS;
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3, cw = cwarp();
    const M m(w, row_begin, b0, nt, sb0, sb1, rings);
    const int i0 = m.i0, i1 = m.i1, first = m.first, end = m.end, nb = m.nb, ns = sb1 - sb0;
    const int tset = trace_batch();  // MK_TRACE: this batch's events
    __builtin_assume(__isShared(m.ring));
    int t_lo, t_hi;  // the tiles this warp's units touch: its partials' slots in part (mv_fold_batch)
    mv_warp_tiles(cw, nt * ns, ns, t_lo, t_hi);
    float* mine = part + cw * MV_RED_TILES * 128;  // tile t's partials at mine[(t - t_lo) * 128]
    for (int o = lane; o < (t_hi - t_lo + 1) * 128; o += 32) mine[o] = 0.f;
    __syncwarp();  // the zeros land before any lane's sums
    const f16* const act_col[ActStage::COLS] = {a.x16 + 16 * n0, a.x16_lo + 16 * n0};
    const f16* const act_sums[ActStage::COLS] = {a.sums + 8 * n0, a.sums_lo + 8 * n0};
    const Act8Stage::Src act8 = I8 ? Act8Stage::source(a, n0, lane) : Act8Stage::Src{};
    const bool packed = A8 == A8_REGS ? !TWO : ncols <= 4;  // A8_REGS: TWO is the unpacked instance
    const MvAct8Src act8r = A8 == A8_REGS ? mv_act8_src(a, n0, ncols, packed, g, c) : MvAct8Src{};
    // The copier: unit ci at cp; every unit commits one cp.async group, empty or not.
    int ci = i0;
    MvPos cp = m.start;
    auto issue = [&]() {
        if (ci < i1) {
            mv_copy_unit<ACT, I8>(m, m.stage(ci), cp, lane, act_col, act_sums, act8);
            m.advance(cp, ci);
        }
        ++ci;
        cp_async_commit();
    };
    const u8* act_area = rings;  // A8_SMEM: the batch's superblocks of the row's levels (a.in_smem: norm_into_own's)
    constexpr bool primed = MK_MV_PRIMING && (FLAGS & MV_PRIMED);
    const bool copy_levels = A8 == A8_SMEM && !a.in_smem && !(MK_MV_CARRY && (FLAGS & MV_KEEP_LEVELS));
    if (copy_levels) Act8Stage::copy_all(smem_u32(rings), a, n0, sb0, sb1);
    if (A8 == A8_ROWS) Act8Rows::copy_all(smem_u32(rings), a, n0, ncols, sb0, sb1);
    if constexpr (primed) {  // units i0 .. i0 + NS - 2 are on their way (the batch before's prime): not copied
        ci = i0 + NS - 1;
        if (MK_MV_ROTATE) {
            for (int k = i0; k < min(ci, i1); ++k) m.advance(cp, k);
        } else {
            cp = MvPos{sb0 + ci % ns, ci / ns};  // unit ci of the tile-major order (unused past i1)
        }
    } else {
        for (u32 k = 0; k + 1 < NS; ++k) issue();
    }
    // the batch's levels: every thread's share landed (the ring's groups may still fly), then everyone's
    if (A8 == A8_SMEM || A8 == A8_ROWS) {
        if (primed && (copy_levels || A8 == A8_ROWS))
            cp_async_wait<0>();  // the levels' group is the newest, after the primed units'
        else
            cp_async_wait<NS - 1>();
        consumers_sync();
    }
    trace_event(tset + TRACE_PRIMED);
    const MvCols mc = mv_cols(a, n0, ncols, g, c);
    MvPos u = m.start;
    constexpr bool RUN = A8 == A8_SMEM && (MK_MV_I8B || QT == QT_Q6_K);  // a tile's partial rows in registers
    float run[2] = {0.f, 0.f};
    int run_t = u.t;
    for (int i = i0; i < i1; ++i) {
        MvAct x, x2;
        MvAct8Regs x8;
        if (A8 == A8_REGS) {  // on their way from L2 while the weights land
            mv_act8_load(act8r, u.sb, packed, x8);
        } else if (!ACT && !I8) {
            mv_act_load<Q::HAS_MIN>(mc.col, mc.sums, u.sb, x);
            if (TWO) mv_act_load<Q::HAS_MIN>(mc.col2, mc.sums2, u.sb, x2);
        }
        __syncwarp();  // every lane is done reading the stage the next copy overwrites
        issue();       // unit i + NS - 1
        cp_async_wait<NS - 1>();
        __syncwarp();
        if (MK_TRACE && i == i0) trace_event(tset + TRACE_UNIT0_READY);
        const u8* st = m.ring + ((u32)(i - i0) % NS) * M::R::BYTES;
        if (ACT) ActStage::read(x, st + S::BYTES, g, c);
        if (A8 != A8_NONE && (MK_MV_PROBE & 1)) x = MvAct{};
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (MK_MV_PROBE & 1) {
            acc[0] = __uint_as_float(x.b[0][0] ^ x.b[SB_STEPS - 1][1] ^ x.sum ^ *reinterpret_cast<const u32*>(st));
        } else if constexpr (I8) {
            mv_unit_i8(st, st + Q4KStage8::BYTES, n0, g, c, acc);
        } else if constexpr (RUN) {
            if (u.t != run_t) {
                mv_run_flush(run, mine + (run_t - t_lo) * 128, g, c);
                run_t = u.t;
            }
            const u8* act_sb = act_area + (u.sb - sb0) * Act8Stage::BYTES;
            if constexpr (QT == QT_Q6_K) {
                const int r0 = first + MK_TILE_ROWS * u.t;
                mv_unit_i8q6(st, act_sb, n0, g, c, stage_row_base(r0, g, end, nb) + u.sb,
                             stage_row_base(r0, g + 8, end, nb) + u.sb, run);
            } else {
                mv_unit_i8b(st, act_sb, n0, g, c, run);
            }
        } else if constexpr (A8 == A8_SMEM) {
            mv_unit_i8(st, act_area + (u.sb - sb0) * Act8Stage::BYTES, n0, g, c, acc);
        } else if constexpr (A8 == A8_ROWS) {
            mv_unit_i8rows<TWO ? 2 : 1>(st, act_area, u.sb - sb0, ncols, g, c, mine + (u.t - t_lo) * 128);
        } else if constexpr (A8 == A8_REGS) {
            mv_unit_i8_regs(st, x8, packed, g, c, acc);
        } else {
            const int r0 = first + MK_TILE_ROWS * u.t;
            typename Q::Row r[2];
            S::read(r[0], st, g, c, stage_row_base(r0, g, end, nb) + u.sb);
            S::read(r[1], st, g + 8, c, stage_row_base(r0, g + 8, end, nb) + u.sb);
            mv_superblock<QT, LO_REGS>(r, x, nullptr, nullptr, TWO, u.sb, c, acc, &x2);  // TWO == !mc.packed
        }
        if (!RUN && A8 != A8_ROWS) mv_frag_add(acc, mine + (u.t - t_lo) * 128);
        if (MK_TRACE && i == i0) trace_event(tset + TRACE_UNIT0_DONE);
        m.advance(u, i);
    }
    if (RUN && i1 > i0) mv_run_flush(run, mine + (run_t - t_lo) * 128, g, c);
    trace_event(tset + TRACE_LOOP_DONE);
    trace_event(tset + TRACE_UNITS, i1 - i0);
    if (!MK_MV_PRIMING) cp_async_wait<0>();  // nothing lands in the ring after the batch (with the knobs:
                                              // mv_dispatch_batch waits, or primes the next batch)
}

// The first NS - 1 units of batch `next` into this warp's ring from its first slot, one cp.async group each, as
// that batch's prologue would issue them (MK_MV_CARRY). Its own function: nothing of it stays live through the
// batch's loop. Called when every unit of the batch before is read (its loop's last groups were empty).
template <int QT, bool TWO, bool ACT, int A8>
__device__ __noinline__ void mv_prime(const MvNext& next, const ActRef& a, int n0, u8* rings) {
    using M = MvUnits<QT, ACT, A8>;
    constexpr u32 NS = M::NS;
    const int lane = threadIdx.x & 31;
    __syncwarp();
    const M m(*next.w, next.row_begin, next.b0, next.nt, next.sb0, next.sb1, rings);
    const f16* const act_col[ActStage::COLS] = {a.x16 + 16 * n0, a.x16_lo + 16 * n0};
    const f16* const act_sums[ActStage::COLS] = {a.sums + 8 * n0, a.sums_lo + 8 * n0};
    const Act8Stage::Src act8 = A8 == A8_STAGED ? Act8Stage::source(a, n0, lane) : Act8Stage::Src{};
    MvPos q = m.start;
    for (int k = m.i0; k + 1 < m.i0 + (int)NS; ++k) {
        if (k < m.i1) {
            mv_copy_unit<ACT, A8 == A8_STAGED>(m, m.stage(k), q, lane, act_col, act_sums, act8);
            m.advance(q, k);
        }
        cp_async_commit();
    }
}

__device__ __noinline__ void mv_dispatch_batch(const WeightRef& w, int row_begin, int b0, int nt, int sb0, int sb1,
                                               const ActRef& a, int n0, int ncols, float* part, u8* rings,
                                               const MvNext* next, int flags) {
    mv_staged_kind(w.qtype, ncols, mv_act_i8(a, ncols), sb1 - sb0, [&](auto kind) {
        using K = decltype(kind);
        if (!MK_MV_PRIMING) {
            mv_batch_cp<K::QTYPE, K::RESIDUE_MMA, K::ACT_STAGED, K::INT8>(w, row_begin, b0, nt, sb0, sb1, a, n0,
                                                                          ncols, part, rings);
            return;
        }
        if (K::INT8 == A8_SMEM && flags == (MV_PRIMED | MV_KEEP_LEVELS))  // only A8_SMEM has levels to keep
            mv_batch_cp<K::QTYPE, K::RESIDUE_MMA, K::ACT_STAGED, K::INT8, MV_PRIMED | MV_KEEP_LEVELS>(
                w, row_begin, b0, nt, sb0, sb1, a, n0, ncols, part, rings);
        else if (flags & MV_PRIMED)
            mv_batch_cp<K::QTYPE, K::RESIDUE_MMA, K::ACT_STAGED, K::INT8, MV_PRIMED>(w, row_begin, b0, nt, sb0, sb1, a,
                                                                                      n0, ncols, part, rings);
        else
            mv_batch_cp<K::QTYPE, K::RESIDUE_MMA, K::ACT_STAGED, K::INT8>(w, row_begin, b0, nt, sb0, sb1, a, n0,
                                                                          ncols, part, rings);
        if (next)
            mv_prime<K::QTYPE, K::RESIDUE_MMA, K::ACT_STAGED, K::INT8>(*next, a, n0, rings);
        else
            cp_async_wait<0>();
    });
}

// Whether a batch of w over nsb superblocks may prime the batch `next` (MK_MV_CARRY): the same staged kind
// (mv_staged_kind's choice: the type, and the superblocks' fit in the levels' area; the act and its rows are the
// same), so the primed stages have the layout and the ring slots that batch reads.
__device__ __forceinline__ bool mv_carries(const WeightRef& w, int nsb, const MvNext& next) {
    return MK_MV_CARRY && next.w->qtype == w.qtype && mv_staged(*next.w, next.row_begin) &&
           (nsb <= MK_ACT8_MAX_SB) == (next.sb1 - next.sb0 <= MK_ACT8_MAX_SB);
}

// Tiles [b0, b0 + nt) (nt <= MV_BATCH) of rows from row_begin of a staged weight over superblocks [sb0, sb1):
// their products, summed over the warps, into out = scratch ([tile][16][8]). Every consumer calls it.
// g: only for the timing slots (an instruction's last batch keeps its times). add: out already holds the sums of
// other superblocks of these tiles, which this batch's add to.
__device__ __forceinline__ void mv_batch(const Globals& g, const WeightRef& w, int row_begin, int b0, int nt,
                                         int sb0, int sb1, const ActRef& a, int n0, int ncols, float* scratch,
                                         bool add = false, const MvNext* next = nullptr, int flags = 0) {
    float* red = scratch + MV_OUT_FLOATS;
    record_time(g, TIME_BATCH);
    mv_dispatch_batch(w, row_begin, b0, nt, sb0, sb1, a, n0, ncols, red,
                      reinterpret_cast<u8*>(scratch) + MK_RING_OFFSET, next, flags);
    consumers_sync();
    if (MK_MV_PRIME_NEXT && ctid() == 0) mk_primed_w = nullptr;  // every thread has read it (mv_rows)
    record_time(g, TIME_LOOPS);
    record_first(g);
    mv_fold_batch(red, sb1 - sb0, nt, ncols, ncols <= 4, scratch, add);  // packed as mv_cols makes it
    trace_event(TRACE_FOLDED);
    consumers_sync();
    record_time(g, TIME_FOLDED);
}

#ifndef MK_MV_CHUNKS
#define MK_MV_CHUNKS 1  // 0 (a benchmark knob): a wide weight's superblocks in one batch, its levels staged a unit
#endif
// Batches a staged weight's superblocks take: one row's int8 levels in the batch's shared area hold
// MK_ACT8_MAX_SB superblocks, so a wider weight (FFN_DOWN's 68) takes them in chunks, each a batch adding to the
// last one's sums.
__device__ __forceinline__ int mv_chunks(const WeightRef& w, const ActRef& a, int ncols) {
    const int nsb = w.cols / QK_SB;
    if (mv_act8_rows(w.qtype, ncols, mv_act_i8(a, ncols)))  // always in chunks of MK_ACT8_ROWS_SB superblocks
        return (nsb + MK_ACT8_ROWS_SB - 1) / MK_ACT8_ROWS_SB;
    return MK_MV_CHUNKS && mv_act8_smem(w.qtype, ncols, mv_act_i8(a, ncols)) ? (nsb + MK_ACT8_MAX_SB - 1) / MK_ACT8_MAX_SB
                                                                               : 1;
}

// The first batch of mv_rows(w, row_begin, row_end, a, 0, ncols) (MK_MV_PRIME_NEXT), as mv_rows cuts it.
__device__ __forceinline__ MvNext mv_first_batch(const WeightRef& w, int row_begin, int row_end, const ActRef& a,
                                                 int ncols) {
    const int ntiles = (row_end - row_begin + MK_TILE_ROWS - 1) / MK_TILE_ROWS;
    return MvNext{&w, row_begin, 0, min(MV_BATCH, ntiles), 0, w.cols / QK_SB / mv_chunks(w, a, ncols)};
}

// An instruction's first matmul (its consumer's first mv_rows call), for MK_MV_PRIME_NEXT: the ops' Primer.
struct MvFirst {
    const WeightRef* w;
    int row_begin, row_end;
    const ActRef* a;
};

// The first NS - 1 units of f's first batch into every warp's ring, where its kind stages weights alone; records
// the batch for mv_rows to claim. Every consumer thread calls it, before the instruction's wait.
__device__ __noinline__ void mv_prime_first(const MvFirst& f, int ncols, u8* rings) {
    const WeightRef& w = *f.w;
    if (!mv_staged(w, f.row_begin) || f.row_end <= f.row_begin) return;
    const MvNext nx = mv_first_batch(w, f.row_begin, f.row_end, *f.a, ncols);
    bool primed = false;
    mv_staged_kind(w.qtype, ncols, mv_act_i8(*f.a, ncols), nx.sb1 - nx.sb0, [&](auto kind) {
        using K = decltype(kind);
        if constexpr (!K::ACT_STAGED && K::INT8 != A8_STAGED) {  // the act is not ready before the wait
            mv_prime<K::QTYPE, K::RESIDUE_MMA, K::ACT_STAGED, K::INT8>(nx, *f.a, 0, rings);
            primed = true;
        }
    });
    if (primed && ctid() == 0) {
        mk_primed_w = f.w;
        mk_primed_rows[0] = f.row_begin;
        mk_primed_rows[1] = f.row_end;
    }
}

// The products of rows [row_begin, row_end), handed to store(first_row, n, out) with out[r * 8 + t] row
// first_row + r's product with act row n0 + t: a batch's tiles at once where the weight is staged (n up to
// 16 x MV_BATCH: every store spreads its rows over all consumer threads, so a store that reads before it writes -
// the residual, the conv window - waits one L2 round trip a batch, not one a tile on 16 threads: ~15 us of a
// DeltaNet MIX_IN's conv, bench/MEGAKERNEL.md round 7), else a 16-row tile at a time.
// `then`: the weight the caller multiplies next over the same rows and act (FFN_UP's up after its gate); with
// MK_MV_CARRY this call's last batch primes its first, and the flags returned are what the caller hands to that
// call (`flags`: for this call's first batch). Stores must leave the ring area alone (they do: out, red, the
// ops' buffers and global memory).
template <class Store>
__device__ int mv_rows(const Globals& g, const WeightRef& w, int row_begin, int row_end, const ActRef& a, int n0,
                       int ncols, float* scratch, Store&& store, const WeightRef* then = nullptr, int flags = 0) {
    float* out = scratch;
    if (MK_MV_PRIME_NEXT && mk_primed_w) {  // the wait primed a batch: this call's first, or it lands unused first
        if (mk_primed_w == &w && mk_primed_rows[0] == row_begin && mk_primed_rows[1] == row_end)
            flags |= MV_PRIMED;
        else
            cp_async_wait<0>();
    }
    if (mv_staged(w, row_begin)) {  // batches of MV_BATCH tiles, one barrier before their sums
        const int ntiles = (row_end - row_begin + MK_TILE_ROWS - 1) / MK_TILE_ROWS, nsb = w.cols / QK_SB;
        const int chunks = mv_chunks(w, a, ncols);
        for (int b0 = 0; b0 < ntiles; b0 += MV_BATCH) {
            const int nt = min(MV_BATCH, ntiles - b0);
            for (int c = 0; c < chunks; ++c) {
                const int s0 = nsb * c / chunks, s1 = nsb * (c + 1) / chunks;
                // the batch after this one: the next chunk, else the next tiles, else `then`'s first
                MvNext nx{&w, row_begin, b0, nt, s1, nsb * (c + 2) / chunks};
                if (c + 1 == chunks) {
                    if (b0 + MV_BATCH < ntiles)
                        nx = MvNext{&w, row_begin, b0 + MV_BATCH, min(MV_BATCH, ntiles - b0 - MV_BATCH), 0, nsb / chunks};
                    else if (then && then->cols == w.cols)
                        nx = mv_first_batch(*then, row_begin, row_end, a, ncols);
                    else
                        nx.w = nullptr;
                }
                const bool carry = nx.w && mv_carries(w, s1 - s0, nx);
                mv_batch(g, w, row_begin, b0, nt, s0, s1, a, n0, ncols, scratch, c > 0, carry ? &nx : nullptr, flags);
                // one chunk: the next batch's superblocks are these, whose levels the area holds
                flags = carry ? MV_PRIMED | (chunks == 1 ? MV_KEEP_LEVELS : 0) : 0;
            }
            const int tr = row_begin + MK_TILE_ROWS * b0;  // out [tile][16][8] is [rows][8] of the batch's rows
            store(tr, min(MK_TILE_ROWS * nt, row_end - tr), out);
            consumers_sync();
        }
        return flags;  // nonzero only where the last batch primed `then`'s first
    }
    for (int r0 = row_begin; r0 < row_end; r0 += MK_TILE_ROWS) {
        mv_dispatch(g, w, r0, a, n0, ncols, out, scratch + MV_OUT_FLOATS);
        store(r0, min(MK_TILE_ROWS, row_end - r0), out);
        consumers_sync();
    }
    return 0;
}
