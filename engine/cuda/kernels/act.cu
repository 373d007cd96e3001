// The matmul input ("act" layout, mmvq.cu) produced straight from the op in front of the matmul, so no separate
// pass writes an f32 intermediate: a plain copy, RMSNorm, SwiGLU, or the DeltaNet's gated per-head RMSNorm.
// Every variant also writes the sub-block sums (hi + lo f16 pair) of exactly the f16 values the mma will see,
// and, in precise mode, each value's f16 rounding residue (act_lo); with an Act8 (up to 4 tokens), the same
// values as int8 for kernels/mmvq_i8.cu (its header describes that layout).
#include "common.cuh"
#include "quants.cuh"

#define ACT_PLAIN 0     // v = x
#define ACT_RMSNORM 1   // v = x / rms(x row) * w
#define ACT_SWIGLU 2    // v = silu(x) * x2
#define ACT_GATEDNORM 3 // v = x / rms(x head) * w[d] * silu(x2), heads of `head` values

struct ActSrc {
    const float* x;
    const float* x2;
    const float* w;
    float* out32;  // optional f32 copy of v, [T, ld_out32] (read by the f32-weight path)
    int ldx, ldx2, ld_out32, head;
    float eps;
};

// The int8 copy of the activations (null q: not wanted). Per group of 8 tokens: q [nsb][2][8][256], scale
// [nsb][2][8], sums, sums_lo [nsb][8][8].
struct Act8 {
    i8* q;
    float* scale;
    f16* sums;
    f16* sums_lo;
};

__device__ __forceinline__ i64 act_pos(int sb, int s, int n) { return ((i64)(sb * SB_STEPS + s) * 8 + n) * 16; }

// v as an f16 and its rounding residue (the sub-block sums' hi + lo pair).
__device__ __forceinline__ void store_f16_pair(f16* hi, f16* lo, i64 i, float v) {
    const f16 h = f32_to_f16(v);
    hi[i] = h;
    lo[i] = f32_to_f16(v - f16_to_f32(h));
}

