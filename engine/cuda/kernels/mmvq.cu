// Quantized matrix x small batch: y[T, rows] = x[T, K] @ W[rows, K]^T (+ bias) (+ residual), T = 1..8.
//
// Decode and verification are bound by streaming the weights from HBM once, so each weight block is decoded once
// and reused for every row of the batch: tensor cores (mma.m16n8k16, N = 8 = the largest T) multiply the
// decoded f16 block by all T activation rows at once, and T = 5 costs about what T = 1 does.
// A block of W warps owns 16 * MT output rows; its warps split K by superblocks and reduce through shared memory.
#include "mmvq.cuh"
#if defined(OPENJET_PROBE_DECODE_ONLY) || defined(OPENJET_PROBE_MMA_ONLY) || defined(OPENJET_PROBE_ACT_ONLY) || \
    defined(OPENJET_PROBE_ACT_HOT) ||     defined(OPENJET_PROBE_MMA_NOACT) || defined(OPENJET_PROBE_MMA_SPLIT)
#include "probe.cuh"
#endif

// One superblock of the lane's two rows. a_sb: this superblock's activations for the lane (token g, slot 4c);
// step s is at a_sb + 128 s. LO (precise mode): x = hi + lo, both f16, every product taken twice, so the result
// carries f32-level activation precision. The sub-block sums are always the exact sums of what the mma sees
// (a hi + lo pair), so the Q4_K/Q5_K offset cancels exactly instead of amplifying rounding.
template <int QT, bool LO>
__device__ __forceinline__ void mmvq_compute(const typename QTraits<QT>::Row (&r)[2], const f16* __restrict__ a_sb,
                                             const f16* __restrict__ alo_sb, u32 sum_hi, u32 sum_lo, bool has_col,
                                             int c, float (&acc)[4]) {
    using Q = QTraits<QT>;
    u32 b[SB_STEPS][2], bl[LO ? SB_STEPS : 1][2];
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        const uint2 v = has_col ? ld_cached_u2(a_sb + 128 * s) : make_uint2(0u, 0u);
        b[s][0] = v.x;
        b[s][1] = v.y;
        if constexpr (LO) {
            const uint2 vl = has_col ? ld_cached_u2(alo_sb + 128 * s) : make_uint2(0u, 0u);
            bl[s][0] = vl.x;
            bl[s][1] = vl.y;
        }
    }
    typename Q::Consts k[2];
    Q::prepare(r[0], c, k[0]);
    Q::prepare(r[1], c, k[1]);
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
    float* dst = Q::BLOCK_SCALE ? blk : acc;
#pragma unroll
    for (int s = 0; s < SB_STEPS; ++s) {
        u32 a[4];
        Q::frag(r[0], k[0], c, s, a[0], a[2]);
        Q::frag(r[1], k[1], c, s, a[1], a[3]);
        mma_f16_16816(dst, a, b[s]);
        if constexpr (LO) mma_f16_16816(dst, a, bl[s]);
    }
    if constexpr (Q::BLOCK_SCALE) {
        const float d0 = Q::dscale(r[0]), d1 = Q::dscale(r[1]);
        acc[0] += d0 * blk[0];
        acc[1] += d0 * blk[1];
        acc[2] += d1 * blk[2];
        acc[3] += d1 * blk[3];
    }
    if constexpr (Q::HAS_MIN) {
        float cm[4] = {0.f, 0.f, 0.f, 0.f};
        min_mma(cm, k[0].mins, k[1].mins, sum_hi);
        min_mma(cm, k[0].mins, k[1].mins, sum_lo);
        const float m0 = Q::mscale(r[0]), m1 = Q::mscale(r[1]);
        acc[0] -= m0 * cm[0];
        acc[1] -= m0 * cm[1];
        acc[2] -= m1 * cm[2];
        acc[3] -= m1 * cm[3];
    }
}

template <int QT>
__device__ __forceinline__ void mmvq_load(typename QTraits<QT>::Row (&r)[2], const Planes& P, int nb, int row0,
                                          int rows, int sb, int c, int g) {
    // rows past the end repeat the last one (their results are never stored)
    QTraits<QT>::load(r[0], P, nb, min(row0 + g, rows - 1), sb, c);
    QTraits<QT>::load(r[1], P, nb, min(row0 + g + 8, rows - 1), sb, c);
}

