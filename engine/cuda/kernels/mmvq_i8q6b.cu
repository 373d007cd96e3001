// Q6_K x one token with int8 activations, the weights streamed by the tensor-copy engine (sm_90+): y[rows] = W x
// (+ bias) (+ residual); and x 2-8 tokens (mmvq_q6_i8v, the verify rows: at the end of this file). The arithmetic
// of kernels/mmvq_i8q6.cu at T = 1 (signed 6-bit weights in a few logic ops, mma.m16n8k32 against the act8 copy's
// two int8 levels, each column one 16-wide sub-block at one level); the copies, the walking grid and the staged row
// of kernels/mmvq_i8b.cu.
//
// Why. mmvq_q6_i8 issues 7 cp.async copies a lane a stage, and on the H200 a cp.async matmul streams at ~23 GB/s
// an SM where mmvq_i8b's tensor copies reach ~27 (bench/NOTES.md Z21): ffn_down's Q6_K bytes were the slowest of
// the one-token pass (~2.1 TB/s, 24 launches of 73 MB). Here lane 0 of a warp issues a stage: per superblock one
// tensor copy of the tile's 16 ql' rows (a 16 x 128-byte box, 128-byte swizzle, as Q4_K's quants) and one of its
// 16 qh' rows (16 x 64 bytes, 64-byte swizzle), both counted in at the stage's mbarrier. The scales and d are
// small and row-major with strides no tensor map takes (d's row is 2 nb bytes), so every lane copies a piece of
// them by cp.async as mmvq_q6_i8 does (lanes 0-15 a row's 16 scales, 16-31 the word that holds a row's d), one
// commit group a stage: a stage is in once its mbarrier's phase has passed and its group has landed.
//
// Rows. Lane (g, c) takes tile rows 2g and 2g + 1 (mma rows g and g + 8), as mmvq_i8b: a half-warp's four rows
// have swizzles of both parities, so its 8-byte reads of ql' fall in eight different 16-byte chunks, and of qh'
// (swizzled by row / 2) in four chunks of different banks.
//
// In halves (HALVES, an even grid), as mmvq_i8b: block b walks half-tiles b, b + G, ..., all of its index's
// parity (mmvq_half's split of a tile), and stages only that half of the row; the first half stores y = its sums
// + bias + residual, the second y2 = its sums, which the next RMSNorm adds (engine/cuda/ops.py rmsnorm_of add=).
//
// Not built before sm_90 (no tensor copies): the launcher (engine/cuda/q6b.py) takes it on sm_90+ only.
#include "i8q6k.cuh"
#include "tma.cuh"

#define Q6B_MAX_WARPS 8
#define Q6B_QL_BYTES 2048  // a superblock's ql' box: 16 rows x 128 bytes
#define Q6B_QH_BYTES 1024  // its qh' box: 16 rows x 64 bytes
#define Q6B_WORD_BYTES 320  // its 16 rows' scales (16 bytes each), then the words holding their d (4 bytes each)

// The block's activations of n superblocks (its part of the row), staged once: the hi level [n][256], the lo level
// 64 bytes further (a quarter-warp's hi and lo readers fall in different banks), then each superblock's two level
// scales (hi, lo; 16 bytes a superblock, 8 used). Mirrored by engine/cuda/q6b.py x_bytes.
__device__ __forceinline__ int q6b_xlo(int n) { return 256 * n + 64; }
__device__ __forceinline__ int q6b_xsc(int n) { return q6b_xlo(n) + 256 * n; }
__device__ __forceinline__ int q6b_x_bytes(int n) { return (q6b_xsc(n) + 16 * n + 1023) & ~1023; }

