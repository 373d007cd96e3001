// Token choice on the device from logits [T, ld] (the output head's result): greedy argmax, and temperature /
// top-k / top-p sampling, so only token ids travel back to the host.
#include "common.cuh"

#define ARGMAX_THREADS 256

// Larger value wins; on equal values the lower index wins (numpy's argmax).
__device__ __forceinline__ void argmax_merge(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) {  // NaN loses to any number
        v = v2;
        i = i2;
    }
}

__device__ __forceinline__ void block_argmax(float& v, int& i) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) argmax_merge(v, i, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, i, o));
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sv[lane] : NEG_INF;
    i = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) argmax_merge(v, i, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, i, o));
}

// Stage 1: grid (T, chunks); each block reduces a chunk of one row to (max, index) in part[t, chunk].
__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_partial(const float* __restrict__ logits, float* __restrict__ part_v, int* __restrict__ part_i, int V, int ld,
               int chunk) {
    PDL_ENTER();
    const int t = blockIdx.x, c = blockIdx.y;
    const float* row = logits + (i64)t * ld;
    float v = NEG_INF;
    int i = 0x7fffffff;
    const int end = min(V, (c + 1) * chunk);
    for (int k = c * chunk + threadIdx.x; k < end; k += blockDim.x) argmax_merge(v, i, row[k], k);
    block_argmax(v, i);
    if (threadIdx.x == 0) {
        part_v[t * gridDim.y + c] = v;
        part_i[t * gridDim.y + c] = i;
    }
}

// Stage 2: one block per row over its chunks' results -> ids[t].
__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_final(const float* __restrict__ part_v, const int* __restrict__ part_i, i32* __restrict__ ids, int chunks) {
    PDL_ENTER();
    const int t = blockIdx.x;
    float v = NEG_INF;
    int i = 0x7fffffff;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) argmax_merge(v, i, part_v[t * chunks + c], part_i[t * chunks + c]);
    block_argmax(v, i);
    if (threadIdx.x == 0) ids[t] = i;
}

__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// How many logits of the row are >= thr (kind 0), or the probability mass of those >= thr (kind 1).
__device__ float row_count_or_mass(const float* row, int V, float thr, float m, float inv_temp, float* scratch, int kind) {
    float acc = 0.f;
    for (int k = threadIdx.x; k < V; k += blockDim.x) {
        const float x = row[k];
        if (x >= thr) acc += kind == 0 ? 1.f : __expf((x - m) * inv_temp);
    }
    return block_sum(acc, scratch);
}

