// Persistent stream-K mmvq for the K-quants: y[T, rows] = x[T, K] @ W^T (+ bias) (+ residual), T <= 8.
//
// Why: mmvq_cp (mmvq.cu) streams 3.4 TB/s over a matrix of ~40 waves of blocks but 1.8-2.2 over the 27B model's
// 2-6-wave matrices (bench/NOTES.md, v7): the cost sits per block (the first load's full latency, the reduction
// barrier, the store) and per launch (ramp and tail). Here one wave of warps covers the whole matrix and each
// warp pays the first load's latency once per launch.
//
// Work: a unit is one superblock (256 positions) of one 16-row tile; unit u = tile * nb + sb. The U units are
// cut into P = gridDim.x * warps-per-block contiguous ranges of U / P (+-1) units, one per warp, so every warp
// streams the same number of bytes whatever the matrix shape. A warp walks its range with the cp.async ring of
// stage.cuh running on across tile boundaries: the next units' copies are in flight while a finished tile is
// summed and stored. Blocks share nothing but their shared-memory allocation: no __syncthreads anywhere.
//
// Sums: a tile whose units all lie in one warp's range is stored straight from that warp (through its 512-byte
// shared tile buffer). A tile cut by range boundaries (at most two per warp) is a partial: each of its warps
// writes its [16][8] share to its own slot in `partials`, and the last to arrive (an atomic count per tile) adds
// the shares in warp order, so the result does not depend on arrival order, stores the tile and resets the count
// for the next launch. Per superblock the products are exactly mmvq_cp's (cp_superblock, mmvq.cuh): the same
// fragments, packed residue columns and exact min-term sums; only the order of the f32 sums over superblocks
// differs.
#include "mmvq.cuh"

#define PERSIST_WARPS 4           // warps per block (one block may be launched with fewer for a tiny matrix)
// Blocks per SM the register budget targets: 4 (16 warps, at most 128 registers) for one mma per step; 3 for the
// two-pass precise mode, whose second column set spilled at a cap of 128 (ptxas, sm_90) but takes 122-126
// registers under the looser cap, so 4 blocks still fit there (the launcher asks the occupancy calculator).
#define PERSIST_MIN_BLOCKS(TWO) ((TWO) ? 3 : 4)
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

// The copy side of a warp's ring: unit = tile * nb + sb is the next one to fetch; L holds its tile's row bases.
template <int QT>
struct PersistFetch {
    using S = Stage<QT>;
    u32 unit, end;
    int tile, sb;
    typename S::Lane L;

    __device__ __forceinline__ void begin(u32 start, u32 stop, int rows, int nb, int lane) {
        unit = start;
        end = stop;
        tile = start / nb;
        sb = start % nb;
        S::init(L, tile * 16, rows, nb, lane);
    }
    // Copies of the next unit into the stage at dst (nothing past the range), then one commit group.
    __device__ __forceinline__ void next(u32 dst, const Planes& P, int rows, int nb, int lane, u64 ntot) {
        if (unit < end) {
            S::copy(dst, P, L, sb, lane, ntot);
            ++unit;
            if (++sb == nb) {  // the next tile: its rows' bases, once per tile
                sb = 0;
                S::init(L, ++tile * 16, rows, nb, lane);
            }
        }
        cp_async_commit();  // empty groups keep the group count uniform
    }
};

// One launch covers the whole matrix. Launch: grid = (SMs x resident blocks) or fewer, blockDim 32 x (1 ..
// PERSIST_WARPS), dynamic shared memory warps x (STAGES x Stage<QT>::BYTES + 512); partials: 2 P tiles of
// scratch; counts: one u32 per tile, zero before the first launch (each launch leaves them zero).
// LO, TWO: the column modes of mmvq_cp (precise residue packed for T <= 4, or a second mma).
template <int QT, bool LO, bool TWO>
__global__ void __launch_bounds__(PERSIST_WARPS * 32, PERSIST_MIN_BLOCKS(TWO))
mmvq_persist(const u8* __restrict__ w, const f16* __restrict__ act, const f16* __restrict__ sums,
             const f16* __restrict__ act_lo, const f16* __restrict__ sums_lo, float* __restrict__ y,
             const float* __restrict__ bias, const float* __restrict__ residual, float* __restrict__ partials,
             u32* __restrict__ counts, int rows, int K, int T, int ldy) {
    using Q = QTraits<QT>;
    using S = Stage<QT>;
    constexpr int NS = S::STAGES, WARP_BYTES = NS * S::BYTES + PERSIST_TILE_FLOATS * 4;
    extern __shared__ __align__(16) u8 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int nb = K / QK_SB, tiles = (rows + 15) / 16;
    const PersistSched sched{(u32)tiles * nb, gridDim.x * (u32)wpb, (u32)nb};
    const u32 me = blockIdx.x * wpb + warp;
    const u32 start = persist_start(me, sched.U, sched.P), end = persist_start(me + 1, sched.U, sched.P);
    if (start >= end) return;
    const u64 ntot = (u64)rows * nb;
    const Planes P = Q::planes(w, ntot);
    u8* ring = smem + warp * WARP_BYTES;
    float* buf = reinterpret_cast<float*>(ring + NS * S::BYTES);
    const u32 ring_s = smem_u32(ring);

    PersistFetch<QT> fetch;
    fetch.begin(start, end, rows, nb, lane);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) fetch.next(ring_s + s * S::BYTES, P, rows, nb, lane, ntot);
    PDL_ENTER();  // the first weights are on their way; activations, partials and counts are shared with earlier kernels
    const PersistOut out{y, bias, residual, rows, T, ldy, !TWO && T <= 4};

    const CpColumns cols = cp_columns<LO, TWO>(act, sums, act_lo, sums_lo, T, g, c);
    const int first_tile = start / nb;
    int tile = first_tile, sb = start % nb;
    bool whole = sb == 0;  // this warp has the tile's units from its first superblock on
    u32 base0 = stage_row_base(tile * 16, g, rows, nb), base1 = stage_row_base(tile * 16, g + 8, rows, nb);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int rd = 0, wr = NS - 1;  // ring stages: the one read now, the one the next copy fills
    for (u32 u = start; u < end; ++u) {
        __syncwarp();  // every lane is done reading the stage the next copy overwrites
        fetch.next(ring_s + wr * S::BYTES, P, rows, nb, lane, ntot);
        cp_async_wait<NS - 1>();  // this lane's copies of unit u have landed
        __syncwarp();             // and every other lane's
        const u8* st = ring + rd * S::BYTES;
        typename Q::Row r[2];
        S::read(r[0], st, g, c, base0 + sb);
        S::read(r[1], st, g + 8, c, base1 + sb);
        cp_superblock<QT, TWO>(cols, r, sb, c, acc);
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
        base0 = stage_row_base(tile * 16, g, rows, nb);
        base1 = stage_row_base(tile * 16, g + 8, rows, nb);
    }
    cp_async_wait<0>();  // nothing may land in shared memory after the warp exits
}