// Superblocks sb0 .. sb0 + n - 1 of token 0's act8 copy into xs, by all the block's threads; waited for (with
// every earlier copy of the thread) before the caller returns.
__device__ __forceinline__ void q6b_stage_x(u32 xs, const i8* q8, const float* scale8, int sb0, int n) {
    const u8* q = reinterpret_cast<const u8*>(q8) + (u64)sb0 * 4096;
    for (int i = threadIdx.x; i < 32 * n; i += blockDim.x) {  // 16 chunks of each level a superblock
        const int sb = i >> 5, part = i & 15, level = (i >> 4) & 1;
        cp_async16(xs + (level ? q6b_xlo(n) : 0) + 256 * sb + 16 * part, q + 4096 * sb + 2048 * level + 16 * part);
    }
    for (int i = threadIdx.x; i < 2 * n; i += blockDim.x)  // scale8 [sb][level][8]: token 0's hi, then lo
        cp_async4(xs + q6b_xsc(n) + 16 * (i >> 1) + 4 * (i & 1), scale8 + 16 * (sb0 + (i >> 1)) + 8 * (i & 1));
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
}

// A warp's ring of NS stages of S superblocks over its share (superblocks sb0 .. sb0 + n - 1) of each tile its
// block walks (blockIdx.x + k gridDim.x, >> tshift in halves): ql' boxes at ql, qh' boxes at qh, the scales and d
// words at wd (shared addresses), an mbarrier a slot at bars. Every lane calls issue and acquire: lane 0 issues
// the tensor copies, every lane its cp.async piece, and each call commits one group (empty or not), so a lane's
// groups stay one a stage.
template <int S, int NS>
struct Q6bRing {
    const TensorMap *qlmap, *qhmap;
    const u8 *scales, *dplane;
    u64 ntot;
    u32 ql, qh, wd, bars;
    int rows, nb, sb0, n, spt, num_stages, tshift;  // spt: stages a tile
    I8bCursor out;                                  // the next stage to issue

    __device__ __forceinline__ Q6bRing(const TensorMap& lm, const TensorMap& hm, const Planes& P, int rows_, int nb_,
                                       u32 ql_, u32 qh_, u32 wd_, u32 b, int sb0_, int n_, int my_tiles, int tshift_)
        : qlmap(&lm), qhmap(&hm), scales(P.p[2]), dplane(P.p[3]), ntot((u64)rows_ * nb_), ql(ql_), qh(qh_), wd(wd_),
          bars(b), rows(rows_), nb(nb_), sb0(sb0_), n(n_), spt((n_ + S - 1) / S),
          num_stages(my_tiles * ((n_ + S - 1) / S)), tshift(tshift_) {}

    __device__ __forceinline__ u32 lows(int slot) const { return ql + slot * S * Q6B_QL_BYTES; }
    __device__ __forceinline__ u32 highs(int slot) const { return qh + slot * S * Q6B_QH_BYTES; }
    __device__ __forceinline__ u32 words(int slot) const { return wd + slot * S * Q6B_WORD_BYTES; }

    // Stage `out` into ring slot `slot`, then one commit group.
    __device__ __forceinline__ void issue(int slot, int lane) {
        const int row0 = 16 * (((int)blockIdx.x + out.k * (int)gridDim.x) >> tshift);
        const int sb = sb0 + out.j * S, here = min(S, n - out.j * S);
        const u32 bar = bars + 8 * slot;
        if (lane == 0) {
            mbar_expect_tx(bar, (u32)here * (Q6B_QL_BYTES + Q6B_QH_BYTES));
            for (int s = 0; s < here; ++s) {
                tensor_copy_2d(lows(slot) + Q6B_QL_BYTES * s, *qlmap, 128 * (sb + s), row0, bar);
                tensor_copy_2d(highs(slot) + Q6B_QH_BYTES * s, *qhmap, 64 * (sb + s), row0, bar);
            }
        }
        const u64 idx = (u64)stage_row_base(row0, lane & 15, rows, nb) + sb;  // row lane % 16's block index
        for (int s = 0; s < here; ++s) {
            const u32 dst = words(slot) + Q6B_WORD_BYTES * s;
            if (lane < 16)
                cp_async16_w(dst + 16 * lane, scales + (idx + s) * 16);
            else
                q6k_d_word_copy(dst + 256 + 4 * (lane - 16), dplane, idx + s, ntot);
        }
        cp_async_commit();
        out.next(spt);
    }

