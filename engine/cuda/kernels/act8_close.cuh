// Closers: a kernel forms the int8 input of the matmul after it at its own tail, where a producer launch
// (kernels/act.cu, PER = 1) would have formed it from the kernel's output; that launch and the kernel boundary in
// front of it go (engine/cuda/closers.py says when). Four producers close this way:
//   SwiGLU    silu(gate) * up, the matmul's rows being the gate half, then the up half (gate | up of the FFN);
//   RMSNorm   x / rms(x) * w of the matmul's row x (the FFN norm of the residual row, the next layer's input norm);
//   gated     o / rms(o per head) * w[head] * silu(z), o the delta rule's output (kernels/deltanet.cu), z the gate;
//   plain     the values themselves (attention's output, kernels/attention.cu attn_combine).
//
// A superblock of the consumer's input (256 positions) is the output of several writers (a matmul's 16-row tiles,
// SwiGLU's 32: gate's and up's; the delta rule's 8-column warps; attn_combine's (token, head) blocks), each of
// which counts itself in the superblock's counter once its values are stored (a fence, then an atomic); the
// writer whose count completes a superblock reads it back from L2 and writes its two int8 levels, scales and
// sub-block sums for every token in act.cu's Act8 layout (tokens 0 .. T-1 of group 0) with the producer's own
// arithmetic (act8.cuh), so the consumer reads what act_i8 would have written. The gated norm's heads lie inside
// a superblock (head sizes divide 256), so it closes like SwiGLU, with no row-wide step.
//
// RMSNorm's 1 / rms needs the whole row, which no superblock has. The levels do not depend on a positive scale of
// the values (both are rint of v over the superblock's largest |v|: bench/MEGAKERNEL.md, eighth session), so each
// superblock's closer writes the levels of x * w and keeps, per token, its sum of squares, its two scales and its
// eight sub-block sums in `part`; the closer that completes the row (the row's counter, slot nsb) sums each token's
// squares in superblock order (the same result whoever closes last) and writes every scale and sum times that
// token's 1 / rms. Unnormalised sums never reach an f16 (x * w may exceed its range). Counters are left zero for
// the next launch (the scratch is zeroed once, when allocated).
#pragma once
#include "act8.cuh"
#include "quants.cuh"

#define CLOSE_NONE -1  // a kernel without a closer
#define CLOSE_PART 12  // floats of a (superblock, token) in part: sum of squares, s, s_lo, (unused), 8 sub-block sums
#define CLOSE_TOKENS 8 // tokens a closer takes (one group of the act layout)

// Mirror of engine/cuda/ops.py CloseDst.
struct Act8Close {
    const float* w;   // RMSNorm: the norm's weight [width]; gated norm: the head's [head]
    const float* x2;  // gated norm: the gate z, row t at x2 + t * ld2
    i8* q;            // the consumer's int8 copy: Act8's q, scale, sums, sums_lo (tokens 0 .. T-1 of group 0)
    float* scale;
    f16* sums;
    f16* sums_lo;
    u32* count;       // [nsb + 1]: writers stored a superblock, then (RMSNorm) superblocks closed; zero between runs
    float* part;      // RMSNorm: [nsb][CLOSE_TOKENS][CLOSE_PART]
    int width;        // positions of the consumer's input: RMSNorm the matmul's rows, SwiGLU half of them
    int tokens;       // T (1 .. CLOSE_TOKENS)
    int ld;           // the writer's output: row t at y + t * ld
    int ld2;          // gated norm: z's rows
    int head;         // gated norm: positions a head (32, 64, 128 or 256)
    float eps;
};

// The lane's 8 positions from p (16-byte aligned), loaded from L2: other blocks stored them.
__device__ __forceinline__ void close_load8(const float* p, float (&v)[8]) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(p)), b = __ldcg(reinterpret_cast<const float4*>(p + 4));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void close_weights8(const float* p, float (&v)[8]) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The counters' fences: release before a count, acquire after the count that completes (PTX's release and acquire
// patterns; one thread's fence after a __syncthreads orders the whole block's stores, as CUTLASS's semaphores
// rely on). __threadfence() is sequentially consistent (SASS MEMBAR.SC.GPU, then CCTL.IVALL emptying the SM's
// L1), more than either needs; CLOSE_FENCE_ACQREL=1 (a benchmark knob, off) takes fence.acq_rel.gpu for both. The
// closers read what other blocks stored with ld.global.cg (L2), so L1's state never matters to them.
#ifndef CLOSE_FENCE_ACQREL
#define CLOSE_FENCE_ACQREL 0
#endif

