// The matmul input ("act" layout, mmvq.cu) produced straight from the op in front of the matmul, so no separate
// pass writes an f32 intermediate: a plain copy, RMSNorm, SwiGLU, or the DeltaNet's gated per-head RMSNorm.
// Every variant also writes the sub-block sums (hi + lo f16 pair) of exactly the f16 values the mma will see,
// and, in precise mode, each value's f16 rounding residue (act_lo); with an Act8 (up to 4 tokens), the same
// values as int8 for kernels/mmvq_i8.cu (its header describes that layout).
#include "act8.cuh"
#include "attention.cuh"
#include "common.cuh"
#include "quants.cuh"

// Beside act8.cuh's modes (those the matmuls share): decode attention's split partials merged (attn_combine), times
// sigmoid(gate); only act.cu produces it.
#define ACT_COMBINE 4

struct ActSrc {
    const float* x;
    const float* x2;
    const float* w;
    float* out32;  // optional f32 copy of v, [T, ld_out32] (read by the f32-weight path)
    int ldx, ldx2, ld_out32, head;
    float eps;
    float* x_sum;  // RMSNORM with x2: the rows are x + x2 (a matmul's halves), stored here too ([T, ldx])
    // COMBINE: x = the key splits' o partials [splits][T][num_heads][head], part_ml their (max, sum) pairs, x2 the
    // output gate (optional; row stride ldx2, head stride gate_head_stride): what attn_combine reads
    const float* part_ml;
    int splits, num_heads, gate_head_stride;
};

// The int8 copy of the activations (null q: not wanted). Per group of 8 tokens: q [nsb][2][8][256], scale
// [nsb][2][8], sums, sums_lo [nsb][8][8].
struct Act8 {
    i8* q;
    float* scale;
    f16* sums;
    f16* sums_lo;
};

// A staged row of act_from's PER 8 stores: 256 positions and 4 halves of padding, so that the 8-byte reads of a
// warp's 8 slots (rows) and two pieces fall in different banks
#define ACT_STAGE_LD (QK_SB + 4)

// Warp sums (or maxima) of the group's tokens' values at once: one chain for a single token, else interleaved
// butterflies over the first 4 or all 8 (the tokens past T hold zeros), so T tokens wait ~5 shuffles, not 5 T.
template <bool MAX>
__device__ __forceinline__ void warp_reduce_tokens(float (&v)[8], int tokens) {
    if (tokens == 1) {
        v[0] = MAX ? warp_max(v[0]) : warp_sum(v[0]);
        return;
    }
    const int n = tokens <= 4 ? 4 : 8;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (j < n) {
                const float other = __shfl_xor_sync(FULL_MASK, v[j], o);
                v[j] = MAX ? fmaxf(v[j], other) : v[j] + other;
            }
}

// This thread's sums of squares of the group's rows (float4 columns 4 tid, 4 (tid + blockDim), ...), NT rows at
// most: KU columns of every row loaded before any is summed, so NT x KU loads are in flight together. The loads
// are unconditional (rows past `tokens` and columns past K read a valid element again and are not summed): with
// predicated loads ptxas consumed each load before issuing the next. ADD: the rows are rows + rows2 (same ldx).
template <int NT, int KU, bool ADD>
__device__ __forceinline__ void row_squares(const float* rows, const float* rows2, i64 ldx, int K, int tokens,
                                            float (&ss)[8]) {
    for (int k0 = 4 * threadIdx.x; k0 < K; k0 += 4 * KU * blockDim.x) {
        float4 v[KU][NT];
#pragma unroll
        for (int u = 0; u < KU; ++u)
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int k = min(k0 + 4 * u * (int)blockDim.x, K - 4);
                v[u][n] = *reinterpret_cast<const float4*>(rows + min(n, tokens - 1) * ldx + k);
                if (ADD) {
                    const float4 b = *reinterpret_cast<const float4*>(rows2 + min(n, tokens - 1) * ldx + k);
                    v[u][n].x += b.x, v[u][n].y += b.y, v[u][n].z += b.z, v[u][n].w += b.w;
                }
            }
#pragma unroll
        for (int u = 0; u < KU; ++u)
#pragma unroll
            for (int n = 0; n < NT; ++n)
                if (n < tokens && k0 + 4 * u * (int)blockDim.x < K)
                    ss[n] += v[u][n].x * v[u][n].x + v[u][n].y * v[u][n].y + v[u][n].z * v[u][n].z +
                             v[u][n].w * v[u][n].w;
    }
}