    // Lane 0 the barriers; every lane the first NS - 1 stages (a group each, empty past the last). The weights
    // do not depend on the previous kernel, so this goes before PDL_ENTER.
    __device__ __forceinline__ void start(int lane) {
        if (lane == 0) mbar_init_ring(bars, NS);
        __syncwarp();
        for (int k = 0; k < NS - 1; ++k) {
            if (k < num_stages)
                issue(k, lane);
            else
                cp_async_commit();
        }
    }

    // Stage i's slot (all tiles counted) once its bytes are in; first the slot that stage i - 1 read is refilled
    // with stage i + NS - 1, after every lane is done reading it.
    __device__ __forceinline__ int acquire(int i, int lane) {
        const int slot = i % NS;
        __syncwarp();
        if (i + NS - 1 < num_stages)
            issue((i + NS - 1) % NS, lane);
        else
            cp_async_commit();
        cp_async_wait<NS - 1>();  // this lane's piece of stage i
        __syncwarp();             // and every other lane's
        i8b_wait(bars + 8 * slot, i / NS);
        return slot;
    }
};

// The lane's 8 bytes of qh' chunk j (0-3) of tile row 2g + r in a 64-byte-swizzled box (16-byte chunk k of row t
// at k ^ (t / 2 % 4)), as byte offsets.
__device__ __forceinline__ void q6b_high_offsets(int g, int c, int (&hoff)[2][4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = 2 * g + r;
            hoff[r][j] = 64 * t + 16 * (j ^ ((t >> 1) & 3)) + 8 * (c & 1);
        }
}

// The A fragments of chunk j's low (a[0]) and high (a[1]) mma from a superblock's ql' box at ql and qh' box at qh:
// tile rows 2g, 2g + 1 (mma rows g, g + 8) at the lane's k, as signed q - 32 (kernels/mmvq_i8q6.cu's positions).
__device__ __forceinline__ void q6b_frags(const u8* ql, const u8* qh, const int (&qoff)[2][4], const int (&hoff)[2][4],
                                          int c, int j, u32 (&a)[2][4]) {
    const int hshift = 4 * (c >> 1);
    const uint2 l0 = *reinterpret_cast<const uint2*>(ql + qoff[0][j]);
    const uint2 l1 = *reinterpret_cast<const uint2*>(ql + qoff[1][j]);
    const uint2 h0 = *reinterpret_cast<const uint2*>(qh + hoff[0][j]);
    const uint2 h1 = *reinterpret_cast<const uint2*>(qh + hoff[1][j]);
    const u32 h0x = h0.x >> hshift, h0y = h0.y >> hshift, h1x = h1.x >> hshift, h1y = h1.y >> hshift;
    a[0][0] = q6_s8x4(l0.x, h0x);
    a[0][1] = q6_s8x4(l1.x, h1x);
    a[0][2] = q6_s8x4(l0.y, h0y);
    a[0][3] = q6_s8x4(l1.y, h1y);
    a[1][0] = q6_s8x4(l0.x >> 4, h0x >> 2);
    a[1][1] = q6_s8x4(l1.x >> 4, h1x >> 2);
    a[1][2] = q6_s8x4(l0.y >> 4, h0y >> 2);
    a[1][3] = q6_s8x4(l1.y >> 4, h1y >> 2);
}

// Tile rows 2g and 2g + 1's 16 sub-block scales from the word stage at wd, as four words each (word j: the scales
// of chunk j's sub-blocks 4j .. 4j + 3).
__device__ __forceinline__ void q6b_scale_words(const u8* wd, int g, u32 (&scw)[2][4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const uint4 sc = *reinterpret_cast<const uint4*>(wd + 16 * (2 * g + r));
        scw[r][0] = sc.x, scw[r][1] = sc.y, scw[r][2] = sc.z, scw[r][3] = sc.w;
    }
}

// Tile row 2g + r's d from the word stage at wd (idx: the block index of its superblock, which half of the word).
__device__ __forceinline__ float q6b_row_d(const u8* wd, int g, int r, u32 idx) {
    return f16_to_f32((f16)q6k_d_of_word(*reinterpret_cast<const u32*>(wd + 256 + 4 * (2 * g + r)), idx));
}

