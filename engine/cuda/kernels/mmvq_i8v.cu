// Q4_K x 2..8 tokens (a verify pass's rows) with int8 activations, the weights streamed by the tensor-copy engine
// (sm_90+): y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual). kernels/mmvq_i8b.cu's copies, rings, walking grid and
// row layout (kernels/tma.cuh); the act8 copy of x as mmvq_i8 reads it (two int8 levels, exact int32 products, the
// min term from exact sub-block sums). Each weight box is decoded once for all T tokens, where the f16 kernels of
// 5-8 tokens run a second pass of mmas for the residue and mmvq_i8 one for the lo levels with 32 IMADs a unit.
//
// Columns. A mma carries up to four whole tokens: column n of mma m is token 4m + n / 2 at level n % 2 (hi, lo),
// so tokens 5-8 take a second mma on the same masked nibbles. Each sub-block's mma starts from zero sums, which one
// IMAD each scales by the sub-block's scale into the lane's running integer sums (16 x the true ones: the low
// nibbles' scales are taken x 16, the high nibbles come masked in place, as 16 q). Lane (g, c) ends a superblock
// with token 4m + c of tile rows 2g and 2g + 1 at both levels (the C columns 2c, 2c + 1), so no lanes share a sum.
// Columns past the last token repeat it (the lanes' token index clamped, no branches in the loop: with them, 3, 5,
// 6 and 7 tokens took ~25 % more instructions a superblock than 4 and 8); their sums are never stored.
//
// Min term. One f16 mma a superblock: A holds the rows' sub-block mins (exact small integers; column k and k + 8
// both sub-block k), B the tokens' sub-block sums (the hi f16 half at k < 8, the lo half at k >= 8), column n
// token n / 2 + 4 (n % 2), so the lane's two C columns are again its own tokens c and c + 4.
//
// Not built before sm_90 (no tensor copies): the launcher (engine/cuda/i8b.py) takes it on sm_90+ only.
#include "quants.cuh"
#include "mmvq.cuh"
#include "tma.cuh"

// Up to 12 warps a block: from 5 tokens a block's staged activations (55 KB at K = 5,120) and rings leave one block
// an SM, so its warps are all the SM has to hide the mma and scale chains with (engine/cuda/i8b.py VERIFY_WARPS_AT).
// The wide form (MAXW = I8V_WIDE_WARPS, one superblock a stage) takes up to 24: a share of one superblock a warp at
// K = 5,120, twice the warps to hide those chains with (engine/cuda/i8b.py VERIFY_WIDE_TOKENS).
#define I8V_MAX_WARPS 12
#define I8V_WIDE_WARPS 24

// The block's activations, staged once for the whole row: token t's level l (0 hi, 1 lo) as [nb][256] at
// (2t + l) i8v_xpitch (a pitch of 64 mod 128 bytes: the hi and lo readers of a quarter-warp fall in other banks),
// then each (superblock, token)'s sums record (8 hi f16, 8 lo f16) and its two level scales (f32).
// Mirrored by engine/cuda/i8b.py verify_x_bytes.
__device__ __forceinline__ int i8v_xpitch(int nb) { return 256 * nb + 64; }
template <int T>
__device__ __forceinline__ int i8v_sums(int nb) { return 2 * T * i8v_xpitch(nb); }
template <int T>
__device__ __forceinline__ int i8v_scales(int nb) { return i8v_sums<T>(nb) + 32 * T * nb; }
template <int T>
__device__ __forceinline__ int i8v_x_bytes(int nb) { return (i8v_scales<T>(nb) + 8 * T * nb + 1023) & ~1023; }