// y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), T <= 8, x in the act layout. A block owns 16 output rows;
// its warps take superblocks sb = warp, warp + W, ... with the next superblock's weights loaded (double-buffered)
// while the current one is multiplied, then reduce through shared memory. sums, sums_lo: the hi/lo f16 pair of
// each sub-block's sum (K-quants with mins); act_lo: the activations' rounding residue (LO only).
template <int QT, bool LO>
__global__ void __launch_bounds__(MMVQ_MAX_WARPS * 32, QTraits<QT>::MIN_BLOCKS)
mmvq(const u8* __restrict__ w, const f16* __restrict__ act, const f16* __restrict__ sums, const f16* __restrict__ act_lo,
     const f16* __restrict__ sums_lo, float* __restrict__ y, const float* __restrict__ bias,
     const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    PDL_ENTER();
    using Q = QTraits<QT>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int nb = Q::QK == 1 ? K : (K + Q::QK - 1) / Q::QK;
    const int nsb = (K + QK_SB - 1) / QK_SB;
    const Planes P = Q::planes(w, (u64)rows * nb);
    const bool has_col = g < T;
    // per superblock: act + 2048 sb halves, the lane's slot at g * 16 + 4c; sums at 64 sb + 8 g + 2c
    const f16* a_lane = act + g * 16 + 4 * c;
    const f16* alo_lane = LO ? act_lo + g * 16 + 4 * c : a_lane;  // read only when LO
    const u32* s_lane = reinterpret_cast<const u32*>(sums + g * 8 + 2 * c);
    const u32* slo_lane = reinterpret_cast<const u32*>(sums_lo + g * 8 + 2 * c);

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    typename Q::Row ra[2], rb[2];
    int sb = warp;
    if (sb < nsb) mmvq_load<QT>(ra, P, nb, row0, rows, sb, c, g);
    while (sb < nsb) {  // unrolled by two so the buffers swap without copies
        if (sb + num_warps < nsb) mmvq_load<QT>(rb, P, nb, row0, rows, sb + num_warps, c, g);
        u32 shi = 0u, slo = 0u;
        if (Q::HAS_MIN && has_col) {
            shi = __ldg(s_lane + 32 * sb);
            slo = __ldg(slo_lane + 32 * sb);
        }
        mmvq_compute<QT, LO>(ra, a_lane + 2048 * sb, alo_lane + 2048 * sb, shi, slo, has_col, c, acc);
        sb += num_warps;
        if (sb >= nsb) break;
        if (sb + num_warps < nsb) mmvq_load<QT>(ra, P, nb, row0, rows, sb + num_warps, c, g);
        if (Q::HAS_MIN && has_col) {
            shi = __ldg(s_lane + 32 * sb);
            slo = __ldg(slo_lane + 32 * sb);
        }
        mmvq_compute<QT, LO>(rb, a_lane + 2048 * sb, alo_lane + 2048 * sb, shi, slo, has_col, c, acc);
        sb += num_warps;
    }

    mmvq_store(acc, y, bias, residual, row0, rows, T, ldy, false);
}

// ---- the pipelined variant (K-quants): weights staged through shared memory by cp.async ----
//
// The same block shape and result as mmvq, but each warp keeps Stage<QT>::STAGES - 1 superblocks of its 16 rows
// in flight (cp.async into a per-warp ring of shared-memory stages, no registers held): an SM has up to 16 warps
// x 3 x 2.3 KB requested instead of 16 x 2.3 KB. On the H200 that alone bought nothing (bench/NOTES.md, v7: both
// kernels stream ~2 TB/s at the 27B shapes, the cost is per block and per launch); the ring is the piece the
// persistent grid (kernels/mmvq_persist.cu) runs on. What this kernel wins is precise mode up to 4 tokens,
// through the column packing of mmvq.cuh (a second mma above that).

