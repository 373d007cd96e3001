// The Hopper copy engines as the tensor-copy int8 matmuls use them (kernels/mmvq_i8b.cu one token, mmvq_i8v.cu
// 2-8 tokens): a tensor map passed by value, mbarriers counting the bytes in, the 2D tensor copy of a 16-row quant
// box and the bulk copy of a tile's word units, each issued by one lane; a warp's ring of such stages walks the
// tiles of its block. Everything compiles to nothing before sm_90 (the launchers take the kernels on sm_90+ only).
#pragma once
#include "stage.cuh"

#define I8B_MAX_SPINS (1u << 24)  // failed waits on a stage before a trap (each try_wait may suspend: seconds)
#define I8B_QUANT_BYTES 2048  // a unit's quants: 16 rows x 128 bytes, as the tensor copy lands them (swizzled)

// A tensor map (cuTensorMapEncodeTiled) passed by value: the quant plane as [rows][nb x 128] bytes, boxes of 16
// rows x 128 bytes, 128-byte swizzle (16-byte chunk k of box row t lands at chunk k ^ (t % 8)).
struct __align__(64) TensorMap {
    u64 opaque[16];
};

// ---- the copy engines and their barriers (sm_90+) ----
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}

// count mbarriers 8 bytes apart from bar, each counting one arrival a phase, made visible to the copy engines
// (one thread; the others wait for them behind a barrier of their own).
__device__ __forceinline__ void mbar_init_ring(u32 bar, int count) {
    for (int k = 0; k < count; ++k) mbar_init(bar + 8 * k, 1);
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The barrier's phase expects `bytes` more and this thread's arrival (the only one it counts).
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ bool mbar_try_wait(u32 bar, u32 parity) {
    u32 done = 1;
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#endif
    return done;
}

// bytes (a multiple of 16) from global src to shared dst, both 16-byte aligned, counted in at bar. Weights only
// (WEIGHT_EVICT_FIRST: their L2 policy, common.cuh).
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
#if __CUDA_ARCH__ >= 900 && WEIGHT_EVICT_FIRST
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
                 "[%3], %4;" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(l2_evict_first()) : "memory");
#elif __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

// The box of map at (x, y) (bytes, rows) to shared dst (1024-byte aligned for the swizzle), counted in at bar.
// Weights only, as bulk_copy.
__device__ __forceinline__ void tensor_copy_2d(u32 dst, const TensorMap& map, int x, int y, u32 bar) {
#if __CUDA_ARCH__ >= 900 && WEIGHT_EVICT_FIRST
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
        "%3}], [%4], %5;" ::"r"(dst), "l"(reinterpret_cast<u64>(&map)), "r"(x), "r"(y), "r"(bar),
        "l"(l2_evict_first()) : "memory");
#elif __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(dst), "l"(reinterpret_cast<u64>(&map)), "r"(x), "r"(y), "r"(bar) : "memory");
#endif
}

