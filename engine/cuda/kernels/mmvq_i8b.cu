// Q4_K x one token with int8 activations, the weights streamed by the tensor-copy engine (sm_90+):
// y[rows] = W x (+ bias) (+ residual). Same inputs and arithmetic as kernels/mmvq_i8.cu at T = 1 (the act8 copy
// of x in two int8 levels, exact int32 products, the min term from exact sub-block sums); three things differ.
//
// Copies. mmvq_i8 spends ~70 of its ~280 instructions a unit (16 rows x one superblock) forming and issuing 16-byte
// cp.async copies. Here lane 0 of a warp issues a stage: one tensor copy (TMA) per superblock for the tile's 16
// quant rows (a 16 x 128-byte box of the row-major plane) and one bulk copy for its S word units (contiguous in
// the tiled plane); the stage's mbarrier counts the bytes in. The activations are staged once per block for the
// whole row (every warp of a block takes a share of the same row), by cp.async from all threads.
//
// Rows. The box lands with the 128-byte swizzle; lane (g, c) takes tile rows 2g and 2g + 1 (mma rows g and g + 8),
// whose swizzles are even and odd values: the four rows a half-warp reads then fall in four different pairs of
// 16-byte chunks, so its 8-byte quant reads are conflict-free.
//
// Sub-block scales. mmvq_i8 runs one mma per sub-block into fresh int32 sums and scales each by its sub-block
// scale (4 IMADs a mma, 32 a unit). Here the B operand of a mma carries the activations in the two columns of one
// sub-block only (column 2a + level for the a-th sub-block of a group of four: token 0's hi level, then its lo),
// so four mmas accumulate four sub-blocks into one set of sums, each in its own columns; a lane's four sums then
// belong to one sub-block and two rows, and one IMAD each applies its scale. Lane (g, c) supplies column g's B:
// sub-block g / 2 of the group at level g % 2 (zero in the other three mmas); it ends with the sums of
// sub-blocks c and c + 4 of its two rows, so it also takes their min terms, and the quad's four lanes together
// hold a row's whole superblock.
//
// In halves (HALVES, an even grid): the walk goes over half-tiles, tile v >> 1's superblocks of half v & 1, so each
// block keeps one half (its index's parity, as mmvq_half splits a tile: kernels/mmvq.cuh) and a launch of 320 tiles
// runs 3 half-tiles a block on 214 blocks where it ran 2 whole tiles on 160. The first half stores y = its sums +
// bias + residual, the second y2 = its sums; the next RMSNorm adds them (engine/cuda/ops.py rmsnorm_of add=).
//
// Not built before sm_90 (no tensor copies): the launcher (engine/cuda/i8b.py) takes it on sm_90+ only, and the
// body compiles to a trap elsewhere so that every architecture still builds the file.
#include "i8q4k.cuh"
#include "quants.cuh"
#include "tma.cuh"

#define I8B_MAX_WARPS 8

// The block's activations, staged once for the whole row (every warp of the block reads its share of them): the
// hi level [nb][256], the lo level 64 bytes further (a half-warp's hi and lo readers fall in different banks),
// each superblock's two scales (hi, lo: 16 bytes a superblock, 8 used), its sums and lo sums (16 bytes each).
// Mirrored by engine/cuda/i8b.py x_bytes.
__device__ __forceinline__ int i8b_xlo(int nb) { return 256 * nb + 64; }
__device__ __forceinline__ int i8b_xsc(int nb) { return i8b_xlo(nb) + 256 * nb; }
__device__ __forceinline__ int i8b_sums(int nb) { return i8b_xsc(nb) + 16 * nb; }
__device__ __forceinline__ int i8b_x_bytes(int nb) { return (i8b_sums(nb) + 32 * nb + 1023) & ~1023; }