// The row's activations of T tokens (group 0 of the act8 copy) into xs, by all the block's threads; waited for
// before the caller returns.
template <int T>
__device__ __forceinline__ void i8v_stage_x(u32 xs, const i8* q8, const float* scale8, const f16* sums,
                                            const f16* sums_lo, int nb) {
    const u8* q = reinterpret_cast<const u8*>(q8);
    for (int i = threadIdx.x; i < 32 * T * nb; i += blockDim.x) {  // 16 chunks of each level of each token
        const int part = i & 15, sb = (i >> 4) % nb, region = (i >> 4) / nb, t = region >> 1, level = region & 1;
        cp_async16(xs + region * i8v_xpitch(nb) + 256 * sb + 16 * part,
                   q + 4096 * sb + 256 * (8 * level + t) + 16 * part);
    }
    for (int i = threadIdx.x; i < 4 * T * nb; i += blockDim.x) {
        const int kind = i & 3, rec = i >> 2, sb = rec / T, t = rec % T;  // rec = T sb + t
        if (kind < 2)  // sums8 / sums8_lo [sb][8 tokens][8]: 16 bytes each
            cp_async16(xs + i8v_sums<T>(nb) + 32 * rec + 16 * kind, (kind ? sums_lo : sums) + 64 * sb + 8 * t);
        else  // scale8 [sb][level][8]
            cp_async4(xs + i8v_scales<T>(nb) + 8 * rec + 4 * (kind - 2), scale8 + 16 * sb + 8 * (kind - 2) + t);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
}

// A row's eight sub-block scales (sc[j]) and its mins of sub-blocks 2c, 2c + 1 as an exact f16 pair, from its 12
// scale bytes (the Q4_K packing); the low nibbles' scales (even j) x 16.
__device__ __forceinline__ u32 i8v_scales_mins(const u8* s, int c, int (&sc)[8]) {
    const u32 s0 = *reinterpret_cast<const u32*>(s), s1 = *reinterpret_cast<const u32*>(s + 4),
              s2 = *reinterpret_cast<const u32*>(s + 8);
    const u32 lo = s0 & 0x3F3F3F3Fu, hi = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        sc[j] = (int)prmt(lo, 0u, 0x4440u + j) << ((j & 1) ? 0 : 4);
        sc[4 + j] = (int)prmt(hi, 0u, 0x4440u + j) << ((j & 1) ? 0 : 4);
    }
    const u32 mn = c < 2 ? s1 & 0x3F3F3F3Fu : ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
    // bytes 2 (c % 2) and 2 (c % 2) + 1 under 0x64 high bytes: 1024 + m as f16, less 1024
    return hsub2(prmt(mn, F16X2_1024, (c & 1) ? 0x7352u : 0x7150u), F16X2_1024);
}

// One superblock (the quant box at qst, the word unit at words, superblock sb of the staged x) into the lane's
// sums acc[m][r]: token 4m + c of tile row 2g + r.
template <int T>
__device__ __forceinline__ void i8v_superblock(const u8* qst, const u8* words, const u8* x, int nb, int sb,
                                               const int (&qoff)[2][4], int g, int c, float (&acc)[(T + 3) / 4][2]) {
    constexpr int NM = (T + 3) / 4;
    uint2 q[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) q[r][j] = *reinterpret_cast<const uint2*>(qst + qoff[r][j]);
    int sc[2][8];
    u32 mins[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) mins[r] = i8v_scales_mins(words + 12 * (2 * g + r), c, sc[r]);
    int tot[NM][4];  // per mma: (row 2g, hi), (row 2g, lo), (row 2g + 1, hi), (row 2g + 1, lo), x 16
#pragma unroll
    for (int m = 0; m < NM; ++m) tot[m][0] = tot[m][1] = tot[m][2] = tot[m][3] = 0;
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles of chunk p) and 2p + 1 (its high nibbles)
        uint4 b[NM];  // the lane's B column g of both sub-blocks: token 4m + g / 2, level g % 2