// Sample one token per row: softmax(logits / temperature) restricted to the top_k largest logits (0: all) and to
// the smallest set of largest probabilities whose mass reaches top_p (1: all). Thresholds are found by bisection
// on the logit value (ties at a threshold are all kept); the draw u ~ U[0, kept mass) from splitmix64(seed, t)
// then picks the first index whose running kept mass exceeds u. One block of 1024 threads per row.
__global__ void __launch_bounds__(1024)
sample_topk_topp(const float* __restrict__ logits, i32* __restrict__ ids, int V, int ld, float temperature, int top_k,
                 float top_p, u64 seed) {
    PDL_ENTER();
    __shared__ float scratch[32];
    __shared__ float chunk_sums[1024];
    const float* row = logits + (i64)blockIdx.x * ld;
    float hi = NEG_INF, lo = -NEG_INF;
    for (int k = threadIdx.x; k < V; k += blockDim.x) {
        hi = fmaxf(hi, row[k]);
        lo = fminf(lo, row[k]);
    }
    hi = block_max(hi, scratch);
    lo = -block_max(-lo, scratch);
    const float inv_temp = 1.f / temperature;
    float thr = lo;  // keep logits >= thr
    if (top_k > 0 && top_k < V) {  // largest thr with count(>= thr) >= top_k
        float a = lo, b = hi;
        for (int it = 0; it < 40 && a < b; ++it) {
            const float mid = a + (b - a) * 0.5f;
            if (mid <= a || mid >= b) break;
            if (row_count_or_mass(row, V, mid, hi, inv_temp, scratch, 0) >= top_k) a = mid; else b = mid;
        }
        thr = a;
    }
    const float total = row_count_or_mass(row, V, thr, hi, inv_temp, scratch, 1);
    if (top_p < 1.f) {  // largest thr2 >= thr with mass(>= thr2) >= top_p * total
        float a = thr, b = hi;
        for (int it = 0; it < 40 && a < b; ++it) {
            const float mid = a + (b - a) * 0.5f;
            if (mid <= a || mid >= b) break;
            if (row_count_or_mass(row, V, mid, hi, inv_temp, scratch, 1) >= top_p * total) a = mid; else b = mid;
        }
        thr = a;
    }
    // contiguous chunk per thread, block scan of the chunk masses, then a walk inside the chosen chunk
    const int per = (V + blockDim.x - 1) / blockDim.x, begin = threadIdx.x * per, end = min(V, begin + per);
    float mine = 0.f;
    for (int k = begin; k < end; ++k)
        if (row[k] >= thr) mine += __expf((row[k] - hi) * inv_temp);
    chunk_sums[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        float kept = 0.f;
        for (int i = 0; i < (int)blockDim.x; ++i) kept += chunk_sums[i];
        const u64 r = splitmix64(seed ^ (0xD1B54A32D192ED03ull * (u64)(blockIdx.x + 1)));
        float u = (float)((double)(r >> 11) * (1.0 / 9007199254740992.0)) * kept;
        int chosen = -1, last = -1;  // last: the last kept index seen in the chosen chunk
        for (int i = 0; i < (int)blockDim.x && chosen < 0; ++i) {
            if (chunk_sums[i] <= 0.f) continue;
            if (u < chunk_sums[i]) {
                const int b0 = i * per, e0 = min(V, b0 + per);
                for (int k = b0; k < e0; ++k) {
                    if (row[k] < thr) continue;
                    last = k;
                    const float p = __expf((row[k] - hi) * inv_temp);
                    if (u < p) { chosen = k; break; }
                    u -= p;
                }
                if (chosen < 0) chosen = last;  // rounding left u just past the chunk's mass
            } else {
                u -= chunk_sums[i];
            }
        }
        for (int k = V - 1; chosen < 0 && k >= 0; --k)  // rounding left u past the kept mass: the last kept token
            if (row[k] >= thr) chosen = k;
        ids[blockIdx.x] = chosen >= 0 ? chosen : 0;
    }
}

// The verify rows' tokens chosen where the logits are, as engine/spec/verify.py's rules choose them on the host, for
// requests without penalties, top_k, top_p or a logit bias (engine/cuda/backend.py verify_choose). Greedy: the row's
// argmax (the lowest id on ties). Sampled: speculative sampling of the row's deterministic draft x (keep it with
// probability p(x), else draw from p without it; a row without a draft, x < 0, draws from p), p the weights
// exp((logit - top) / T) with min_p's cut (engine/sampling.py keep_or_resample), from the row's two uniform numbers
// (float64, the host's generator). out[t] = (token, kept). token -1: a NaN or no logit above -inf (the host raises
// as sampling.py does); -2: an infinite top (the host's float64 path takes the row). One block of 1024 threads a
// row; every pass over the row is coalesced: the max strided over the threads, the weights summed by warps over
// segments of CHOOSE_SEG(V) consecutive tokens (a lane's loads 128 bytes apart from its neighbours': one cache line
// a warp load), at most 1024 segments, their sums in float64. Thread 0 finds the segment the draw lands in, the
// block weighs its tokens, thread 0 walks them.
__device__ __forceinline__ float choose_weight(float logit, float top, float inv_temp, float min_p) {
    const float w = expf((logit - top) * inv_temp);
    return w < min_p ? 0.f : w;
}

