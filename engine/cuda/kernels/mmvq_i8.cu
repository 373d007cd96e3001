// Q4_K x small batch with int8 activations: y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), T <= 5, a block
// of warps per 16-row tile (the unit, its stage and the act8 layout: kernels/mmvq_i8.cuh).
//
// The f16 mmvqs spend ~330 instructions on each 16-row superblock (bench/NOTES.md v9-v10: the decoding and mma
// issue, not the loads, bound them). Here a nibble needs no conversion: masking a word of the Q4_K quants gives
// four unsigned 8-bit weights (the high nibbles as 16 q), and mma.m16n8k32 multiplies them by int8 activations
// exactly, one mma per 32-wide sub-block; the sub-block scales are applied to the int32 sums (one IMAD each).
// ~270 instructions a unit (sm_90). Measured on the H200 (bench/NOTES.md v12): 1.15-1.25 x the f16 kernel at one
// token on rows of 6,144 and 17,408, no faster on the 5,120-wide rows, 1.1-1.6 x at 2-4 tokens.
#include "mmvq_i8.cuh"

// y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), W Q4_K, T <= 5 tokens, K a multiple of 256, x in act8 (this
// group's bases). Launch: one block of W warps per TILES consecutive 16-row tiles (the last block may have
// fewer); warp w takes superblocks w, w + W, ... of each tile in turn through a ring of NS stages (weights and
// activation columns by cp.async) that runs on across the tiles, so a warp pays the ring's first wait once per
// block, not once per tile; dynamic shared memory W * (NS * i8_stage_bytes(T) + I8_ZERO_BYTES).
template <int T, int NS, int TILES>
__global__ void __launch_bounds__(MMVQ_MAX_WARPS * 32, 2)
mmvq_i8(const u8* __restrict__ w, const i8* __restrict__ q8, const float* __restrict__ scale8,
        const f16* __restrict__ sums, const f16* __restrict__ sums_lo, float* __restrict__ y,
        const float* __restrict__ bias, const float* __restrict__ residual, int rows, int K, int ldy) {
    PDL_ENTER();  // the activations are the previous kernel's output (the first weights wait too: one stage)
    using S = Q4KStage8;
    constexpr int STAGE = i8_stage_bytes(T), NSLOT = i8_slots(T);
    constexpr bool PACKED = T <= 4;  // both levels in one mma's 8 columns
    extern __shared__ __align__(16) u8 stages[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int nb = K / QK_SB, tile0 = blockIdx.x * TILES, ntiles = min(TILES, (rows + 15) / 16 - tile0);
    u8* ring = stages + warp * (NS * STAGE + I8_ZERO_BYTES);
    const u32 ring_s = smem_u32(ring);
    // superblocks warp, warp + W, ... of each tile (every warp the same count: the launcher's W divides nb)
    const int n = warp < nb ? (nb - warp + num_warps - 1) / num_warps : 0, total = n * ntiles;
    const bool with_meta = lane < NSLOT;
    const Planes P = QTraits<QT_Q4_K>::planes(w, (u64)rows * nb);
    I8Copies<T> cp;
    cp.init(P, q8, scale8, sums, sums_lo, 16 * tile0, rows, nb, lane, warp);
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
        if (s < total) issue(ring_s + s * STAGE);
        cp_async_commit();
    }
    u8* zero = ring + NS * STAGE;
    for (int k = lane; k < I8_ZERO_BYTES / 16; k += 32) reinterpret_cast<uint4*>(zero)[k] = make_uint4(0u, 0u, 0u, 0u);
    __syncwarp();
    const bool has_col = i8_has_col<T>(g);
    const int col_off = has_col ? S::BYTES + I8_SLOT_PITCH * g + 16 * c : NS * STAGE + 16 * c;

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
        i8_unit<T>(st, (has_col ? st : ring) + col_off, has_col, g, c, acc);
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
    if constexpr (TILES == 1) mmvq_store(acc, y, bias, residual, 16 * tile0, rows, T, ldy, PACKED);
}
