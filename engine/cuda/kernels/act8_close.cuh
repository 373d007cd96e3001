// Closers: a one-token matmul forms the int8 input of the matmul after it at its own tail, where a producer
// launch (kernels/act.cu, PER = 1) would have formed it from the matmul's output; that launch and the kernel
// boundary in front of it go (engine/cuda/ops.py Closer says when). Two producers close this way:
//   SwiGLU   silu(gate) * up, the matmul's rows being the gate half, then the up half (gate | up of the FFN);
//   RMSNorm  x / rms(x) * w of the matmul's row x (the FFN norm of the residual row the mixer's output writes).
//
// A superblock of the consumer's input (256 positions) is 16 row tiles of the matmul (SwiGLU: 32, its gate's and
// its up's), stored by different blocks. Each block counts the tiles it stored in their superblocks' counters once
// it has stored its last one (one fence and one round of atomics a block); the block whose count completes a
// superblock reads it back from L2 and writes its two int8 levels, scales and sub-block sums in act.cu's Act8
// layout (token 0 of group 0) with the producer's own arithmetic (act8.cuh), so the consumer reads what act_i8
// would have written.
//
// RMSNorm's 1 / rms needs the whole row, which no superblock has. The levels do not depend on a positive scale of
// the values (both are rint of v over the superblock's largest |v|: bench/MEGAKERNEL.md, eighth session), so each
// superblock's closer writes the levels of x * w and keeps its sum of squares, its two scales and its eight
// sub-block sums in `part`; the closer that completes the row (the row's counter, slot nsb) sums the squares in
// superblock order (the same result whoever closes last) and writes every superblock's scales and sums times
// 1 / rms. Unnormalised sums never reach an f16 (x * w may exceed its range). Counters are left zero for the next
// launch (the scratch is zeroed once, when allocated).
#pragma once
#include "act8.cuh"
#include "quants.cuh"

#define CLOSE_NONE -1  // a matmul without a closer
#define CLOSE_PART 12  // floats of a superblock in part: sum of squares, s, s_lo, (unused), 8 sub-block sums

// Mirror of engine/cuda/ops.py CloseDst.
struct Act8Close {
    const float* w;   // RMSNorm: the norm's weight [width]
    i8* q;            // the consumer's int8 copy: Act8's q, scale, sums, sums_lo (token 0 of group 0 written)
    float* scale;
    f16* sums;
    f16* sums_lo;
    u32* count;       // [nsb + 1]: tiles stored a superblock, then (RMSNorm) superblocks closed; zero between launches
    float* part;      // RMSNorm: [nsb][CLOSE_PART]
    int width;        // positions of the consumer's input: RMSNorm the matmul's rows, SwiGLU half of them
    float eps;
};

// The lane's 8 positions from p (16-byte aligned), loaded from L2: other blocks stored them.
__device__ __forceinline__ void close_load8(const float* p, float (&v)[8]) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(p)), b = __ldcg(reinterpret_cast<const float4*>(p + 4));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// RMSNorm, by the warp that closed the row's last superblock: 1 / rms from every superblock's sum of squares, then
// each superblock's scales and sub-block sums times it (9 stores a superblock, spread over the lanes).
__device__ __forceinline__ void close_row(const Act8Close& c, int lane) {
    const int nsb = c.width / QK_SB;
    float total = 0.f;
    for (int s = lane; s < nsb; s += 32) total += __ldcg(c.part + CLOSE_PART * s);
    const float inv = rsqrtf(warp_sum(total) / (float)c.width + c.eps);
    for (int i = lane; i < 9 * nsb; i += 32) {
        const int s = i / 9, j = i % 9;
        const float* p = c.part + CLOSE_PART * s;
        if (j == 8) {
            c.scale[16 * s] = __ldcg(p + 1) * inv;
            c.scale[16 * s + 8] = __ldcg(p + 2) * inv;
        } else {
            store_f16_pair(c.sums, c.sums_lo, 64 * s + j, __ldcg(p + 4 + j) * inv);
        }
    }
}

