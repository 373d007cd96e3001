// The stream-K work split of the persistent mmvqs (kernels/mmvq_persist.cu, kernels/mmvq_i8_persist.cu) and the
// summing of the tiles that warps' ranges cut (engine/cuda/persist.py mirrors the arithmetic).
//
// A unit is one superblock of one 16-row tile; unit u = tile * nb + sb. The U units are cut into P contiguous
// ranges of U / P (+-1) units, one per warp. A tile whose units all lie in one warp's range is stored straight
// from that warp (through its 512-byte shared tile buffer); a tile cut by range boundaries (at most two per warp)
// is a partial: each of its warps writes its [16][8] share to its own slot in `partials`, and the last to arrive
// (an atomic count per tile) adds the shares in warp order, so the result does not depend on arrival order.
#pragma once
#include "mmvq.cuh"

#define PERSIST_TILE_FLOATS 128   // one tile's sums: [16 rows][MMVQ_NCOLS columns] f32 (512 bytes)

// The range of warp w: units [persist_start(w), persist_start(w + 1)). The launcher keeps U * P < 2^32 and
// P <= U (so no range is empty).
__device__ __forceinline__ u32 persist_start(u32 w, u32 U, u32 P) { return w * U / P; }

// The warp whose range holds unit u: the largest w with w U / P <= u, i.e. w U < (u + 1) P.
__device__ __forceinline__ u32 persist_owner(u32 u, u32 U, u32 P) { return ((u + 1) * P - 1) / U; }

// 16 bytes through L2 only: shares written by other SMs in this launch are never in this SM's L1.
__device__ __forceinline__ float4 ld_l2_f4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p)
                 : "memory");
    return v;
}

// The mma fragment sums (rows g, g + 8; columns 2c, 2c + 1) into a row-major [16][8] tile (shared or global).
__device__ __forceinline__ void frag_to_tile(float* t, const float (&acc)[4], int g, int c) {
    *reinterpret_cast<float2*>(t + g * MMVQ_NCOLS + 2 * c) = make_float2(acc[0], acc[1]);
    *reinterpret_cast<float2*>(t + (g + 8) * MMVQ_NCOLS + 2 * c) = make_float2(acc[2], acc[3]);
}

// Where the outputs go: y [T][ldy] (+ bias[rows]) (+ residual [T][ldy], which may be y itself).
struct PersistOut {
    float* y;
    const float* bias;
    const float* residual;
    int rows, T, ldy;
    bool packed;  // columns T + n fold into n (mmvq.cuh)
};

// The tile sum in the warp's shared buffer to y. Lane l: row l % 16, columns l / 16, l / 16 + 2, ... (16
// consecutive rows of one column per store: 64 contiguous bytes).
__device__ __forceinline__ void persist_store(const float* buf, const PersistOut& o, int row0, int lane) {
    __syncwarp();  // every lane's part of buf is written
    const int lr = lane & 15, row = row0 + lr;
    if (row < o.rows) {
        for (int col = lane >> 4; col < o.T; col += 2) {
            float v = buf[lr * MMVQ_NCOLS + col] + (o.packed ? buf[lr * MMVQ_NCOLS + col + o.T] : 0.f);
            if (o.bias) v += o.bias[row];
            if (o.residual) v += o.residual[(i64)col * o.ldy + row];
            o.y[(i64)col * o.ldy + row] = v;
        }
    }
    __syncwarp();  // buf may be reused for the next tile
}

// The schedule of one launch, shared by every warp: U units over P warps, nb superblocks per tile.
struct PersistSched {
    u32 U, P, nb;
};

// Warp `me`'s share of a tile cut by range boundaries; slot 2 me is the share of the tile its range starts in,
// 2 me + 1 that of the tile it ends in. The last of the tile's warps to arrive sums and stores the tile.
__device__ __forceinline__ void persist_partial(const float (&acc)[4], float* buf, float* partials, u32* counts,
                                                const PersistSched& s, u32 me, u32 tile, bool is_first_tile,
                                                const PersistOut& o, int lane) {
    const int g = lane >> 2, c = lane & 3;
    frag_to_tile(partials + (2 * me + (is_first_tile ? 0 : 1)) * PERSIST_TILE_FLOATS, acc, g, c);
    __threadfence();  // this lane's share is visible to the whole GPU before the count says it is there
    __syncwarp();
    u32 arrived = 0;
    if (lane == 0) arrived = atomicAdd(counts + tile, 1u) + 1u;
    arrived = __shfl_sync(FULL_MASK, arrived, 0);
    const u32 u0 = tile * s.nb, first = persist_owner(u0, s.U, s.P), last = persist_owner(u0 + s.nb - 1, s.U, s.P);
    if (arrived != last - first + 1) return;
    __threadfence();  // the other warps' shares, fenced before their counts, are visible now
    // the first warp's share is in its second slot unless its range starts in this tile; every later warp's
    // range starts in this tile (none is empty), so theirs are in their first slots
    const u32 first_slot = 2 * first + (persist_start(first, s.U, s.P) < u0 ? 1 : 0);
    float4 sum = ld_l2_f4(partials + first_slot * PERSIST_TILE_FLOATS + 4 * lane);
    for (u32 w0 = first + 1; w0 <= last; w0 += 4) {  // four shares' loads in flight at once, added in warp order
        float4 v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            v[j] = w0 + j <= last ? ld_l2_f4(partials + 2 * (w0 + j) * PERSIST_TILE_FLOATS + 4 * lane)
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (w0 + j > last) break;
            sum.x += v[j].x;
            sum.y += v[j].y;
            sum.z += v[j].z;
            sum.w += v[j].w;
        }
    }
    reinterpret_cast<float4*>(buf)[lane] = sum;
    persist_store(buf, o, (int)tile * 16, lane);
    if (lane == 0) counts[tile] = 0u;  // every warp of this tile has counted: ready for the next launch
}