// y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), T <= 8, K a multiple of 256. Launch: one block of W warps
// per 16 rows, dynamic shared memory W * STAGES * Stage<QT>::BYTES. LO: precise activations (act_lo) packed into
// columns T..2T-1 (T <= 4; launch TWO above that, or precision is lost); TWO: the residue as a second mma (any T).
template <int QT, bool LO, bool TWO>
__global__ void __launch_bounds__(MMVQ_MAX_WARPS * 32, 2)
mmvq_cp(const u8* __restrict__ w, const f16* __restrict__ act, const f16* __restrict__ sums,
        const f16* __restrict__ act_lo, const f16* __restrict__ sums_lo, float* __restrict__ y,
        const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    using Q = QTraits<QT>;
    using S = Stage<QT>;
    constexpr int NS = S::STAGES;
    extern __shared__ __align__(16) u8 stages[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16, nb = K / QK_SB;
    const u64 ntot = (u64)rows * nb;
    const Planes P = Q::planes(w, ntot);
    u8* ring = stages + warp * NS * S::BYTES;
    const u32 ring_s = smem_u32(ring);
    typename S::Lane L;
    S::init(L, row0, rows, nb, lane);
    const int n = warp < nb ? (nb - warp + num_warps - 1) / num_warps : 0;  // superblocks warp, warp + W, ...
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (s < n) S::copy(ring_s + s * S::BYTES, P, L, warp + s * num_warps, lane, ntot);
        cp_async_commit();  // empty groups keep the group count uniform
    }
    PDL_ENTER();  // the first weights are on their way; the activations are the previous kernel's output
    const CpColumns cols = cp_columns<LO, TWO>(act, sums, act_lo, sums_lo, T, g, c);
    const u32 base0 = stage_row_base(row0, g, rows, nb), base1 = stage_row_base(row0, g + 8, rows, nb);

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < n; ++i) {
        __syncwarp();  // every lane is done reading the stage the next copy overwrites
        const int ahead = i + NS - 1;
        if (ahead < n) S::copy(ring_s + (ahead % NS) * S::BYTES, P, L, warp + ahead * num_warps, lane, ntot);
        cp_async_commit();
        cp_async_wait<NS - 1>();  // this lane's copies of superblock i have landed
        __syncwarp();             // and every other lane's
        const int sb = warp + i * num_warps;
        const u8* st = ring + (i % NS) * S::BYTES;
#ifdef OPENJET_PROBE_LOADS_ONLY  // bench/gpu_stream.py: the same copies and ring, no decoding or mma
        acc[0] += __int_as_float(reinterpret_cast<const u32*>(st)[lane] & 0x007FFFFFu);
#else
        typename Q::Row r[2];
        S::read(r[0], st, g, c, base0 + sb);
        S::read(r[1], st, g + 8, c, base1 + sb);
#if defined(OPENJET_PROBE_DECODE_ONLY)  // kernels/probe.cuh
        probe_decode_only<QT>(r, c, acc);
#elif defined(OPENJET_PROBE_MMA_ONLY)
        probe_mma_chain<QT, false, false>(cols, r, sb, acc);
#elif defined(OPENJET_PROBE_ACT_ONLY) || defined(OPENJET_PROBE_ACT_HOT)
        probe_act_only<QT>(cols, r, sb, acc);
#elif defined(OPENJET_PROBE_MMA_NOACT)
        probe_mma_chain<QT, true, false>(cols, r, sb, acc);
#elif defined(OPENJET_PROBE_MMA_SPLIT)
        probe_mma_chain<QT, false, true>(cols, r, sb, acc);
#else
        cp_superblock<QT, TWO>(cols, r, sb, c, acc);
#endif
#endif
    }
    cp_async_wait<0>();  // nothing may land in shared memory after the block exits
    mmvq_store(acc, y, bias, residual, row0, rows, T, ldy, cols.packed);
}