// Per-token 1/rms of the whole row (RMSNORM): each block reduces the rows of its group itself. The token loop
// is innermost so the loads of all the group's rows are independent and in flight together.
__device__ __forceinline__ void row_inv_rms(const ActSrc& a, int grp, int T, int K, float* inv /* [8] shared */) {
    __shared__ float part[8][8];  // [warp][token]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tokens = min(8, T - grp * 8);
    const float* rows = a.x + (i64)grp * 8 * a.ldx;
    float ss[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if ((K & 3) == 0 && (a.ldx & 3) == 0 && tokens == 1) {  // decode: the row's loads unrolled, in flight together
#pragma unroll 5
        for (int k = 4 * threadIdx.x; k < K; k += 4 * blockDim.x) {
            const float4 v = *reinterpret_cast<const float4*>(rows + k);
            ss[0] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else if ((K & 3) == 0 && (a.ldx & 3) == 0) {
        for (int k = 4 * threadIdx.x; k < K; k += 4 * blockDim.x) {
#pragma unroll
            for (int n = 0; n < 8; ++n)
                if (n < tokens) {
                    const float4 v = *reinterpret_cast<const float4*>(rows + (i64)n * a.ldx + k);
                    ss[n] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                }
        }
    } else {
        for (int k = threadIdx.x; k < K; k += blockDim.x)
#pragma unroll
            for (int n = 0; n < 8; ++n)
                if (n < tokens) ss[n] += rows[(i64)n * a.ldx + k] * rows[(i64)n * a.ldx + k];
    }
    if (tokens == 1)
        ss[0] = warp_sum(ss[0]);  // the others are zero
    else
        warp_sum_n<8>(ss);
    if (lane == 0)
#pragma unroll
        for (int n = 0; n < 8; ++n) part[warp][n] = ss[n];
    __syncthreads();
    if (threadIdx.x < 8) {
        float total = 0.f;
        for (int wi = 0; wi < (int)(blockDim.x >> 5); ++wi) total += part[wi][threadIdx.x];
        inv[threadIdx.x] = rsqrtf(total / K + a.eps);
    }
    __syncthreads();
}

// Superblock sb of the group's tokens (v: this thread's position p of each) as two int8 levels: s = max|v| / 127
// over the superblock, q_hi = rint(v / s), q_lo = rint((v - s q_hi) / s_lo) with s_lo = s / 254.
__device__ __forceinline__ void act_i8(const Act8& a8, const float (&v)[8], int grp, int T, int sb, int nsb) {
    __shared__ float wmax[8][8];  // [warp][token]
    const int p = threadIdx.x, lane = p & 31, warp = p >> 5, tokens = min(8, T - grp * 8);
#pragma unroll
    for (int n = 0; n < 8; ++n)
        if (n < tokens) {
            const float m = warp_max(fabsf(v[n]));
            if (lane == 0) wmax[warp][n] = m;
        }
    __syncthreads();
    const int off = 64 * (p >> 6) + 16 * ((p & 31) >> 3) + 8 * ((p >> 5) & 1) + (p & 7);
    const i64 blk = (i64)grp * nsb + sb;
    i8* q = a8.q + blk * 4096 + off;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        if (n >= tokens) break;
        float mx = 0.f;
#pragma unroll
        for (int wi = 0; wi < 8; ++wi) mx = fmaxf(mx, wmax[wi][n]);
        const bool live = mx >= 1e-30f;  // below that (and for zeros) both levels are 0, so 254 / s cannot overflow
        const float s = live ? mx / 127.f : 0.f, s_lo = s / 254.f;
        const float inv = live ? 127.f / mx : 0.f, inv_lo = live ? 254.f / s : 0.f;
        const float qh = fminf(fmaxf(rintf(v[n] * inv), -127.f), 127.f);
        const float ql = fminf(fmaxf(rintf(fmaf(-qh, s, v[n]) * inv_lo), -127.f), 127.f);
        q[n * 256] = (i8)(int)qh;
        q[(8 + n) * 256] = (i8)(int)ql;
        if (p == 0) {
            a8.scale[blk * 16 + n] = s;
            a8.scale[blk * 16 + 8 + n] = s_lo;
        }
        const float sub = warp_sum(fmaf(ql, s_lo, qh * s));  // what the int8 mma sees; a warp = one sub-block
        if (lane == 0) store_f16_pair(a8.sums, a8.sums_lo, (blk * 8 + n) * 8 + warp, sub);
    }
}

// Grid (superblocks, token groups of 8), 256 threads: thread = position in the superblock.
template <int MODE>
__global__ void __launch_bounds__(256)
act_from(ActSrc a, f16* __restrict__ act, f16* __restrict__ sums, f16* __restrict__ act_lo,
         f16* __restrict__ sums_lo, Act8 a8, int T, int K) {
    PDL_ENTER();
    __shared__ float inv[8];
    __shared__ float head_ss[8][8];  // GATEDNORM: [warp][token] partial sums of squares
    const int sb = blockIdx.x, grp = blockIdx.y, nsb = gridDim.x, k_local = threadIdx.x;
    const int k = sb * QK_SB + k_local, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = k_local >> 6, h = (k_local >> 5) & 1, i = (k_local >> 2) & 7, r = k_local & 3;
    const int s = 2 * i + h;
    float v[8];  // loaded before RMSNORM's row reduction, so the two round trips to memory overlap
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        const int t = grp * 8 + n;
        const bool ok = t < T && k < K;
        float x = ok ? a.x[(i64)t * a.ldx + k] : 0.f;
        if (MODE == ACT_SWIGLU) x = ok ? siluf_(x) * a.x2[(i64)t * a.ldx2 + k] : 0.f;
        v[n] = x;
    }
    const float w_k = MODE == ACT_RMSNORM && k < K ? a.w[k] : 0.f;
    if (MODE == ACT_RMSNORM) row_inv_rms(a, grp, T, K, inv);
    if (MODE == ACT_GATEDNORM) {  // heads of a.head positions (a divisor of 256): warps, then whole heads
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const float ss = warp_sum(v[n] * v[n]);
            if (lane == 0) head_ss[warp][n] = ss;
        }
        __syncthreads();
        const int warps_per_head = a.head / 32, first = (warp / warps_per_head) * warps_per_head;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            float total = 0.f;
            for (int wi = first; wi < first + warps_per_head; ++wi) total += head_ss[wi][n];
            const int t = grp * 8 + n;
            const bool ok = t < T && k < K;
            v[n] = ok ? v[n] * rsqrtf(total / a.head + a.eps) * a.w[k % a.head] *
                            siluf_(a.x2[(i64)t * a.ldx2 + k]) : 0.f;
        }
    }
    f16* act_g = act + (i64)grp * nsb * 2048;
    if (MODE == ACT_RMSNORM)
#pragma unroll
        for (int n = 0; n < 8; ++n) v[n] = (grp * 8 + n < T && k < K) ? v[n] * inv[n] * w_k : 0.f;
    if (a8.q) act_i8(a8, v, grp, T, sb, nsb);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        const int t = grp * 8 + n;
        if (a.out32 && t < T && k < K) a.out32[(i64)t * a.ld_out32 + k] = v[n];
        const f16 hi = f32_to_f16(v[n]);
        act_g[act_pos(sb, s, n) + 4 * c + r] = hi;
        float seen = f16_to_f32(hi);  // what the mma multiplies
        if (act_lo) {
            const f16 lo = f32_to_f16(v[n] - seen);
            act_lo[(i64)grp * nsb * 2048 + act_pos(sb, s, n) + 4 * c + r] = lo;
            seen += f16_to_f32(lo);
        }
        // a warp covers one 32-wide sub-block; a token past T has only zeros (sum 0, no shuffles to wait on)
        const float sub = t < T ? warp_sum(seen) : 0.f;
        if (lane == 0) store_f16_pair(sums, sums_lo, (i64)grp * nsb * 64 + ((i64)sb * 8 + n) * 8 + (k_local >> 5), sub);
    }
}