#pragma unroll
        for (int m = 0; m < NM; ++m) {
            const int t = min(4 * m + (g >> 1), T - 1);
            b[m] = *reinterpret_cast<const uint4*>(x + (2 * t + (g & 1)) * i8v_xpitch(nb) + 256 * sb + 64 * p + 16 * c);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 mask = h ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
            const u32 w[4] = {q[0][p].x & mask, q[1][p].x & mask, q[0][p].y & mask, q[1][p].y & mask};
#pragma unroll
            for (int m = 0; m < NM; ++m) {
                int sums[4];
                mma_u8s8_16832(sums, w, h ? b[m].z : b[m].x, h ? b[m].w : b[m].y);
                const int s0 = sc[0][2 * p + h], s1 = sc[1][2 * p + h];
                tot[m][0] += sums[0] * s0;
                tot[m][1] += sums[1] * s0;
                tot[m][2] += sums[2] * s1;
                tot[m][3] += sums[3] * s1;
            }
        }
    }
    // the min term: rows' mins x tokens' sub-block sums, one f16 mma (B column g: token g / 2 + 4 (g % 2))
    const int tb = min((g >> 1) + 4 * (g & 1), T - 1);
    const u8* rec = x + i8v_sums<T>(nb) + 32 * (T * sb + tb);
    const u32 a[4] = {mins[0], mins[1], mins[0], mins[1]};
    const u32 bm[2] = {*reinterpret_cast<const u32*>(rec + 4 * c), *reinterpret_cast<const u32*>(rec + 16 + 4 * c)};
    float mt[4] = {0.f, 0.f, 0.f, 0.f};  // (row 2g, token c), (row 2g, c + 4), (row 2g + 1, c), (row 2g + 1, c + 4)
    mma_f16_16816(mt, a, bm);
    float d[2], dmin[2];  // d / 16: the integer sums are 16 x the true ones
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u32 dm = *reinterpret_cast<const u32*>(words + TILE_DM + 4 * (2 * g + r));
        d[r] = 0.0625f * f16_to_f32((f16)(dm & 0xFFFFu));
        dmin[r] = f16_to_f32((f16)(dm >> 16));
    }
#pragma unroll
    for (int m = 0; m < NM; ++m) {
        const int t = min(4 * m + c, T - 1);
        const float2 lv = *reinterpret_cast<const float2*>(x + i8v_scales<T>(nb) + 8 * (T * sb + t));  // hi, lo
#pragma unroll
        for (int r = 0; r < 2; ++r)
            acc[m][r] += d[r] * ((float)tot[m][2 * r] * lv.x + (float)tot[m][2 * r + 1] * lv.y) -
                         dmin[r] * mt[2 * r + m];
    }
}