// The 4-D box of map at coordinates (c0 .. c3, elements, innermost first) to shared dst (aligned to the map's
// swizzle pattern), counted in at bar. No cache hint: activations (gemm_ws's B), read again by other blocks.
__device__ __forceinline__ void tensor_copy_4d(u32 dst, const TensorMap& map, int c0, int c1, int c2, int c3,
                                               u32 bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
        "[%6];" ::"r"(dst), "l"(reinterpret_cast<u64>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
#endif
}

// One stage: superblocks sb .. sb + n - 1 of the tile at row0, the quants to qdst (n boxes of 2 KB) and the word
// units to wdst, counted in at bar. Issued by one lane.
__device__ __forceinline__ void i8b_issue(const TensorMap& map, const u8* words, u32 qdst, u32 wdst, u32 bar,
                                          int row0, int nb, int sb, int n) {
    mbar_expect_tx(bar, (u32)n * (I8B_QUANT_BYTES + TILE_UNIT));
    for (int s = 0; s < n; ++s) tensor_copy_2d(qdst + I8B_QUANT_BYTES * s, map, 128 * (sb + s), row0, bar);
    bulk_copy(wdst, words + ((u64)stage_unit0(row0, nb) + sb) * TILE_UNIT, (u32)n * TILE_UNIT, bar);
}

// Where a warp's copies stand: stage j of its share of tile k of the block's tiles (blockIdx.x + k gridDim.x).
struct I8bCursor {
    int k = 0, j = 0;
    __device__ __forceinline__ void next(int stages_a_tile) {
        if (++j == stages_a_tile) j = 0, ++k;
    }
};

// Wait for ring slot `slot`'s copies of round `round` (the mbarrier's phase parity); bytes that never land are a
// launch error (a trap), not a hang.
__device__ __forceinline__ void i8b_wait(u32 bar, int round) {
    for (u32 spins = 0; !mbar_try_wait(bar, round & 1);)
        if (++spins == I8B_MAX_SPINS) __trap();
}

// A warp's ring of NS stages of S superblocks over its share (superblocks sb0 .. sb0 + n - 1) of each tile its
// block walks (blockIdx.x + k gridDim.x, or in halves that >> 1: tshift 1): quant boxes at qring, word units at
// wring (shared addresses), one mbarrier a slot at bars. Lane 0 issues the copies; every lane waits for them.
template <int S, int NS>
struct I8bRing {
    const TensorMap* map;
    const u8* words;
    u32 qring, wring, bars;
    int nb, sb0, n, spt, num_stages, tshift;  // spt: stages a tile
    I8bCursor out;                            // the next stage to issue

    __device__ __forceinline__ I8bRing(const TensorMap& m, const u8* w, u32 q, u32 wr, u32 b, int nb_, int sb0_,
                                       int n_, int my_tiles, int tshift_ = 0)
        : map(&m), words(w), qring(q), wring(wr), bars(b), nb(nb_), sb0(sb0_), n(n_), spt((n_ + S - 1) / S),
          num_stages(my_tiles * ((n_ + S - 1) / S)), tshift(tshift_) {}

    __device__ __forceinline__ u32 quants(int slot) const { return qring + slot * S * I8B_QUANT_BYTES; }
    __device__ __forceinline__ u32 units(int slot) const { return wring + slot * S * TILE_UNIT; }

    // Lane 0: the copies of stage `out` into ring slot `slot`.
    __device__ __forceinline__ void issue(int slot) {
        i8b_issue(*map, words, quants(slot), units(slot), bars + 8 * slot,
                  16 * (((int)blockIdx.x + out.k * (int)gridDim.x) >> tshift), nb, sb0 + out.j * S,
                  min(S, n - out.j * S));
        out.next(spt);
    }

    // Lane 0: the barriers, then the first NS - 1 stages. The weights do not depend on the previous kernel, so
    // this goes before PDL_ENTER.
    __device__ __forceinline__ void start(int lane) {
        if (lane != 0) return;
        mbar_init_ring(bars, NS);
        for (int k = 0; k < NS - 1 && k < num_stages; ++k) issue(k);
    }

    // Stage i's slot (all tiles counted), once its bytes are in; first lane 0 refills the slot that stage i - 1
    // read, with stage i + NS - 1, after every lane is done reading it.
    __device__ __forceinline__ int acquire(int i, int lane) {
        const int slot = i % NS;
        __syncwarp();
        if (lane == 0 && i + NS - 1 < num_stages) issue((i + NS - 1) % NS);
        i8b_wait(bars + 8 * slot, i / NS);
        return slot;
    }
};

// The lane's 8 bytes of chunk j (0-3) of tile row 2g + r in a swizzled quant box, as byte offsets: rows 2g and
// 2g + 1 have even and odd swizzles, so a half-warp's four rows fall in four different pairs of 16-byte chunks.
__device__ __forceinline__ void i8b_quant_offsets(int g, int c, int (&qoff)[2][4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = 2 * g + r;
            qoff[r][j] = 128 * t + 16 * ((2 * j + (c >> 1)) ^ (t & 7)) + 8 * (c & 1);
        }
}

// The end of a tile the block walked (kernels/mmvq_i8b.cu, mmvq_i8q6b.cu): the lane's sums acc of tile rows 2g and
// 2g + 1 summed over its quad, each warp's into red (by tile parity k & 1: one __syncthreads a tile), then threads
// 0-15 sum the warps' for rows row0 ..: a whole tile or its first half y = sums + bias + residual, the second half
// (second) y2 = its bare sums. Every thread of the block calls it.
template <int MAXW>
__device__ __forceinline__ void i8b_store_tile(float (&acc)[2], float (&red)[2][MAXW][16], int k, int row0, int rows,
                                               bool second, float* y, float* y2, const float* bias,
                                               const float* residual) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        acc[r] += __shfl_xor_sync(FULL_MASK, acc[r], 1);
        acc[r] += __shfl_xor_sync(FULL_MASK, acc[r], 2);
    }
    if (c == 0) {
        red[k & 1][warp][2 * g] = acc[0];
        red[k & 1][warp][2 * g + 1] = acc[1];
    }
    __syncthreads();  // (the other parity's sums, read after the last one, are rewritten only after the next)
    const int row = row0 + threadIdx.x;
    if (threadIdx.x < 16 && row < rows) {
        float v = 0.f;
        for (int wi = 0; wi < (int)(blockDim.x >> 5); ++wi) v += red[k & 1][wi][threadIdx.x];
        if (second) {
            y2[row] = v;
        } else {
            if (bias) v += bias[row];
            if (residual) v += residual[row];
            y[row] = v;
        }
    }
}