// One superblock (its ql' box at ql, qh' box at qh, scales and d words at wd; superblock sx of the staged x of
// nx) into the lane's sums acc of tile rows 2g, 2g + 1; idx[r]: the block index of row 2g + r's superblock (which
// half of its d word holds d). Lane (g, c) supplies B column g: sub-block g / 2 of each 64-position chunk (0, 1 the
// low nibbles of lanes c < 2 and c >= 2, 2, 3 the high ones) at level g % 2, zero where the mma's k are another
// sub-block's; it ends each chunk with sub-block c's sums of its two rows at both levels, scaled by one IMAD each.
__device__ __forceinline__ void q6b_superblock(const u8* ql, const u8* qh, const u8* wd, const u8* x, int nx,
                                               int sx, const int (&qoff)[2][4], const int (&hoff)[2][4], int g,
                                               int c, const u32 (&idx)[2], float (&acc)[2]) {
    u32 scw[2][4];
    q6b_scale_words(wd, g, scw);
    const u8* xv = x + ((g & 1) ? q6b_xlo(nx) : 0) + 256 * sx + 16 * c;
    const int u = g >> 1;
    int isum[4] = {0, 0, 0, 0};  // (row 2g, hi), (row 2g, lo), (row 2g + 1, hi), (row 2g + 1, lo)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u32 a[2][4];
        q6b_frags(ql, qh, qoff, hoff, c, j, a);
        const uint4 b = *reinterpret_cast<const uint4*>(xv + 64 * j);
        int d[4] = {0, 0, 0, 0};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const bool on = u == 2 * h + (c >> 1);
            mma_s8s8_16832_acc(d, a[h], on ? (h ? b.z : b.x) : 0u, on ? (h ? b.w : b.y) : 0u);
        }
        const int s0 = sbyte(scw[0][j], 8 * c), s1 = sbyte(scw[1][j], 8 * c);  // sub-block 4j + c of each row
        isum[0] += s0 * d[0];
        isum[1] += s0 * d[1];
        isum[2] += s1 * d[2];
        isum[3] += s1 * d[3];
    }
    const float2 lv = *reinterpret_cast<const float2*>(x + q6b_xsc(nx) + 16 * sx);  // token 0's hi, lo scales
#pragma unroll
    for (int r = 0; r < 2; ++r)
        acc[r] += q6b_row_d(wd, g, r, idx[r]) * ((float)isum[2 * r] * lv.x + (float)isum[2 * r + 1] * lv.y);
}