// The block's activations (i8b_x_bytes) into xs, by all its threads; waited for before the caller returns.
__device__ __forceinline__ void i8b_stage_x(u32 xs, const i8* q8, const float* scale8, const f16* sums,
                                            const f16* sums_lo, int nb) {
    const u8* q = reinterpret_cast<const u8*>(q8);
    for (int i = threadIdx.x; i < 32 * nb; i += blockDim.x) {  // 16 chunks of each level a superblock
        const int sb = i >> 5, part = i & 15, level = (i >> 4) & 1;
        cp_async16(xs + (level ? i8b_xlo(nb) : 0) + 256 * sb + 16 * part, q + 4096 * sb + 2048 * level + 16 * part);
    }
    for (int i = threadIdx.x; i < 4 * nb; i += blockDim.x) {
        const int sb = i >> 2, kind = i & 3;
        if (kind < 2)  // scale8 [sb][level][8]: token 0's hi (kind 0) and lo (kind 1) scales
            cp_async4(xs + i8b_xsc(nb) + 16 * sb + 4 * kind, scale8 + 16 * sb + 8 * kind);
        else  // sums8 / sums8_lo [sb][8 tokens][8]: token 0's record
            cp_async16(xs + i8b_sums(nb) + 16 * (2 * sb + kind - 2), (kind == 2 ? sums : sums_lo) + 64 * sb);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
}

// One superblock (the quant box at qst, the word unit at words, the row's superblock sb of the staged x) into
// the lane's sums acc of tile rows 2g, 2g + 1. qoff[r][j]: the swizzled offset of the lane's 8 bytes of chunk j
// of row 2g + r.
__device__ __forceinline__ void i8b_superblock(const u8* qst, const u8* words, const u8* x, int nb, int sb,
                                               const int (&qoff)[2][4], int g, int c, float kf, float (&acc)[2]) {
    uint2 q[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) q[r][j] = *reinterpret_cast<const uint2*>(qst + qoff[r][j]);
    const int a = g >> 1;  // the sub-block of a group of four this lane's B column carries
    const u8* xv = x + ((g & 1) ? i8b_xlo(nb) : 0) + 256 * sb + 64 * (a >> 1) + 16 * c + 8 * (a & 1);
    const uint2 xa = *reinterpret_cast<const uint2*>(xv), xb = *reinterpret_cast<const uint2*>(xv + 128);
    int sc[2], mn[2], sc4[2], mn4[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) i8b_scales(words + 12 * (2 * g + r), c, sc[r], mn[r], sc4[r], mn4[r]);
    int tot[4] = {0, 0, 0, 0};  // (row 2g, hi), (row 2g, lo), (row 2g + 1, hi), (row 2g + 1, lo), x the scales
    i8b_unit_sums(q, xa, xb, a, sc, sc4, tot);
    const float2 lv = *reinterpret_cast<const float2*>(x + i8b_xsc(nb) + 16 * sb);
    const float hi = kf * lv.x, lo = kf * lv.y;  // token 0's levels, / 16 on lanes of high-nibble sums
    const f16* su = reinterpret_cast<const f16*>(x + i8b_sums(nb) + 32 * sb);  // then the lo sums, 16 bytes on
    const float xs = f16_to_f32(su[c]) + f16_to_f32(su[8 + c]);
    const float xs4 = f16_to_f32(su[c + 4]) + f16_to_f32(su[12 + c]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u32 dm = *reinterpret_cast<const u32*>(words + TILE_DM + 4 * (2 * g + r));
        const float d = f16_to_f32((f16)(dm & 0xFFFFu)), dmin = f16_to_f32((f16)(dm >> 16));
        acc[r] += d * ((float)tot[2 * r] * hi + (float)tot[2 * r + 1] * lo);
        acc[r] -= dmin * ((float)mn[r] * xs + (float)mn4[r] * xs4);
    }
}

// y[rows] = x @ W^T (+ bias) (+ residual), W Q4_K (qmap: its quant plane, engine/cuda/i8b.py), one token, K a
// multiple of 256, x in act8 (group 0's bases). Launch: blocks of W <= I8B_MAX_WARPS warps; block b takes the
// 16-row tiles b, b + gridDim.x, ... (one each when the grid is the tile count), staging the row's activations
// once; warp w takes the w-th contiguous share of each tile's superblocks (ceil(nb / W), the last ones fewer)
// through its own ring of NS stages of S superblocks, which runs on from one tile into the next; dynamic shared
// memory 1024 (alignment) + i8b_x_bytes(nb) + W NS S (2048 + 256). HALVES (an even grid): the block's half-tiles
// as above, the second halves' sums into y2.
template <int S, int NS, bool HALVES = false>
__global__ void __launch_bounds__(I8B_MAX_WARPS * 32)
mmvq_i8b(const __grid_constant__ TensorMap qmap, const u8* __restrict__ w, const i8* __restrict__ q8,
         const float* __restrict__ scale8, const f16* __restrict__ sums, const f16* __restrict__ sums_lo,
         float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K,
         float* __restrict__ y2) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(1024) u8 smem[];
    __shared__ __align__(8) u64 bars[I8B_MAX_WARPS][NS];
    __shared__ float red[2][I8B_MAX_WARPS][16];  // by tile parity: one __syncthreads a tile
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3, nb = K / QK_SB, ntiles = (rows + 15) / 16;
    // the block's superblocks of each tile: all, or (HALVES) its index's half (its .tile unused: the block walks)
    const MmvqHalf part = mmvq_half<HALVES>(nb);
    const int share = (part.len + num_warps - 1) / num_warps, sb0 = part.begin + warp * share;
    const int n = max(0, min(share, part.begin + part.len - sb0));  // the warp's superblocks of a tile
    const int walked = HALVES ? 2 * ntiles : ntiles;  // tiles, or half-tiles
    const int my_tiles = (walked - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    // the regions: x, then every warp's quant ring (1024-byte aligned boxes), then every warp's word ring
    const u32 base = (smem_u32(smem) + 1023u) & ~1023u;
    const u8* x = smem + (base - smem_u32(smem));
    const u32 qring = base + i8b_x_bytes(nb) + warp * NS * S * I8B_QUANT_BYTES;
    const u32 wring = base + i8b_x_bytes(nb) + num_warps * NS * S * I8B_QUANT_BYTES + warp * NS * S * TILE_UNIT;
    I8bRing<S, NS> ring(qmap, QTraits<QT_Q4_K>::planes(w, (u64)rows * nb).p[1], qring, wring,
                        smem_u32(&bars[warp][0]), nb, sb0, n, my_tiles, HALVES ? 1 : 0);
    ring.start(lane);
    PDL_ENTER();  // the activations are the previous kernel's output
    i8b_stage_x(base, q8, scale8, sums, sums_lo, nb);
    int qoff[2][4];  // the lane's 8 bytes of chunk j of tile row 2g + r in a swizzled box
    i8b_quant_offsets(g, c, qoff);
    const float kf = (c & 1) ? 0.0625f : 1.f;  // lanes c odd hold the high-nibble sub-blocks' sums: 16 q
    int i = 0;  // the stage consumed next (all tiles counted)
    for (int k = 0; k < my_tiles; ++k) {
        float acc[2] = {0.f, 0.f};
        for (int j = 0; j < ring.spt; ++j, ++i) {
            const int slot = ring.acquire(i, lane);
            const u8* qst = x + (ring.quants(slot) - base);
            const u8* wst = x + (ring.units(slot) - base);
            const int here = min(S, n - j * S);
#pragma unroll
            for (int s = 0; s < S; ++s)
                if (s < here)
                    i8b_superblock(qst + I8B_QUANT_BYTES * s, wst + TILE_UNIT * s, x, nb, sb0 + j * S + s, qoff, g,
                                   c, kf, acc);
        }
        const int row0 = 16 * (((int)blockIdx.x + k * (int)gridDim.x) >> (HALVES ? 1 : 0));
        i8b_store_tile(acc, red, k, row0, rows, part.piece, y, y2, bias, residual);  // (the quad: c and c + 4)
    }
#else
    __trap();  // the launcher takes this kernel on sm_90+ only
#endif
}