// ---- staged activations (kernels/mmvq.cuh): the activation columns travel in the stages with the weights ----
//
// y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), T <= 4 (packed columns: LO puts the residue in columns
// T..2T-1, fast mode leaves them zero with the lo sums), K a multiple of 256. A block of W warps owns TILES
// consecutive 16-row tiles; warp w takes superblocks w, w + W, ... of all of them, so each stage's activations
// serve 16 TILES rows: with TILES = 2 a weight byte brings half the activation copies (at 2-4 tokens one tile's
// copies outgrew the weights' L2 traffic, bench/NOTES.md v10). Launch: ceil(tiles / TILES) blocks, dynamic shared
// memory W * (NS * (TILES * Stage<QT>::BYTES + staged_act_bytes) + ACT_ZERO_BYTES).
template <int QT, bool LO, int TILES, int NS>
__global__ void __launch_bounds__(MMVQ_MAX_WARPS * 32, 2)
mmvq_cpa(const u8* __restrict__ w, const f16* __restrict__ act, const f16* __restrict__ sums,
         const f16* __restrict__ act_lo, const f16* __restrict__ sums_lo, float* __restrict__ y,
         const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    using Q = QTraits<QT>;
    using S = Stage<QT>;
    extern __shared__ __align__(16) u8 stages[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16 * TILES, nb = K / QK_SB;
    const u64 ntot = (u64)rows * nb;
    const Planes P = Q::planes(w, ntot);
    constexpr int WBYTES = TILES * S::BYTES;  // one superblock of every tile's weights (the columns follow)
    const int stage_bytes = WBYTES + staged_act_bytes(T, LO, Q::HAS_MIN);
    u8* ring = stages + warp * (NS * stage_bytes + ACT_ZERO_BYTES);
    const u32 ring_s = smem_u32(ring);
    typename S::Lane L[TILES];
#pragma unroll
    for (int t = 0; t < TILES; ++t) S::init(L[t], row0 + 16 * t, rows, nb, lane);
    const int n = warp < nb ? (nb - warp + num_warps - 1) / num_warps : 0;  // superblocks warp, warp + W, ...
#pragma unroll
    for (int s = 0; s < NS - 1; ++s)
        if (s < n)
#pragma unroll
            for (int t = 0; t < TILES; ++t)
                S::copy(ring_s + s * stage_bytes + t * S::BYTES, P, L[t], warp + s * num_warps, lane, ntot);
    PDL_ENTER();  // the first weights are on their way; the activations are the previous kernel's output
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {  // the first stages' activations, in the weights' groups
        if (s < n)
            staged_act_copy<Q::HAS_MIN>(ring_s + s * stage_bytes + WBYTES, act, act_lo, sums, sums_lo,
                                        warp + s * num_warps, T, LO, lane);
        cp_async_commit();
    }
    // the lane's column and sums word inside a stage, or the zero row after the ring
    const int nslot = staged_act_slots(T, LO);
    const int a_off = WBYTES + ACT_SLOT_PITCH * g + 8 * c;
    const int s_off = WBYTES + ACT_SLOT_PITCH * nslot + 16 * g + 4 * c;
    u8* zero = ring + NS * stage_bytes;
    for (int k = lane; k < ACT_ZERO_BYTES / 16; k += 32) reinterpret_cast<uint4*>(zero)[k] = make_uint4(0u, 0u, 0u, 0u);
    __syncwarp();
    u32 base[TILES][2];
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        base[t][0] = stage_row_base(row0 + 16 * t, g, rows, nb);
        base[t][1] = stage_row_base(row0 + 16 * t, g + 8, rows, nb);
    }

    float acc[TILES][4] = {};
    for (int i = 0; i < n; ++i) {
        __syncwarp();  // every lane is done reading the stage the next copy overwrites
        const int ahead = i + NS - 1;
        if (ahead < n) {
            const int sb_ahead = warp + ahead * num_warps;
            const u32 dst = ring_s + (ahead % NS) * stage_bytes;
#pragma unroll
            for (int t = 0; t < TILES; ++t) S::copy(dst + t * S::BYTES, P, L[t], sb_ahead, lane, ntot);
            staged_act_copy<Q::HAS_MIN>(dst + WBYTES, act, act_lo, sums, sums_lo, sb_ahead, T, LO, lane);
        }
        cp_async_commit();
        cp_async_wait<NS - 1>();  // this lane's copies of superblock i have landed
        __syncwarp();             // and every other lane's
        const int sb = warp + i * num_warps;
        const u8* st = ring + (i % NS) * stage_bytes;
        u32 b[SB_STEPS][2], unused[1][2];
        load_b_staged(b, g < nslot ? st + a_off : zero + 8 * c);
        const u32 sum = Q::HAS_MIN && g < 2 * T ? *reinterpret_cast<const u32*>(st + s_off) : 0u;
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
            typename Q::Row r[2];
            S::read(r[0], st + t * S::BYTES, g, c, base[t][0] + sb);
            S::read(r[1], st + t * S::BYTES, g + 8, c, base[t][1] + sb);
            mmvq_cp_product<QT, false>(r, b, unused, sum, 0u, false, c, acc[t]);
        }
    }
    cp_async_wait<0>();  // nothing may land in shared memory after the block exits
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        if (t) __syncthreads();  // the last tile's readers are done with the reduction buffer
        mmvq_store(acc[t], y, bias, residual, row0 + 16 * t, rows, T, ldy, true);
    }
}

// Plain f32 weights (small tensors only): one warp per row, f32 FMA, T <= 8 columns.
__global__ void __launch_bounds__(256)
mmv_f32(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
        const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K, int T, int ldx,
        int ldy) {
    PDL_ENTER();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    float acc[MMVQ_NCOLS];
#pragma unroll
    for (int n = 0; n < MMVQ_NCOLS; ++n) acc[n] = 0.f;
    const float* wr = w + (i64)row * K;
    for (int k = lane; k < K; k += 32) {
        const float wv = wr[k];
#pragma unroll
        for (int n = 0; n < MMVQ_NCOLS; ++n)
            if (n < T) acc[n] += wv * x[(i64)n * ldx + k];
    }
#pragma unroll
    for (int n = 0; n < MMVQ_NCOLS; ++n) {
        if (n >= T) break;
        float v = warp_sum(acc[n]);
        if (lane == 0) {
            if (bias) v += bias[row];
            if (residual) v += residual[(i64)n * ldy + row];
            y[(i64)n * ldy + row] = v;
        }
    }
}