// y[rows] = x @ W^T (+ bias) (+ residual), W Q6_K (qlmap, qhmap: its ql' and qh' planes, engine/cuda/q6b.py), one
// token, K a multiple of 256, x in act8 (group 0's bases). Launch: blocks of W <= Q6B_MAX_WARPS warps walking the
// 16-row tiles b, b + gridDim.x, ... (or, HALVES, the half-tiles: an even grid), the block's part of the row staged
// once; warp w takes the w-th contiguous share of each tile's superblocks (of the block's half) through its ring of
// NS stages of S superblocks; dynamic shared memory 1024 (alignment) + q6b_x_bytes(part) + W NS S (2048 + 1024 +
// 320), part the superblocks of a block's (larger) half or the whole row.
// (Launch bounds with a minimum of one block: without it ptxas holds the kernel to 80 registers and spills.)
template <int S, int NS, bool HALVES>
__global__ void __launch_bounds__(Q6B_MAX_WARPS * 32, 1)
mmvq_q6_i8b(const __grid_constant__ TensorMap qlmap, const __grid_constant__ TensorMap qhmap,
            const u8* __restrict__ w, const i8* __restrict__ q8, const float* __restrict__ scale8,
            float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ residual, int rows,
            int K, float* __restrict__ y2) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(1024) u8 smem[];
    __shared__ __align__(8) u64 bars[Q6B_MAX_WARPS][NS];
    __shared__ float red[2][Q6B_MAX_WARPS][16];  // by tile parity: one __syncthreads a tile
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3, nb = K / QK_SB, ntiles = (rows + 15) / 16;
    const MmvqHalf part = mmvq_half<HALVES>(nb);  // the block's superblocks of each tile (its .tile unused)
    const int share = (part.len + num_warps - 1) / num_warps, sx0 = warp * share;  // in the block's part
    const int n = max(0, min(share, part.len - sx0));
    const int walked = HALVES ? 2 * ntiles : ntiles;  // tiles, or half-tiles
    const int my_tiles = (walked - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    // the regions: x, then every warp's ql' ring, qh' ring (1024-byte aligned boxes), and word ring
    const u32 base = (smem_u32(smem) + 1023u) & ~1023u;
    const u8* x = smem + (base - smem_u32(smem));
    const u32 rings = base + q6b_x_bytes(HALVES ? nb - nb / 2 : nb), ring_qs = num_warps * NS * S;
    Q6bRing<S, NS> ring(qlmap, qhmap, QTraits<QT_Q6_K>::planes(w, (u64)rows * nb), rows, nb,
                        rings + warp * NS * S * Q6B_QL_BYTES,
                        rings + ring_qs * Q6B_QL_BYTES + warp * NS * S * Q6B_QH_BYTES,
                        rings + ring_qs * (Q6B_QL_BYTES + Q6B_QH_BYTES) + warp * NS * S * Q6B_WORD_BYTES,
                        smem_u32(&bars[warp][0]), part.begin + sx0, n, my_tiles, HALVES ? 1 : 0);
    ring.start(lane);
    PDL_ENTER();  // the activations are the previous kernel's output
    q6b_stage_x(base, q8, scale8, part.begin, part.len);
    int qoff[2][4], hoff[2][4];  // the lane's 8 bytes of chunk j of tile row 2g + r in the swizzled boxes
    i8b_quant_offsets(g, c, qoff);
    q6b_high_offsets(g, c, hoff);
    int i = 0;  // the stage consumed next (all tiles counted)
    for (int k = 0; k < my_tiles; ++k) {
        const int row0 = 16 * (((int)blockIdx.x + k * (int)gridDim.x) >> (HALVES ? 1 : 0));
        const u32 base0 = stage_row_base(row0, 2 * g, rows, nb), base1 = stage_row_base(row0, 2 * g + 1, rows, nb);
        float acc[2] = {0.f, 0.f};
        for (int j = 0; j < ring.spt; ++j, ++i) {
            const int slot = ring.acquire(i, lane);
            const u8* lst = x + (ring.lows(slot) - base);
            const u8* hst = x + (ring.highs(slot) - base);
            const u8* wst = x + (ring.words(slot) - base);
            const int here = min(S, n - j * S);
#pragma unroll
            for (int s = 0; s < S; ++s)
                if (s < here) {
                    const int sx = sx0 + j * S + s, sb = part.begin + sx;
                    const u32 idx[2] = {base0 + sb, base1 + sb};
                    q6b_superblock(lst + Q6B_QL_BYTES * s, hst + Q6B_QH_BYTES * s, wst + Q6B_WORD_BYTES * s, x,
                                   part.len, sx, qoff, hoff, g, c, idx, acc);
                }
        }
        i8b_store_tile(acc, red, k, row0, rows, part.piece, y, y2, bias, residual);  // (the quad: sub-block c's)
    }
    cp_async_wait<0>();  // nothing may land in shared memory after the block exits
#else
    __trap();  // the launcher takes this kernel on sm_90+ only
#endif
}

