// Persistent stream-K Q4_K x small batch with int8 activations: y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual),
// T <= 5: mmvq_i8's unit (kernels/mmvq_i8.cuh) on mmvq_persist's work split (kernels/persist.cuh).
//
// Why: Nsight Compute on the H200 (bench/NOTES.md v14) showed mmvq_i8 latency-bound in every 27B matmul, and
// most of them short of one full wave: ssm_out / attn_output / ffn_down (320 tiles) fill 0.81 of a wave of
// 5-warp blocks at 1.6 TB/s, attn_qkv 1.21 waves at 1.9 TB/s, gate|up 4.12 waves (a partial fifth) at 2.7 TB/s;
// each warp walks only 4-5 superblocks, so its ring's first wait is a large part of its life. Here one wave of
// warps covers the matrix, each streaming an equal share through a deeper ring that never drains between tiles.
//
// Before the programmatic-dependent-launch wait, each lane asks L2 for the quants of its warp's first units (the
// weights do not depend on the previous kernel): with PDL on, those loads overlap the previous kernel's tail.
#include "mmvq_i8.cuh"
#include "persist.cuh"

#define I8P_WARPS 4  // warps per block (engine/cuda/persist.py PERSIST_WARPS)

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Asks L2 for the quants of the first NS - 1 units of [start, end) that lie in its first tile, the lane's parts as
// I8Copies copies them (rows lane / 8 + 4 j, 16 bytes at 16 (lane % 8) of each 128-byte row slice).
template <int NS>
__device__ __forceinline__ void i8_prefetch_quants(const Planes& P, u32 start, u32 end, int rows, int nb, int lane) {
    const int tile = start / nb, sb = start % nb;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u8* q = P.p[0] + ((u64)stage_row_base(16 * tile, (lane >> 3) + 4 * j, rows, nb) + sb) * 128 + 16 * (lane & 7);
#pragma unroll
        for (int s = 0; s < NS - 1; ++s)
            if (start + s < end && sb + s < nb) prefetch_l2(q + 128 * s);
    }
}

// The copy side of a warp's ring: the next unit to fetch (unit = tile * nb + sb) and the copies' pointers there.
template <int T>
struct I8Fetch {
    I8Copies<T> cp;
    u32 unit, end;
    int tile, sb;

    __device__ __forceinline__ void begin(const Planes& P, const i8* q8, const float* scale8, const f16* sums,
                                          const f16* sums_lo, u32 start, u32 stop, int rows, int nb, int lane) {
        unit = start;
        end = stop;
        tile = start / nb;
        sb = start % nb;
        cp.init(P, q8, scale8, sums, sums_lo, 16 * tile, rows, nb, lane, sb);
    }
    // Copies of the next unit into the stage at dst (nothing past the range), then one commit group.
    __device__ __forceinline__ void next(u32 dst, const Planes& P, const i8* q8, const float* scale8,
                                         const f16* sums, const f16* sums_lo, int rows, int nb, int lane) {
        if (unit < end) {
            cp.issue(dst, 1, lane < i8_slots(T));
            if (++unit < end && ++sb == nb) {  // the next tile: its rows' pointers, once per tile
                sb = 0;
                cp.init(P, q8, scale8, sums, sums_lo, 16 * ++tile, rows, nb, lane, 0);
            }
        }
        cp_async_commit();  // empty groups keep the group count uniform
    }
};

// One launch covers the whole matrix. Launch: grid = (SMs x resident blocks) or fewer, blockDim 32 x (1 ..
// I8P_WARPS), dynamic shared memory warps x (NS x i8_stage_bytes(T) + I8_ZERO_BYTES + 512); partials: 2 P tiles
// of scratch; counts: one u32 per tile, zero before the first launch (each launch leaves them zero).
template <int T, int NS>
__global__ void __launch_bounds__(I8P_WARPS * 32, 4)
mmvq_i8_persist(const u8* __restrict__ w, const i8* __restrict__ q8, const float* __restrict__ scale8,
                const f16* __restrict__ sums, const f16* __restrict__ sums_lo, float* __restrict__ y,
                const float* __restrict__ bias, const float* __restrict__ residual, float* __restrict__ partials,
                u32* __restrict__ counts, int rows, int K, int ldy) {
    constexpr int STAGE = i8_stage_bytes(T), WARP_BYTES = NS * STAGE + I8_ZERO_BYTES + PERSIST_TILE_FLOATS * 4;
    extern __shared__ __align__(16) u8 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int nb = K / QK_SB, tiles = (rows + 15) / 16;
    const PersistSched sched{(u32)tiles * nb, gridDim.x * (u32)wpb, (u32)nb};
    const u32 me = blockIdx.x * wpb + warp;
    const u32 start = persist_start(me, sched.U, sched.P), end = persist_start(me + 1, sched.U, sched.P);
    const Planes P = QTraits<QT_Q4_K>::planes(w, (u64)rows * nb);
    i8_prefetch_quants<NS>(P, start, end, rows, nb, lane);
    PDL_ENTER();  // the activations, partials and counts are shared with earlier kernels
    if (start >= end) return;
    I8Fetch<T> fetch;
    fetch.begin(P, q8, scale8, sums, sums_lo, start, end, rows, nb, lane);
    u8* ring = smem + warp * WARP_BYTES;
    u8* zero = ring + NS * STAGE;
    float* buf = reinterpret_cast<float*>(zero + I8_ZERO_BYTES);
    const u32 ring_s = smem_u32(ring);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) fetch.next(ring_s + s * STAGE, P, q8, scale8, sums, sums_lo, rows, nb, lane);
    for (int k = lane; k < I8_ZERO_BYTES / 16; k += 32) reinterpret_cast<uint4*>(zero)[k] = make_uint4(0u, 0u, 0u, 0u);
    const PersistOut out{y, bias, residual, rows, T, ldy, T <= 4};
    const bool has_col = i8_has_col<T>(g);
    const int col_off = has_col ? Q4KStage8::BYTES + I8_SLOT_PITCH * g + 16 * c : 16 * c;

    const int first_tile = start / nb;
    int tile = first_tile, sb = start % nb;
    bool whole = sb == 0;  // this warp has the tile's units from its first superblock on
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int rd = 0, wr = NS - 1;  // ring stages: the one read now, the one the next copy fills
    for (u32 u = start; u < end; ++u) {
        __syncwarp();  // every lane is done reading the stage the next copy overwrites (and the zero column is set)
        fetch.next(ring_s + wr * STAGE, P, q8, scale8, sums, sums_lo, rows, nb, lane);
        cp_async_wait<NS - 1>();  // this lane's copies of unit u have landed
        __syncwarp();             // and every other lane's
        const u8* st = ring + rd * STAGE;
        i8_unit<T>(st, (has_col ? st : zero) + col_off, has_col, g, c, acc);
        rd = rd + 1 == NS ? 0 : rd + 1;
        wr = wr + 1 == NS ? 0 : wr + 1;
        if (sb + 1 < nb && u + 1 < end) {
            ++sb;
            continue;
        }
        // this warp's part of the tile is done: store it whole, or as a share
        if (whole && sb + 1 == nb) {
            frag_to_tile(buf, acc, g, c);
            persist_store(buf, out, tile * 16, lane);
        } else {
            persist_partial(acc, buf, partials, counts, sched, me, tile, tile == first_tile, out, lane);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] = 0.f;
        ++tile;
        sb = 0;
        whole = true;
    }
    cp_async_wait<0>();  // nothing may land in shared memory after the warp exits
}