// Superblock sb of the consumer's input from y (the matmul's output, every tile of sb stored), by one warp: lane l
// takes positions 8 l .. 8 l + 7, which are 8 contiguous bytes of each level in the Act8 order and, by quads,
// the superblock's eight sub-blocks.
template <int MODE>
__device__ __forceinline__ void close_superblock(const Act8Close& c, const float* y, int sb, int lane) {
    const int k = QK_SB * sb + 8 * lane;
    float v[8], u[8], ss = 0.f;
    close_load8(y + k, v);
    if (MODE == ACT_SWIGLU) {
        close_load8(y + c.width + k, u);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = siluf_(v[e]) * u[e];
    } else {
        const float4 a = *reinterpret_cast<const float4*>(c.w + k), b = *reinterpret_cast<const float4*>(c.w + k + 4);
        u[0] = a.x, u[1] = a.y, u[2] = a.z, u[3] = a.w, u[4] = b.x, u[5] = b.y, u[6] = b.z, u[7] = b.w;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            ss = fmaf(v[e], v[e], ss);
            v[e] *= u[e];
        }
    }
    float mx = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) mx = fmaxf(mx, fabsf(v[e]));
    const Act8Levels lv(warp_max(mx));
    u32 hi[2] = {0u, 0u}, lo[2] = {0u, 0u};
    float sub = 0.f;  // what the mma sees, summed over the lane's 8 positions, then over its quad's sub-block
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        float qh, ql;
        sub += lv.quantize(v[e], qh, ql);
        hi[e >> 2] |= (u32)(u8)(i8)(int)qh << (8 * (e & 3));
        lo[e >> 2] |= (u32)(u8)(i8)(int)ql << (8 * (e & 3));
    }
    const int off = 64 * (lane >> 3) + 16 * (lane & 3) + 8 * ((lane >> 2) & 1);  // act.cu act_i8's order
    *reinterpret_cast<uint2*>(c.q + 4096 * sb + off) = make_uint2(hi[0], hi[1]);
    *reinterpret_cast<uint2*>(c.q + 4096 * sb + 2048 + off) = make_uint2(lo[0], lo[1]);
    sub += __shfl_xor_sync(FULL_MASK, sub, 1);
    sub += __shfl_xor_sync(FULL_MASK, sub, 2);
    if (MODE == ACT_SWIGLU) {
        if (lane == 0) {
            c.scale[16 * sb] = lv.s;
            c.scale[16 * sb + 8] = lv.s_lo;
        }
        if ((lane & 3) == 0) store_f16_pair(c.sums, c.sums_lo, 64 * sb + (lane >> 2), sub);
        return;
    }
    ss = warp_sum(ss);
    float* p = c.part + CLOSE_PART * sb;
    if (lane == 0) {
        p[0] = ss;
        p[1] = lv.s;
        p[2] = lv.s_lo;
    }
    if ((lane & 3) == 0) p[4 + (lane >> 2)] = sub;
    __threadfence();  // this superblock's part before the row's count
    __syncwarp();
    const int nsb = c.width / QK_SB;
    u32 closed = 0u;
    if (lane == 0) closed = atomicAdd(c.count + nsb, 1u);
    if (__shfl_sync(FULL_MASK, closed, 0) != (u32)(nsb - 1)) return;
    __threadfence();  // every other superblock's part
    __syncwarp();
    if (lane == 0) c.count[nsb] = 0u;
    close_row(c, lane);
}

// Called by warp 0 of a block once every tile it takes is stored (tiles first, first + step, ..., `tiles` of them;
// the rows by lanes of this warp or after a __syncthreads): counts them, and closes each superblock whose count
// this completes. One lane a tile (up to 32 a round), so the atomics of a block fly together.
template <int MODE>
__device__ __forceinline__ void close_tiles(const Act8Close& c, const float* y, int first, int step, int tiles) {
    const int lane = threadIdx.x & 31, half = c.width / 16;  // tiles of the gate half (RMSNorm: every tile)
    const u32 per_sb = MODE == ACT_SWIGLU ? 32u : 16u;
    __threadfence();  // the block's rows before their counts
    __syncwarp();
    for (int t0 = 0; t0 < tiles; t0 += 32) {
        int sb = -1;
        if (t0 + lane < tiles) {
            const int tile = first + (t0 + lane) * step;
            const int s = (tile % half) / 16;
            if (atomicAdd(c.count + s, 1u) == per_sb - 1) sb = s;
        }
        u32 full = __ballot_sync(FULL_MASK, sb >= 0);
        if (full) {
            __threadfence();  // the other blocks' rows of those superblocks
            __syncwarp();
        }
        while (full) {
            const int src = __ffs(full) - 1;
            full &= full - 1;
            const int s = __shfl_sync(FULL_MASK, sb, src);
            if (lane == 0) c.count[s] = 0u;
            close_superblock<MODE>(c, y, s, lane);
        }
    }
}