// ---- the verify rows: 2-8 tokens (mmvq_q6_i8v) ----
//
// The same copies, ring, walking grid and rows as mmvq_q6_i8b, the staged activations of T tokens (both levels)
// instead of one, each superblock's weights decoded once for all of them. Where the f16 Q6_K kernels of 5-8 tokens
// run a second pass for the residue and mmvq_q6_i8 stages every weight with 7 cp.async copies a lane a stage
// (bench/NOTES.md Z26: the Q6_K matmuls were the 5-token pass's slowest bytes).
//
// Columns. A chunk's low mma (h = 0) holds its sub-blocks 0 (lanes c < 2) and 1 (c >= 2), its high mma (h = 1)
// sub-blocks 2 and 3. Column e (0 .. 4T - 1) of the M = ceil(T / 2) mmas of each half (column g of mma m: e = 8m + g)
// carries sub-block e / 2T of the half, token (e % 2T) / 2, level e % 2 (hi, lo): its B is that token's level
// from the lanes of its sub-block and zero from the others, so every column sums one sub-block and one scale IMAD
// applies. The lane's C columns 2c, 2c + 1 of mma m are one sub-block and one token at both levels, the same in
// every chunk and in both halves (sub-block 2h + e / 2T of the chunk): its integer sums need no other lane's until
// the tile's end, where the two lanes of a token (one a half-sub-block) meet in shared memory.

// The block's activations of n superblocks, staged once: token t's level l as [n][256] at (2t + l) q6v_xpitch
// (64 mod 128 bytes: the hi and lo readers of a quarter-warp fall in other banks), then each (superblock,
// token)'s two level scales (hi, lo). Mirrored by engine/cuda/q6b.py verify_x_bytes.
__device__ __forceinline__ int q6v_xpitch(int n) { return 256 * n + 64; }
template <int T>
__device__ __forceinline__ int q6v_xsc(int n) { return 2 * T * q6v_xpitch(n); }
template <int T>
__device__ __forceinline__ int q6v_x_bytes(int n) { return (q6v_xsc<T>(n) + 8 * T * n + 1023) & ~1023; }

// Superblocks sb0 .. sb0 + n - 1 of T tokens' act8 copy into xs, by all the block's threads; waited for (with every
// earlier copy of the thread) before the caller returns.
template <int T>
__device__ __forceinline__ void q6v_stage_x(u32 xs, const i8* q8, const float* scale8, int sb0, int n) {
    const u8* q = reinterpret_cast<const u8*>(q8) + (u64)sb0 * 4096;
    for (int i = threadIdx.x; i < 32 * T * n; i += blockDim.x) {  // 16 chunks of each level of each token
        const int part = i & 15, sb = (i >> 4) % n, region = (i >> 4) / n, t = region >> 1, level = region & 1;
        cp_async16(xs + region * q6v_xpitch(n) + 256 * sb + 16 * part,
                   q + 4096 * sb + 256 * (8 * level + t) + 16 * part);
    }
    for (int i = threadIdx.x; i < 2 * T * n; i += blockDim.x) {  // scale8 [sb][level][8 tokens]
        const int level = i & 1, rec = i >> 1, sb = rec / T, t = rec % T;  // rec = T sb + t
        cp_async4(xs + q6v_xsc<T>(n) + 8 * rec + 4 * level, scale8 + 16 * (sb0 + sb) + 8 * level + t);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
}

// Where lane (g, c)'s columns of mma m lie: B column g (xb: its token's level at superblock 0, c's 16 bytes; on:
// whether the lane's k are that column's sub-block), and C columns 2c, 2c + 1 (sub: the half's sub-block, tok:
// the token; tok < 0: padding, never stored).
template <int T>
struct Q6vCols {
    static constexpr int M = (T + 1) / 2;
    const u8* xb[M];
    bool on[M];
    int sub[M], tok[M];

    __device__ __forceinline__ Q6vCols(const u8* x, int nx, int g, int c) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const int e = 8 * m + g, r = e % (2 * T);  // its region: token r / 2's level r % 2
            const bool valid = e < 4 * T;
            xb[m] = x + (valid ? r : 0) * q6v_xpitch(nx) + 16 * c;
            on[m] = valid && e / (2 * T) == (c >> 1);
            const int eo = 8 * m + 2 * c;
            sub[m] = eo < 4 * T ? eo / (2 * T) : 0;
            tok[m] = eo < 4 * T ? (eo % (2 * T)) >> 1 : -1;
        }
    }
};