__device__ __forceinline__ void close_fence() {
#if CLOSE_FENCE_ACQREL
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
#else
    __threadfence();
#endif
}

// A (superblock, token)'s partial sums from L2 in three loads (CLOSE_PART floats, 16-byte aligned).
__device__ __forceinline__ void close_load_part(const float* p, float4 (&v)[3]) {
#pragma unroll
    for (int i = 0; i < 3; ++i) v[i] = __ldcg(reinterpret_cast<const float4*>(p) + i);
}

// RMSNorm, by the warp that closed the row's last superblock: each token's 1 / rms from every superblock's sum of
// squares, then each (superblock, token)'s scales and sub-block sums times it, lane l taking superblocks l, l + 32,
// ... Each lane loads its first superblock's part whole before anything is stored: the compiler cannot know the
// stores miss `part`, so a load after a store waits for it, and this is the tail of the launch (a round trip each).
__device__ __forceinline__ void close_row(const Act8Close& c, int lane) {
    const int nsb = c.width / QK_SB;
    for (int t = 0; t < c.tokens; ++t) {
        float4 own[3] = {};
        if (lane < nsb) close_load_part(c.part + CLOSE_PART * (CLOSE_TOKENS * lane + t), own);
        float total = own[0].x;
        for (int s = lane + 32; s < nsb; s += 32) total += __ldcg(c.part + CLOSE_PART * (CLOSE_TOKENS * s + t));
        const float inv = rsqrtf(warp_sum(total) / (float)c.width + c.eps);
        for (int s = lane; s < nsb; s += 32) {
            float4 v[3] = {own[0], own[1], own[2]};
            if (s != lane) close_load_part(c.part + CLOSE_PART * (CLOSE_TOKENS * s + t), v);
            c.scale[16 * s + t] = v[0].y * inv;
            c.scale[16 * s + 8 + t] = v[0].z * inv;
            const float sums[8] = {v[1].x, v[1].y, v[1].z, v[1].w, v[2].x, v[2].y, v[2].z, v[2].w};
#pragma unroll
            for (int j = 0; j < 8; ++j) store_f16_pair(c.sums, c.sums_lo, 64 * s + 8 * t + j, sums[j] * inv);
        }
    }
}

// Token t's values at the lane's positions k .. k + 7 (SwiGLU: the gate's in v, the up's in u; the gated norm: o
// in v, z in u).
template <int MODE>
__device__ __forceinline__ void close_load_token(const Act8Close& c, const float* y, int k, int t, float (&v)[8],
                                                 float (&u)[8]) {
    close_load8(y + (i64)t * c.ld + k, v);
    if (MODE == ACT_SWIGLU) close_load8(y + (i64)t * c.ld + c.width + k, u);
    if (MODE == ACT_GATEDNORM) close_load8(c.x2 + (i64)t * c.ld2 + k, u);
}