// Tokens a segment: a multiple of 32, so that at most 1024 segments cover the row (V <= 2^20).
__device__ __forceinline__ int choose_seg(int V) { return 32 * ((V + 32 * 1024 - 1) / (32 * 1024)); }

__global__ void __launch_bounds__(1024)
choose_rows(const float* __restrict__ logits, int V, int ld, const i32* __restrict__ drafts,
            const double* __restrict__ uniforms, float inv_temp, float min_p, int greedy, i32* __restrict__ out) {
    PDL_ENTER();
    __shared__ double seg_w[1024];
    const int t = blockIdx.x, x = drafts[t];
    const float* row = logits + (i64)t * ld;
    float top = NEG_INF;
    int at = 0x7fffffff;
    bool nan = false;
    for (int k = threadIdx.x; k < V; k += blockDim.x) {
        const float v = row[k];
        nan |= v != v;
        if (v > top) {  // the thread's first maximum: its ids ascend
            top = v;
            at = k;
        }
    }
    block_argmax(top, at);  // every thread gets the row's (top, lowest id)
    const bool bad = __syncthreads_or(nan) || top == NEG_INF;
    if (bad || greedy || top == -NEG_INF) {
        if (threadIdx.x == 0) {
            out[2 * t] = bad ? -1 : (greedy ? at : -2);
            out[2 * t + 1] = !bad && greedy && at == x;
        }
        return;
    }
    const int seg = choose_seg(V), num_seg = (V + seg - 1) / seg;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int s = warp; s < num_seg; s += blockDim.x >> 5) {
        double acc = 0.0;
        const int end = min(V, (s + 1) * seg);
        for (int k = s * seg + lane; k < end; k += 32) acc += choose_weight(row[k], top, inv_temp, min_p);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
        if (lane == 0) seg_w[s] = acc;
    }
    __syncthreads();
    // thread 0: the keep test, then the segment the draw lands in (a walk over shared memory)
    __shared__ int pick;  // the segment (>= 0), or -1 - the token decided already
    __shared__ double rest;  // the target's remainder inside the segment
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int s = 0; s < num_seg; ++s) total += seg_w[s];
        const float wx = x >= 0 ? choose_weight(row[x], top, inv_temp, min_p) : 0.f;
        const double u1 = uniforms[2 * t], u2 = uniforms[2 * t + 1];
        pick = -1 - x;  // kept (or, through rounding, nothing else has mass)
        if (!(x >= 0 && (u1 * total < wx || total - wx <= 0.0))) {
            double target = (x >= 0 ? u2 : u1) * (total - wx);
            int last = -1;  // the last segment with mass: where a target past the total (rounding) ends
            for (int s = 0; s < num_seg; ++s) {
                const double mass = seg_w[s] - (x >= s * seg && x < (s + 1) * seg ? wx : 0.f);
                if (mass <= 0.0) continue;
                last = s;
                if (target < mass) break;
                target -= mass;
            }
            pick = last;
            rest = target;
        }
    }
    __syncthreads();
    const int c = pick;
    if (c < 0) {  // kept
        if (threadIdx.x == 0) {
            out[2 * t] = -1 - c;
            out[2 * t + 1] = 1;
        }
        return;
    }
    // the chosen segment's weights, one a thread, then thread 0's walk over them
    const int b0 = c * seg, e0 = min(V, b0 + seg);
    if (b0 + (int)threadIdx.x < e0) {
        const int k = b0 + threadIdx.x;
        seg_w[threadIdx.x] = k == x ? 0.0 : (double)choose_weight(row[k], top, inv_temp, min_p);
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    double target = rest;
    int chosen = -1;
    for (int j = 0; j < e0 - b0; ++j) {
        const double w = seg_w[j];
        if (w <= 0.0) continue;
        chosen = b0 + j;  // the last with mass so far: where rounding past the segment's mass ends
        if (target < w) break;
        target -= w;
    }
    out[2 * t] = chosen;
    out[2 * t + 1] = 0;
}