// One superblock (as q6b_superblock's arguments) of T tokens into the lane's sums acc[m][r]: token cols.tok[m],
// sub-blocks of its half cols.sub[m], tile row 2g + r.
template <int T>
__device__ __forceinline__ void q6v_superblock(const u8* ql, const u8* qh, const u8* wd, const u8* x, int nx, int sx,
                                               const int (&qoff)[2][4], const int (&hoff)[2][4], int g, int c,
                                               const u32 (&idx)[2], const Q6vCols<T>& cols,
                                               float (&acc)[Q6vCols<T>::M][2]) {
    constexpr int M = Q6vCols<T>::M;
    u32 scw[2][4];
    q6b_scale_words(wd, g, scw);
    int isum[M][4];  // per mma: (row 2g, hi), (row 2g, lo), (row 2g + 1, hi), (row 2g + 1, lo)
#pragma unroll
    for (int m = 0; m < M; ++m) isum[m][0] = isum[m][1] = isum[m][2] = isum[m][3] = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u32 a[2][4];
        q6b_frags(ql, qh, qoff, hoff, c, j, a);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4 b = *reinterpret_cast<const uint4*>(cols.xb[m] + 256 * sx + 64 * j);
            const bool on = cols.on[m];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int d[4] = {0, 0, 0, 0};
                mma_s8s8_16832_acc(d, a[h], on ? (h ? b.z : b.x) : 0u, on ? (h ? b.w : b.y) : 0u);
                const int shift = 8 * (2 * h + cols.sub[m]);  // sub-block 4j + 2h + sub of each row
                const int s0 = sbyte(scw[0][j], shift), s1 = sbyte(scw[1][j], shift);
                isum[m][0] += s0 * d[0];
                isum[m][1] += s0 * d[1];
                isum[m][2] += s1 * d[2];
                isum[m][3] += s1 * d[3];
            }
        }
    }
    const float dr[2] = {q6b_row_d(wd, g, 0, idx[0]), q6b_row_d(wd, g, 1, idx[1])};
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const int t = max(cols.tok[m], 0);
        const float2 lv = *reinterpret_cast<const float2*>(x + q6v_xsc<T>(nx) + 8 * (T * sx + t));  // hi, lo
#pragma unroll
        for (int r = 0; r < 2; ++r)
            acc[m][r] += dr[r] * ((float)isum[m][2 * r] * lv.x + (float)isum[m][2 * r + 1] * lv.y);
    }
}