// Per-token 1/rms of the whole row (RMSNORM) of the block's tokens t0 .. t0 + tokens - 1: each block reduces
// them itself. WIDE (the one-group instances, whose registers are not needed for occupancy): all loads of a
// 5,120-wide row in flight together (5 float4 a thread; one round trip for 1-4 tokens, two for 5-8); else a few
// at a time. With a.x2 (ActSrc.x_sum) the rows are x + x2.
template <bool WIDE, bool ADD>
__device__ __forceinline__ void row_squares_of(const ActSrc& a, const float* rows, const float* rows2, int tokens,
                                               int K, float (&ss)[8]) {
    if (!WIDE)
        row_squares<8, 1, ADD>(rows, rows2, a.ldx, K, tokens, ss);
    else if (tokens == 1)
        row_squares<1, 5, ADD>(rows, rows2, a.ldx, K, tokens, ss);
    else if (tokens <= 4)
        row_squares<4, 5, ADD>(rows, rows2, a.ldx, K, tokens, ss);
    else
        row_squares<8, 3, ADD>(rows, rows2, a.ldx, K, tokens, ss);
}

template <bool WIDE>
__device__ __forceinline__ void row_inv_rms(const ActSrc& a, int t0, int tokens, int K, float* inv /* [8] shared */) {
    __shared__ float part[8][8];  // [warp][token]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* rows = a.x + (i64)t0 * a.ldx;
    const float* rows2 = a.x2 ? a.x2 + (i64)t0 * a.ldx : nullptr;  // (the launcher gives both one stride)
    float ss[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if ((K & 3) == 0 && (a.ldx & 3) == 0) {
        if (rows2)
            row_squares_of<WIDE, true>(a, rows, rows2, tokens, K, ss);
        else
            row_squares_of<WIDE, false>(a, rows, rows2, tokens, K, ss);
    } else {
        for (int k = threadIdx.x; k < K; k += blockDim.x)
#pragma unroll
            for (int n = 0; n < 8; ++n)
                if (n < tokens) {
                    const float x = rows[(i64)n * a.ldx + k] + (rows2 ? rows2[(i64)n * a.ldx + k] : 0.f);
                    ss[n] += x * x;
                }
    }
    warp_reduce_tokens<false>(ss, tokens);
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

// Superblock sb of the block's tokens (slots n0 .. n0 + tokens - 1 of group grp; v: this thread's position p of
// each) as two int8 levels (Act8Levels, over the superblock's largest |v| of each token).
__device__ __forceinline__ void act_i8(const Act8& a8, const float (&v)[8], int grp, int n0, int tokens, int sb,
                                       int nsb) {
    __shared__ float wmax[8][8];  // [warp][token]
    const int p = threadIdx.x, lane = p & 31, warp = p >> 5;
    float m[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) m[n] = fabsf(v[n]);
    warp_reduce_tokens<true>(m, tokens);
    if (lane == 0)
#pragma unroll
        for (int n = 0; n < 8; ++n)
            if (n < tokens) wmax[warp][n] = m[n];
    __syncthreads();
    const int off = 64 * (p >> 6) + 16 * ((p & 31) >> 3) + 8 * ((p >> 5) & 1) + (p & 7);
    const i64 blk = (i64)grp * nsb + sb;
    i8* q = a8.q + blk * 4096 + off + 256 * n0;
    float sub[8];  // per token: what the int8 mma sees, summed over the warp's sub-block below
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        sub[n] = 0.f;
        if (n >= tokens) continue;
        float mx = 0.f;
#pragma unroll
        for (int wi = 0; wi < 8; ++wi) mx = fmaxf(mx, wmax[wi][n]);
        const Act8Levels lv(mx);
        float qh, ql;
        sub[n] = lv.quantize(v[n], qh, ql);
        q[n * 256] = (i8)(int)qh;
        q[(8 + n) * 256] = (i8)(int)ql;
        if (p == 0) {
            a8.scale[blk * 16 + n0 + n] = lv.s;
            a8.scale[blk * 16 + 8 + n0 + n] = lv.s_lo;
        }
    }
    warp_reduce_tokens<false>(sub, tokens);  // a warp = one sub-block
    if (lane == 0)
#pragma unroll
        for (int n = 0; n < 8; ++n)
            if (n < tokens) store_f16_pair(a8.sums, a8.sums_lo, (blk * 8 + n0 + n) * 8 + warp, sub[n]);
}

// COMBINE: the value at position k of token t, merged from decode attention's key splits as attention.cu's
// attn_combine merges them (a superblock holds 256 / a.head heads, each merged on its own), times sigmoid of the
// gate where there is one; 0 past K. Every thread of the block takes part (block reductions).
#define COMBINE_MAX_SPLITS 64  // mixers.MAX_SPLITS
__device__ __forceinline__ float combined(const ActSrc& a, int t, int k, int T, int K) {
    __shared__ float weight[QK_SB / 32][COMBINE_MAX_SPLITS];  // [head of the superblock][split]
    __shared__ float inv_denom[QK_SB / 32];
    __shared__ int used_of[QK_SB / 32];
    __shared__ float scratch[32];
    const int D = a.head, s = threadIdx.x, first = (k - (int)threadIdx.x) / D;  // the superblock's first head
    for (int j = 0; j < QK_SB / D; ++j) {
        const int h = first + j;
        const SplitWeight sw = split_weight(a.part_ml, ((i64)s * T + t) * a.num_heads + h,
                                            h < a.num_heads && s < a.splits, scratch);
        if (s < COMBINE_MAX_SPLITS) weight[j][s] = sw.wt;
        if (s == 0) {
            inv_denom[j] = sw.inv;
            used_of[j] = sw.used;
        }
    }
    __syncthreads();
    const int j = threadIdx.x / D, h = first + j, d = threadIdx.x % D;
    if (k >= K || h >= a.num_heads) return 0.f;
    float acc = 0.f;
#pragma unroll 8
    for (int si = 0; si < used_of[j]; ++si) acc += weight[j][si] * a.x[(((i64)si * T + t) * a.num_heads + h) * D + d];
    const float val = acc * inv_denom[j];
    return a.x2 ? val * sigmoidf_(a.x2[(i64)t * a.ldx2 + (i64)h * a.gate_head_stride + d]) : val;
}

// Grid (superblocks, token slices), 256 threads: thread = position in the superblock. PER: the tokens of a block,
// 8 (a slice is a group: the block also writes zeros into the slots past T of its group) or 1 (act_<mode>_t1: a
// decode or verify pass's tokens on blocks of their own, ops.ACT_SPLIT_TOKENS; slots past T are not written, the
// matmuls take only T columns). MIN_BLOCKS: 1 for the instances of one token group (act_<mode>_g1 and _t1: decode and
// verify, where RMSNORM spends registers on loads in flight, row_inv_rms), instances.ACT_MIN_BLOCKS for the others.
template <int MODE, int MIN_BLOCKS, int PER>
__global__ void __launch_bounds__(256, MIN_BLOCKS)
act_from(ActSrc a, f16* __restrict__ act, f16* __restrict__ sums, f16* __restrict__ act_lo,
         f16* __restrict__ sums_lo, Act8 a8, const float* __restrict__ row_inv, int T, int K) {
    PDL_ENTER();
    __shared__ float inv[8];
    __shared__ float head_ss[8][8];  // GATEDNORM: [warp][token] partial sums of squares
    const int sb = blockIdx.x, t0 = PER * blockIdx.y, grp = t0 / 8, n0 = t0 % 8, nsb = gridDim.x;
    const int k_local = threadIdx.x, k = sb * QK_SB + k_local, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = k_local >> 6, h = (k_local >> 5) & 1, i = (k_local >> 2) & 7, r = k_local & 3;
    const int s = 2 * i + h, tokens = PER == 1 ? 1 : min(PER, T - t0);
    // every global input loaded up front (before the norms' reductions), so their round trips overlap
    float v[8] = {}, gate[8] = {};  // the block's tokens; gate: GATEDNORM's silu(x2)
    static_assert(MODE != ACT_COMBINE || PER == 1, "attention's merge is built for one token a block");
    if constexpr (MODE == ACT_COMBINE) v[0] = combined(a, t0, k, T, K);
#pragma unroll
    for (int n = 0; n < (MODE == ACT_COMBINE ? 0 : PER); ++n) {
        const int t = t0 + n;
        const bool ok = t < T && k < K;
        float x = ok ? a.x[(i64)t * a.ldx + k] : 0.f;
        if (MODE == ACT_SWIGLU) x = ok ? siluf_(x) * a.x2[(i64)t * a.ldx2 + k] : 0.f;
        if (MODE == ACT_RMSNORM && a.x2 && ok) {  // a matmul's halves: their sum is the row, kept in x_sum
            x += a.x2[(i64)t * a.ldx + k];  // (one stride for both halves, as row_inv_rms reads them)
            a.x_sum[(i64)t * a.ldx + k] = x;
        }
        gate[n] = MODE == ACT_GATEDNORM && ok ? siluf_(a.x2[(i64)t * a.ldx2 + k]) : 0.f;
        v[n] = x;
    }
    const float w_k = k >= K ? 0.f : MODE == ACT_RMSNORM ? a.w[k] : MODE == ACT_GATEDNORM ? a.w[k % a.head] : 0.f;
    float rinv[PER];  // RMSNorm: each token's 1 / rms, from act_row_inv where the launcher ran it, else reduced here
    if (MODE == ACT_RMSNORM && row_inv) {
#pragma unroll
        for (int n = 0; n < PER; ++n) rinv[n] = row_inv[t0 + min(n, tokens - 1)];
    } else if (MODE == ACT_RMSNORM) {
        row_inv_rms<MIN_BLOCKS == 1>(a, t0, tokens, K, inv);
#pragma unroll
        for (int n = 0; n < PER; ++n) rinv[n] = inv[n];
    }
    if (MODE == ACT_GATEDNORM) {  // heads of a.head positions (a divisor of 256): warps, then whole heads
        float sq[8];
#pragma unroll
        for (int n = 0; n < 8; ++n) sq[n] = v[n] * v[n];
        warp_reduce_tokens<false>(sq, tokens);
        if (lane == 0)
#pragma unroll
            for (int n = 0; n < PER; ++n) head_ss[warp][n] = sq[n];  // past the tokens: lane 0's own zeros
        __syncthreads();
        const int warps_per_head = a.head / 32, first = (warp / warps_per_head) * warps_per_head;
#pragma unroll
        for (int n = 0; n < PER; ++n) {
            float total = 0.f;
            for (int wi = first; wi < first + warps_per_head; ++wi) total += head_ss[wi][n];
            const bool ok = t0 + n < T && k < K;
            v[n] = ok ? v[n] * rsqrtf(total / a.head + a.eps) * w_k * gate[n] : 0.f;
        }
    }
    f16* act_g = act + (i64)grp * nsb * 2048;
    if (MODE == ACT_RMSNORM)
#pragma unroll
        for (int n = 0; n < PER; ++n) v[n] = (t0 + n < T && k < K) ? v[n] * rinv[n] * w_k : 0.f;
    if (a8.q) act_i8(a8, v, grp, n0, tokens, sb, nsb);
    float seen[8] = {};  // per token: what the mma multiplies (hi + lo), summed over the warp's sub-block below
    // PER 8: the group's 8 slots (those past T zeros) of the superblock fill 4 KB of the act layout (and of act_lo),
    // staged through shared memory so that each thread stores 16 contiguous bytes of it (a thread's own values
    // are 2-byte pieces of 8-byte runs 512 bytes apart: 16 scattered stores a thread, bench/NOTES.md Z17)
    __shared__ __align__(16) f16 staged[2][PER][ACT_STAGE_LD];
#pragma unroll
    for (int n = 0; n < PER; ++n) {
        const int t = t0 + n;
        if (a.out32 && t < T && k < K) a.out32[(i64)t * a.ld_out32 + k] = v[n];
        const f16 hi = f32_to_f16(v[n]);
        seen[n] = f16_to_f32(hi);
        const f16 lo = f32_to_f16(v[n] - seen[n]);
        if (act_lo) seen[n] += f16_to_f32(lo);
        if constexpr (PER == 8) {
            staged[0][n][k_local] = hi;
            staged[1][n][k_local] = lo;
        } else {
            act_g[act_index(sb, s, n0 + n) + 4 * c + r] = hi;
            if (act_lo) act_lo[(i64)grp * nsb * 2048 + act_index(sb, s, n0 + n) + 4 * c + r] = lo;
        }
    }
    if constexpr (PER == 8) {  // thread p: halves 8p .. 8p + 7: step p / 16, slot (p / 2) % 8, c = 2 (p % 2), + 1
        __syncthreads();
        const int p = threadIdx.x, ps = p >> 4, pn = (p >> 1) & 7;
        const int k0 = 128 * (p & 1) + 32 * (ps & 1) + 4 * (ps >> 1);  // position of (c = 2 (p % 2), r = 0)
        const i64 at = (i64)grp * nsb * 2048 + (i64)sb * 2048 + 8 * p;
#pragma unroll
        for (int level = 0; level < 2; ++level) {
            f16* dst = level ? act_lo : act;
            if (!dst) continue;
            const uint2 a0 = *reinterpret_cast<const uint2*>(&staged[level][pn][k0]);
            const uint2 a1 = *reinterpret_cast<const uint2*>(&staged[level][pn][k0 + 64]);
            *reinterpret_cast<uint4*>(dst + at) = make_uint4(a0.x, a0.y, a1.x, a1.y);
        }
    }
    warp_reduce_tokens<false>(seen, tokens);  // a warp covers one 32-wide sub-block; tokens past T sum zeros
    if (lane == 0)
#pragma unroll
        for (int n = 0; n < PER; ++n) {
            const float sub = n < tokens ? seen[n] : 0.f;
            store_f16_pair(sums, sums_lo, (i64)grp * nsb * 64 + ((i64)sb * 8 + n0 + n) * 8 + (k_local >> 5), sub);
        }
}

// Each token's 1 / rms over its whole row (RMSNorm), a block a token, for act_from's instances of several token
// groups (prefill): there each block (a superblock of 8 tokens) would otherwise reduce its 8 whole rows itself,
// reading every row K / 256 times from L2 (bench/NOTES.md Z17).
__global__ void __launch_bounds__(256) act_row_inv(ActSrc a, float* __restrict__ inv, int K) {
    PDL_ENTER();
    __shared__ float row[8];
    row_inv_rms<true>(a, blockIdx.x, 1, K, row);
    if (threadIdx.x == 0) inv[blockIdx.x] = row[0];
}