// y[T, rows] (row stride ld_y) = x @ W^T (+ bias) (+ residual, the same stride), W Q4_K (qmap: its quant plane,
// engine/cuda/i8b.py), K a multiple of 256, x the act8 copy of T tokens (group 0's bases). Launch as mmvq_i8b's:
// blocks of W <= MAXW warps walking the 16-row tiles b, b + gridDim.x, ..., each warp its share of a
// tile's superblocks through a ring of NS stages of S; dynamic shared memory 1024 + i8v_x_bytes<T>(nb) +
// W NS S (2048 + 256). MAXW: the most warps a block (its launch bounds and per-tile sums). HALVES: the block
// walks half-tiles (an even grid; each block keeps its index's half, kernels/mmvq.cuh mmvq_half) and stages only
// its half of the row, so rows too wide to stage whole (ffn_down's 68 superblocks) fit; the first half stores y
// (+ bias + residual), the second its bare sums in y2, which the next layer's input norm adds
// (engine/cuda/ops.py VERIFY_HALVES_AT).
// Launch bounds: from 5 tokens (and in the wide form) a minimum of one block an SM, what the staged rows leave
// anyway: without it ptxas held them to 80 registers and spilt a stage's sums (5-8 tokens: 89-96 registers now,
// no spills; the 27B pass at 5 tokens 9.16 -> 8.96 ms on an H100). Up to 4 tokens a minimum of two keeps them at
// 69-70, which timed a little faster at 3-4 tokens than one (bench/NOTES.md Z25).
template <int T, int S, int NS, int MAXW = I8V_MAX_WARPS, bool HALVES = false>
__global__ void __launch_bounds__(MAXW * 32, T > 4 || MAXW > I8V_MAX_WARPS ? 1 : 2)
mmvq_i8v(const __grid_constant__ TensorMap qmap, const u8* __restrict__ w, const i8* __restrict__ q8,
         const float* __restrict__ scale8, const f16* __restrict__ sums, const f16* __restrict__ sums_lo,
         float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K,
         int ld_y, float* __restrict__ y2) {
#if __CUDA_ARCH__ >= 900
    constexpr int NM = (T + 3) / 4;
    extern __shared__ __align__(1024) u8 smem[];
    __shared__ __align__(8) u64 bars[MAXW][NS];
    __shared__ float red[2][MAXW][T][16];  // by tile parity: one __syncthreads a tile
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3, nb = K / QK_SB, ntiles = (rows + 15) / 16;
    // the block's superblocks of each tile: all, or (HALVES) its index's half, staged as superblocks 0 .. len - 1
    const MmvqHalf part = mmvq_half<HALVES>(nb);
    const int nx = part.len, share = (nx + num_warps - 1) / num_warps, sx0 = warp * share;
    const int n = max(0, min(share, nx - sx0));  // the warp's superblocks of a tile
    const int walked = HALVES ? 2 * ntiles : ntiles;  // tiles, or half-tiles
    const int my_tiles = (walked - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    // the regions: x, then every warp's quant ring (1024-byte aligned boxes), then every warp's word ring
    const u32 base = (smem_u32(smem) + 1023u) & ~1023u;
    const u8* x = smem + (base - smem_u32(smem));
    const u32 rings = base + i8v_x_bytes<T>(nx);
    I8bRing<S, NS> ring(qmap, QTraits<QT_Q4_K>::planes(w, (u64)rows * nb).p[1],
                        rings + warp * NS * S * I8B_QUANT_BYTES,
                        rings + num_warps * NS * S * I8B_QUANT_BYTES + warp * NS * S * TILE_UNIT,
                        smem_u32(&bars[warp][0]), nb, part.begin + sx0, n, my_tiles, HALVES ? 1 : 0);
    ring.start(lane);
    PDL_ENTER();  // the activations are the previous kernel's output
    const int b0 = part.begin;  // the act8 copy from the block's first superblock (per superblock: 4 KB of levels,
                                // 8 tokens' sums of 8 f16 each, 16 level scales)
    i8v_stage_x<T>(base, q8 + 4096 * b0, scale8 + 16 * b0, sums + 64 * b0, sums_lo + 64 * b0, nx);
    int qoff[2][4];
    i8b_quant_offsets(g, c, qoff);
    int i = 0;  // the stage consumed next (all tiles counted)
    for (int k = 0; k < my_tiles; ++k) {
        float acc[NM][2];
#pragma unroll
        for (int m = 0; m < NM; ++m) acc[m][0] = acc[m][1] = 0.f;
        for (int j = 0; j < ring.spt; ++j, ++i) {
            const int slot = ring.acquire(i, lane);
            const u8* qst = x + (ring.quants(slot) - base);
            const u8* wst = x + (ring.units(slot) - base);
            const int here = min(S, n - j * S);
#pragma unroll
            for (int s = 0; s < S; ++s)
                if (s < here)
                    i8v_superblock<T>(qst + I8B_QUANT_BYTES * s, wst + TILE_UNIT * s, x, nx, sx0 + j * S + s, qoff,
                                      g, c, acc);
        }
#pragma unroll
        for (int m = 0; m < NM; ++m)
            if (4 * m + c < T) {
                red[k & 1][warp][4 * m + c][2 * g] = acc[m][0];
                red[k & 1][warp][4 * m + c][2 * g + 1] = acc[m][1];
            }
        __syncthreads();  // (the other parity's sums, read after the last one, are rewritten only after the next)
        const int row0 = 16 * (((int)blockIdx.x + k * (int)gridDim.x) >> (HALVES ? 1 : 0));
        for (int e = threadIdx.x; e < 16 * T; e += blockDim.x) {
            const int t = e >> 4, row = row0 + (e & 15);
            if (row >= rows) continue;
            float v = 0.f;
            for (int wi = 0; wi < num_warps; ++wi) v += red[k & 1][wi][t][e & 15];
            if (HALVES && part.piece) {  // the second half: its bare sums
                y2[(i64)t * ld_y + row] = v;
                continue;
            }
            if (bias) v += bias[row];
            if (residual) v += residual[(i64)t * ld_y + row];
            y[(i64)t * ld_y + row] = v;
        }
    }
#else
    __trap();  // the launcher takes this kernel on sm_90+ only
#endif
}