// y[T, rows] (row stride ld_y) = x @ W^T (+ bias) (+ residual, the same stride), W Q6_K as mmvq_q6_i8b's, x the
// act8 copy of T tokens (2 <= T <= 8; group 0's bases). Launch as mmvq_q6_i8b's (its grid, warps and rings);
// dynamic shared memory 1024 + q6v_x_bytes<T>(part) + W NS S (2048 + 1024 + 320). HALVES: as mmvq_q6_i8b's, the
// second half's bare sums in y2.
template <int T, int S, int NS, bool HALVES>
__global__ void __launch_bounds__(Q6B_MAX_WARPS * 32, 1)
mmvq_q6_i8v(const __grid_constant__ TensorMap qlmap, const __grid_constant__ TensorMap qhmap,
            const u8* __restrict__ w, const i8* __restrict__ q8, const float* __restrict__ scale8,
            float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ residual, int rows,
            int K, int ld_y, float* __restrict__ y2) {
#if __CUDA_ARCH__ >= 900
    static_assert(2 <= T && T <= 8, "the verify rows: 2-8 tokens");
    constexpr int M = Q6vCols<T>::M;
    extern __shared__ __align__(1024) u8 smem[];
    __shared__ __align__(8) u64 bars[Q6B_MAX_WARPS][NS];
    __shared__ float red[2][Q6B_MAX_WARPS][2][T][16];  // by tile parity; a token's two half-sub-block sums
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3, nb = K / QK_SB, ntiles = (rows + 15) / 16;
    const MmvqHalf part = mmvq_half<HALVES>(nb);  // the block's superblocks of each tile (its .tile unused)
    const int share = (part.len + num_warps - 1) / num_warps, sx0 = warp * share;  // in the block's part
    const int n = max(0, min(share, part.len - sx0));
    const int walked = HALVES ? 2 * ntiles : ntiles;  // tiles, or half-tiles
    const int my_tiles = (walked - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    const u32 base = (smem_u32(smem) + 1023u) & ~1023u;
    const u8* x = smem + (base - smem_u32(smem));
    const u32 rings = base + q6v_x_bytes<T>(HALVES ? nb - nb / 2 : nb), ring_qs = num_warps * NS * S;
    Q6bRing<S, NS> ring(qlmap, qhmap, QTraits<QT_Q6_K>::planes(w, (u64)rows * nb), rows, nb,
                        rings + warp * NS * S * Q6B_QL_BYTES,
                        rings + ring_qs * Q6B_QL_BYTES + warp * NS * S * Q6B_QH_BYTES,
                        rings + ring_qs * (Q6B_QL_BYTES + Q6B_QH_BYTES) + warp * NS * S * Q6B_WORD_BYTES,
                        smem_u32(&bars[warp][0]), part.begin + sx0, n, my_tiles, HALVES ? 1 : 0);
    ring.start(lane);
    PDL_ENTER();  // the activations are the previous kernel's output
    q6v_stage_x<T>(base, q8, scale8, part.begin, part.len);
    int qoff[2][4], hoff[2][4];
    i8b_quant_offsets(g, c, qoff);
    q6b_high_offsets(g, c, hoff);
    const Q6vCols<T> cols(x, part.len, g, c);
    int i = 0;  // the stage consumed next (all tiles counted)
    for (int k = 0; k < my_tiles; ++k) {
        const int row0 = 16 * (((int)blockIdx.x + k * (int)gridDim.x) >> (HALVES ? 1 : 0));
        const u32 base0 = stage_row_base(row0, 2 * g, rows, nb), base1 = stage_row_base(row0, 2 * g + 1, rows, nb);
        float acc[M][2];
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = 0.f;
        for (int j = 0; j < ring.spt; ++j, ++i) {
            const int slot = ring.acquire(i, lane);
            const u8* lst = x + (ring.lows(slot) - base);
            const u8* hst = x + (ring.highs(slot) - base);
            const u8* wst = x + (ring.words(slot) - base);
            const int here = min(S, n - j * S);
#pragma unroll
            for (int s = 0; s < S; ++s)
                if (s < here) {
                    const int sx = sx0 + j * S + s, sb = part.begin + sx;
                    const u32 idx[2] = {base0 + sb, base1 + sb};
                    q6v_superblock<T>(lst + Q6B_QL_BYTES * s, hst + Q6B_QH_BYTES * s, wst + Q6B_WORD_BYTES * s, x,
                                      part.len, sx, qoff, hoff, g, c, idx, cols, acc);
                }
        }
#pragma unroll
        for (int m = 0; m < M; ++m)
            if (cols.tok[m] >= 0) {
                red[k & 1][warp][cols.sub[m]][cols.tok[m]][2 * g] = acc[m][0];
                red[k & 1][warp][cols.sub[m]][cols.tok[m]][2 * g + 1] = acc[m][1];
            }
        __syncthreads();  // (the other parity's sums, read after the last one, are rewritten only after the next)
        for (int e = threadIdx.x; e < 16 * T; e += blockDim.x) {
            const int t = e >> 4, row = row0 + (e & 15);
            if (row >= rows) continue;
            float v = 0.f;
            for (int wi = 0; wi < num_warps; ++wi) v += red[k & 1][wi][0][t][e & 15] + red[k & 1][wi][1][t][e & 15];
            if (HALVES && part.piece) {  // the second half: its bare sums
                y2[(i64)t * ld_y + row] = v;
                continue;
            }
            if (bias) v += bias[row];
            if (residual) v += residual[(i64)t * ld_y + row];
            y[(i64)t * ld_y + row] = v;
        }
    }
    cp_async_wait<0>();  // nothing may land in shared memory after the block exits
#else
    __trap();  // the launcher takes this kernel on sm_90+ only
#endif
}
