// The matmul input ("act" layout, mmvq.cu) produced straight from the op in front of the matmul, so no separate
// pass writes an f32 intermediate: a plain copy, RMSNorm, SwiGLU, or the DeltaNet's gated per-head RMSNorm.
// Every variant also writes the sub-block sums (hi + lo f16 pair) of exactly the f16 values the mma will see,
// and, in precise mode, each value's f16 rounding residue (act_lo).
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

__device__ __forceinline__ i64 act_pos(int sb, int s, int n) { return ((i64)(sb * SB_STEPS + s) * 8 + n) * 16; }

// Per-token 1/rms of the whole row (RMSNORM): each block reduces the rows of its group itself. The token loop
// is innermost so the loads of all the group's rows are independent and in flight together.
__device__ void row_inv_rms(const ActSrc& a, int grp, int T, int K, float* inv /* [8] shared */) {
    __shared__ float part[8][8];  // [warp][token]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tokens = min(8, T - grp * 8);
    const float* rows = a.x + (i64)grp * 8 * a.ldx;
    float ss[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if ((K & 3) == 0 && (a.ldx & 3) == 0) {
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

// Sum of v over groups of N consecutive lanes (N a power of two, at most 32), every lane of a group getting it.
template <int N>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = N / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Grid (ceil(superblocks / ACT_SB_PER_BLOCK), token groups of 8), 256 threads: 64 threads a superblock, thread j
// of one owning its positions 4j .. 4j + 3, which are contiguous in x (one 16-byte load per token) and in the act
// layout (step 2i + h, offset 4c for j = 16c + 8h + i: one 8-byte store per token); the 8 threads of a 32-wide
// sub-block are 8 consecutive lanes.
#define ACT_SB_PER_BLOCK 4
template <int MODE>
__global__ void __launch_bounds__(256)
act_from(ActSrc a, f16* __restrict__ act, f16* __restrict__ sums, f16* __restrict__ act_lo,
         f16* __restrict__ sums_lo, int T, int K) {
    PDL_ENTER();
    __shared__ float inv[8];
    __shared__ float head_ss[8][8];  // GATEDNORM heads of 256: [warp][token] partial sums of squares
    const int j = threadIdx.x & 63, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sb = blockIdx.x * ACT_SB_PER_BLOCK + (threadIdx.x >> 6), grp = blockIdx.y;
    const int nsb = (K + QK_SB - 1) / QK_SB, k0 = sb * QK_SB + 4 * j;
    const int i = j & 7, h = (j >> 3) & 1, c = j >> 4, s = 2 * i + h;
    if (MODE == ACT_RMSNORM) row_inv_rms(a, grp, T, K, inv);  // (block-wide: before any thread may leave)
    const bool vec = (K & 3) == 0 && (a.ldx & 3) == 0 && (reinterpret_cast<u64>(a.x) & 15) == 0;
    float v[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        const int t = grp * 8 + n;
        const i64 row = (i64)t * a.ldx;
        if (vec && t < T && k0 < K) {  // K % 4 == 0: all four positions are inside
            const float4 x = *reinterpret_cast<const float4*>(a.x + row + k0);
            v[n][0] = x.x, v[n][1] = x.y, v[n][2] = x.z, v[n][3] = x.w;
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) v[n][r] = (t < T && k0 + r < K) ? a.x[row + k0 + r] : 0.f;
        }
        if (MODE == ACT_SWIGLU) {
#pragma unroll
            for (int r = 0; r < 4; ++r)
                v[n][r] = (t < T && k0 + r < K) ? siluf_(v[n][r]) * a.x2[(i64)t * a.ldx2 + k0 + r] : 0.f;
        }
    }
    if (MODE == ACT_GATEDNORM) {  // heads of a.head positions (32, 64, 128 or 256): a.head / 4 consecutive threads
        float ss[8];
#pragma unroll
        for (int n = 0; n < 8; ++n) ss[n] = v[n][0] * v[n][0] + v[n][1] * v[n][1] + v[n][2] * v[n][2] + v[n][3] * v[n][3];
        const int lanes = a.head / 4;
#pragma unroll
        for (int n = 0; n < 8; ++n)
            ss[n] = lanes == 8 ? group_sum<8>(ss[n]) : lanes == 16 ? group_sum<16>(ss[n]) : group_sum<32>(ss[n]);
        if (lanes == 64) {  // a head is a superblock: its two warps' halves meet in shared memory
            if (lane == 0)
#pragma unroll
                for (int n = 0; n < 8; ++n) head_ss[warp][n] = ss[n];
            __syncthreads();
#pragma unroll
            for (int n = 0; n < 8; ++n) ss[n] = head_ss[warp & ~1][n] + head_ss[warp | 1][n];
        }
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const int t = grp * 8 + n;
            const float scale = rsqrtf(ss[n] / a.head + a.eps);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int k = k0 + r;
                v[n][r] = (t < T && k < K) ? v[n][r] * scale * a.w[k % a.head] * siluf_(a.x2[(i64)t * a.ldx2 + k]) : 0.f;
            }
        }
    }
    if (sb >= nsb) return;  // a partial last block: nothing of it is stored
    f16* act_g = act + (i64)grp * nsb * 2048 + act_pos(sb, s, 0) + 4 * c;
    f16* lo_g = act_lo ? act_lo + (i64)grp * nsb * 2048 + act_pos(sb, s, 0) + 4 * c : nullptr;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        const int t = grp * 8 + n;
        f16 hi[4], lo[4];
        float seen = 0.f;  // what the mma multiplies, summed over the four positions
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int k = k0 + r;
            if (MODE == ACT_RMSNORM) v[n][r] = (t < T && k < K) ? v[n][r] * inv[n] * a.w[k] : 0.f;
            if (a.out32 && t < T && k < K) a.out32[(i64)t * a.ld_out32 + k] = v[n][r];
            hi[r] = f32_to_f16(v[n][r]);
            float part = f16_to_f32(hi[r]);
            if (lo_g) {
                lo[r] = f32_to_f16(v[n][r] - part);
                part += f16_to_f32(lo[r]);
            }
            seen += part;
        }
        *reinterpret_cast<uint2*>(act_g + 16 * n) = make_uint2(hi[0] | ((u32)hi[1] << 16), hi[2] | ((u32)hi[3] << 16));
        if (lo_g)
            *reinterpret_cast<uint2*>(lo_g + 16 * n) = make_uint2(lo[0] | ((u32)lo[1] << 16), lo[2] | ((u32)lo[3] << 16));
        const float sub = group_sum<8>(seen);  // the 8 threads of one 32-wide sub-block
        if (i == 0) {
            const i64 si = (i64)grp * nsb * 64 + ((i64)sb * 8 + n) * 8 + (j >> 3);
            const f16 sh = f32_to_f16(sub);
            sums[si] = sh;
            sums_lo[si] = f32_to_f16(sub - f16_to_f32(sh));
        }
    }
}