// Superblock sb of the consumer's input for every token, from y (the writer's output, every writer of sb stored),
// by one warp: lane l takes positions 8 l .. 8 l + 7, which are 8 contiguous bytes of each level in the Act8 order
// and, by quads, the superblock's eight sub-blocks; RMSNorm's closer then counts the superblock into the row's.
template <int MODE>
__device__ __forceinline__ void close_superblock(const Act8Close& c, const float* y, int sb, int lane) {
    const int k = QK_SB * sb + 8 * lane;
    float wk[8];  // RMSNorm's weights, or the gated norm's head weights at these positions
    if (MODE == ACT_RMSNORM) close_weights8(c.w + k, wk);
    if (MODE == ACT_GATEDNORM) close_weights8(c.w + (8 * lane) % c.head, wk);
    float v[8], u[8];  // this token's values (and SwiGLU's up, the gated norm's z); the next token's in nv, nu
    close_load_token<MODE>(c, y, k, 0, v, u);
    for (int t = 0; t < c.tokens; ++t) {
        float nv[8], nu[8], ss = 0.f;
        // The next token's loads before this token's stores: issued after them, they would wait for this
        // token's loads and arithmetic (the compiler cannot know the stores miss y), a round trip a token.
        if (t + 1 < c.tokens) close_load_token<MODE>(c, y, k, t + 1, nv, nu);
        if (MODE == ACT_SWIGLU) {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = siluf_(v[e]) * u[e];
        } else if (MODE == ACT_GATEDNORM) {  // a head's sum of squares over its head / 8 lanes
            float sq = 0.f;
#pragma unroll
            for (int e = 0; e < 8; ++e) sq = fmaf(v[e], v[e], sq);
            for (int o = 1; o < c.head / 8; o <<= 1) sq += __shfl_xor_sync(FULL_MASK, sq, o);
            const float r = rsqrtf(sq / (float)c.head + c.eps);
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = v[e] * r * wk[e] * siluf_(u[e]);
        } else if (MODE == ACT_RMSNORM) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                ss = fmaf(v[e], v[e], ss);
                v[e] *= wk[e];
            }
        }  // ACT_PLAIN: the values as they are
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
        i8* q = c.q + 4096 * sb + 256 * t + off;
        *reinterpret_cast<uint2*>(q) = make_uint2(hi[0], hi[1]);
        *reinterpret_cast<uint2*>(q + 2048) = make_uint2(lo[0], lo[1]);
        sub += __shfl_xor_sync(FULL_MASK, sub, 1);
        sub += __shfl_xor_sync(FULL_MASK, sub, 2);
        if (MODE != ACT_RMSNORM) {
            if (lane == 0) {
                c.scale[16 * sb + t] = lv.s;
                c.scale[16 * sb + 8 + t] = lv.s_lo;
            }
            if ((lane & 3) == 0) store_f16_pair(c.sums, c.sums_lo, 64 * sb + 8 * t + (lane >> 2), sub);
        } else {
            ss = warp_sum(ss);
            float* p = c.part + CLOSE_PART * (CLOSE_TOKENS * sb + t);
            if (lane == 0) {
                p[0] = ss;
                p[1] = lv.s;
                p[2] = lv.s_lo;
            }
            if ((lane & 3) == 0) p[4 + (lane >> 2)] = sub;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = nv[e], u[e] = nu[e];
    }
    if (MODE != ACT_RMSNORM) return;
    close_fence();  // this superblock's parts before the row's count
    __syncwarp();
    const int nsb = c.width / QK_SB;
    u32 closed = 0u;
    if (lane == 0) closed = atomicAdd(c.count + nsb, 1u);
    if (__shfl_sync(FULL_MASK, closed, 0) != (u32)(nsb - 1)) return;
    close_fence();  // every other superblock's parts
    __syncwarp();
    if (lane == 0) c.count[nsb] = 0u;
    close_row(c, lane);
}

// Called by a whole warp once the writes it counts are stored (by its own lanes, or before a __syncthreads): the
// warp's fence releases them, then each lane with `counts` counts one writer into superblock sb_of_lane's counter,
// which `writers` complete; the warp then closes each superblock whose count this completed. The atomics of a warp
// fly together.
template <int MODE>
__device__ __forceinline__ void close_arrive(const Act8Close& c, const float* y, int sb_of_lane, bool counts,
                                             u32 writers) {
    const int lane = threadIdx.x & 31;
    close_fence();  // the writes counted here before their counts
    __syncwarp();
    int sb = -1;
    if (counts && atomicAdd(c.count + sb_of_lane, 1u) == writers - 1) sb = sb_of_lane;
    u32 full = __ballot_sync(FULL_MASK, sb >= 0);
    if (full) {
        close_fence();  // the other writers' values of those superblocks
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

// close_arrive as a call, for a writer whose own loop holds many registers: inlined into the delta rule (its
// state in registers), the closer's code made it spill 20 bytes (sm_90); the matmuls inline it and do not.
template <int MODE>
__device__ __noinline__ void close_arrive_call(const Act8Close& c, const float* y, int sb_of_lane, bool counts,
                                               u32 writers) {
    close_arrive<MODE>(c, y, sb_of_lane, counts, writers);
}

// A matmul's closer: called by warp 0 of a block once every tile it takes is stored (tiles first, first + step,
// ..., `tiles` of them; the rows by lanes of this warp or before a __syncthreads): one writer a tile, 16 a
// superblock (SwiGLU 32: the gate's and the up's tiles of its positions).
template <int MODE>
__device__ __forceinline__ void close_tiles(const Act8Close& c, const float* y, int first, int step, int tiles) {
    const int lane = threadIdx.x & 31, half = c.width / 16;  // tiles of the gate half (RMSNorm: every tile)
    for (int t0 = 0; t0 < tiles; t0 += 32) {
        const int tile = first + (t0 + lane) * step;
        close_arrive<MODE>(c, y, (tile % half) / 16, t0 + lane < tiles, MODE == ACT_SWIGLU ? 32u : 16u);
    }
}
