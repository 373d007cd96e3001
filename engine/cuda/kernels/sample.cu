// Token choice on the device from logits [T, ld] (the output head's result): greedy argmax, and each verify row's
// token by the server's rules (choose_rows), so only token ids travel back to the host.
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

// ---- choose_rows: the verify rows' tokens chosen where the logits are ----
// As engine/spec/verify.py's rules choose them on the host, for requests without a logit bias (engine/cuda/
// backend.py verify_choose; penalties are in the logits already, kernels/penalties.cu). Greedy: the row's argmax
// (the lowest id on ties). Sampled: speculative sampling of the row's deterministic draft x (keep it with
// probability p(x), else draw from p without it; a row without a draft, x < 0, draws from p), p the weights
// exp((logit - top) / T) that top_k, then top_p, then min_p keep (engine/sampling.py keep_or_resample), from the
// row's two uniform numbers (float64, the host's generator).
// out[t] = (token, kept). token -1: a NaN or no logit above -inf (the host raises as sampling.py does); -2: a row
// for the host's rule: an infinite top (its float64 path), or a top_k / top_p set that does not fit CHOOSE_CAP.
// One block of 1024 threads a row; every pass over the row is coalesced: the max strided over the threads, the
// weights summed by warps over segments of choose_seg(V) consecutive tokens (a lane's loads 128 bytes apart from
// its neighbours': one cache line a warp load), at most 1024 segments, their sums in float64. Thread 0 finds the
// segment the draw lands in, the block weighs its tokens, thread 0 walks them.
//
// top_k / top_p keep a prefix of the tokens ordered by falling weight, ties by ascending id (the host's stable
// sort), so the prefix's last member (w_last, id_last) describes it: a token is kept iff w > w_last, or w == w_last
// and id <= id_last. It is found among the candidates above a weight threshold, sorted in shared memory.
#define CHOOSE_CAP 4096  // candidates sorted in shared memory (32 KB); engine/cuda/ops.py CHOOSE_CAP
#define CHOOSE_PROBES 4  // weight thresholds one pass over the row weighs
#define CHOOSE_REFINES 6  // passes that may narrow a threshold whose candidates do not fit
#define CHOOSE_MARGIN 1e-3f  // the exponent's slack in surely_below: its product and expf stray ~1e-5 at most
#define CHOOSE_LOADS 8  // loads a thread has in flight in a pass: one block reads a row, so its passes wait on latency

// f(k, row[k]) for k = first, first + step, .. below end, in order, CHOOSE_LOADS loads issued before their tokens
// are handled (a loop of one load at a time took ~55 us a pass over a 248K-token row on an H100).
template <typename F>
__device__ __forceinline__ void for_tokens(const float* __restrict__ row, int first, int end, int step, F&& f) {
    int k = first;
    for (; k + (CHOOSE_LOADS - 1) * step < end; k += CHOOSE_LOADS * step) {
        float v[CHOOSE_LOADS];
#pragma unroll
        for (int i = 0; i < CHOOSE_LOADS; ++i) v[i] = row[k + i * step];
#pragma unroll
        for (int i = 0; i < CHOOSE_LOADS; ++i) f(k + i * step, v[i]);
    }
    for (; k < end; k += step) f(k, row[k]);
}

// Thread 0's passes over shared memory, in order, CHOOSE_LOADS entries loaded ahead (one at a time, a walk over
// the 971 segments of a 248K-token row waited ~20 us on the loads). A weight: a float64 sum, or a candidate's key.
__device__ __forceinline__ double weight_of(double w) { return w; }
__device__ __forceinline__ double weight_of(u64 key) { return __uint_as_float(key >> 32); }

// w[j0 .. j0 + CHOOSE_LOADS) as weights into v, 0 past n: a pass's next entries, loaded before any is added.
template <typename T>
__device__ __forceinline__ void load_ahead(const T* w, int n, int j0, double (&v)[CHOOSE_LOADS]) {
#pragma unroll
    for (int i = 0; i < CHOOSE_LOADS; ++i) v[i] = j0 + i < n ? weight_of(w[j0 + i]) : 0.0;
}

// w[0] + w[1] + .. + w[n - 1], added in that order.
template <typename T>
__device__ double sum_in_order(const T* w, int n) {
    double sum = 0.0;
    for (int j0 = 0; j0 < n; j0 += CHOOSE_LOADS) {
        double v[CHOOSE_LOADS];
        load_ahead(w, n, j0, v);
#pragma unroll
        for (int i = 0; i < CHOOSE_LOADS; ++i) sum += v[i];
    }
    return sum;
}

// The first j whose running sum of w[0..j] reaches `part` of norm (float64, in order, as engine/sampling.py
// _nucleus's cumsum / norm); n where none does.
template <typename T>
__device__ int first_reaching(const T* w, int n, double norm, double part) {
    double sum = 0.0;
    for (int j0 = 0; j0 < n; j0 += CHOOSE_LOADS) {
        double v[CHOOSE_LOADS];
        load_ahead(w, n, j0, v);
#pragma unroll
        for (int i = 0; i < CHOOSE_LOADS; ++i) {
            sum += v[i];
            if (j0 + i < n && sum / norm >= part) return j0 + i;
        }
    }
    return n;
}

// The inverse CDF's walk: the first j of w[0..n) (entries <= 0 skipped) whose weight exceeds what is left of
// target, which keeps the remainder inside it; where rounding leaves the target past them all, the last with
// weight (-1: none has any).
__device__ int walk(const double* w, int n, double& target) {
    int last = -1;
    for (int j0 = 0; j0 < n; j0 += CHOOSE_LOADS) {
        double v[CHOOSE_LOADS];
        load_ahead(w, n, j0, v);
#pragma unroll
        for (int i = 0; i < CHOOSE_LOADS; ++i) {
            if (v[i] <= 0.0) continue;
            last = j0 + i;
            if (target < v[i]) return last;
            target -= v[i];
        }
    }
    return last;
}

// exp((logit - top) / T) in float32 as engine/sampling.py _weights forms it: the division rounds as the host's does
// (a product with 1 / T would not), so ties and cuts fall alike; expf may differ from numpy's exp in the last bit.
__device__ __forceinline__ float choose_weight(float logit, float top, float temperature) {
    return expf((logit - top) / temperature);
}

// Whether a token's weight is surely below exp(floor), with neither the division nor the exp: the passes skip
// such tokens (most of a 248K-token row once a threshold or min_p bounds the weights that count).
__device__ __forceinline__ bool surely_below(float logit, float top, float inv_temp, float floor) {
    return (logit - top) * inv_temp < floor - CHOOSE_MARGIN;
}

// A token's weight in p: 0 after the top_k / top_p set's last member (w_last, id_last) and below min_p (relative to
// the top's weight 1).
__device__ __forceinline__ float kept_weight(float logit, int k, float top, float temperature, float min_p,
                                             float w_last, int id_last) {
    const float w = choose_weight(logit, top, temperature);
    return (w > w_last || (w == w_last && k <= id_last)) && w >= min_p ? w : 0.f;
}

// The block's float64 sum of v, in every thread (scratch: 32 shared doubles).
__device__ double block_sum_f64(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// The block's (top, lowest id, NaN anywhere) over the row's tokens [first, end), in every thread: each thread's first
// maximum (its ids ascend), then the block's.
__device__ __forceinline__ void scan_max(const float* row, int first, int end, float& top, int& at, bool& nan) {
    top = NEG_INF;
    at = 0x7fffffff;
    bool n = false;
    for_tokens(row, first + threadIdx.x, end, blockDim.x, [&](int k, float v) {
        n |= v != v;
        if (v > top) {
            top = v;
            at = k;
        }
    });
    block_argmax(top, at);
    nan = __syncthreads_or(n);
}

// One warp's float64 sum of the kept weights of the row's tokens [first, end) (every lane gets it; a lane's loads
// 128 bytes apart from its neighbours'): tokens surely below exp(floor) skip the division and the exp.
__device__ __forceinline__ double segment_weight(const float* row, int first, int end, float top, float temperature,
                                                 float min_p, float w_last, int id_last, float floor) {
    const float inv_temp = 1.f / temperature;
    double acc = 0.0;
    for_tokens(row, first + (threadIdx.x & 31), end, 32, [&](int k, float logit) {
        if (!surely_below(logit, top, inv_temp, floor))
            acc += kept_weight(logit, k, top, temperature, min_p, w_last, id_last);
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
    return acc;
}

// One pass over the row's tokens [first, end): count[i] and mass[i] (float64) of the tokens weighing >= thr[i]
// (falling, > 0), in every thread, and with `all`, the mass of every token in total (top_p's denominator without
// top_k); found(k, w) for each token of weight >= the last probe.
template <typename F>
__device__ __forceinline__ void weigh_probes(const float* row, int first, int end, float top, float temperature,
                                             const float* thr, bool all, int* count, double* mass, double& total,
                                             double* scratch, F&& found) {
    const float inv_temp = 1.f / temperature, floor = logf(thr[CHOOSE_PROBES - 1]);
    int c[CHOOSE_PROBES] = {};
    double m[CHOOSE_PROBES] = {}, sum = 0.0;
    for_tokens(row, first + threadIdx.x, end, blockDim.x, [&](int k, float logit) {
        if (!all && surely_below(logit, top, inv_temp, floor)) return;
        const float w = choose_weight(logit, top, temperature);
        sum += w;
#pragma unroll
        for (int i = 0; i < CHOOSE_PROBES; ++i) {
            c[i] += w >= thr[i];
            m[i] += w >= thr[i] ? w : 0.f;
        }
        if (w >= thr[CHOOSE_PROBES - 1]) found(k, w);
    });
#pragma unroll
    for (int i = 0; i < CHOOSE_PROBES; ++i) {
        count[i] = (int)block_sum_f64(c[i], scratch);
        mass[i] = block_sum_f64(m[i], scratch);
    }
    if (all) total = block_sum_f64(sum, scratch);
}

// A weight threshold whose candidates (the tokens weighing >= it) hold the top_k / top_p set and number at most
// CHOOSE_CAP: from 1 down 16x at a time as engine/sampling.py _nucleus looks, CHOOSE_PROBES thresholds a pass (2^-e,
// e = 0, 4, .., 148, then 149: every token with a weight); where the first that holds the set has too many (a flat
// row), thresholds between it and the last that does not, five times closer each pass. Returns the candidates'
// count, or -1 where the set itself, or a tie in it, has more than CHOOSE_CAP tokens. total: every token's mass
// (top_p without top_k).
__device__ int find_threshold(const float* row, int V, float top, float temperature, int top_k, double top_p,
                              float& found, double& total, double* scratch) {
    float lo = 0.f, hi = -1.f;  // exponents: 2^-lo does not hold the set (0: none tried yet), 2^-hi has too many
    int lo_count = 0;
    for (int pass = 0, narrowed = 0;; ++pass) {
        float e[CHOOSE_PROBES], thr[CHOOSE_PROBES];
        int count[CHOOSE_PROBES];
        double mass[CHOOSE_PROBES];
#pragma unroll
        for (int i = 0; i < CHOOSE_PROBES; ++i) {
            e[i] = hi < 0.f ? fminf(16.f * pass + 4.f * i, 149.f) : lo + (hi - lo) * (i + 1) / (CHOOSE_PROBES + 1);
            thr[i] = fmaxf(exp2f(-e[i]), __int_as_float(1));  // never 0: a token without weight is no candidate
        }
        weigh_probes(row, 0, V, top, temperature, thr, pass == 0 && top_k == 0, count, mass, total, scratch,
                     [](int, float) {});
        // no weight exceeds the top's 1, so a set holding top_p of the mass has at least top_p * total tokens
        if (top_k == 0 && top_p * total > CHOOSE_CAP) return -1;
        int first = -1;  // the first threshold that holds the set
#pragma unroll
        for (int i = CHOOSE_PROBES - 1; i >= 0; --i)
            if (top_k > 0 ? count[i] >= top_k : mass[i] >= top_p * total) first = i;
        if (first >= 0 && count[first] <= CHOOSE_CAP) {
            found = thr[first];
            return count[first];
        }
        if (first < 0 && e[CHOOSE_PROBES - 1] >= 149.f) {  // every token with a weight, and still short of the set
            found = thr[CHOOSE_PROBES - 1];
            return count[CHOOSE_PROBES - 1] <= CHOOSE_CAP ? count[CHOOSE_PROBES - 1] : -1;
        }
        if (first != 0) {
            const int below = first < 0 ? CHOOSE_PROBES - 1 : first - 1;
            lo = e[below];
            lo_count = count[below];
        }
        if (first >= 0) hi = e[first];
        // lo's candidates short of the set: it holds them all and more
        if (lo_count > CHOOSE_CAP || (hi >= 0.f && ++narrowed > CHOOSE_REFINES)) return -1;
    }
}

// Sorts keys[0..n) falling (n a power of two, at most CHOOSE_CAP), each thread taking pairs of a stage.
__device__ void bitonic_sort_falling(u64* keys, int n) {
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                const int a = 2 * i - (i & (stride - 1)), b = a + stride;  // a's bit `stride` clear
                const u64 ka = keys[a], kb = keys[b];
                if ((ka < kb) == ((a & size) == 0)) {  // blocks with the `size` bit clear fall, the others rise
                    keys[a] = kb;
                    keys[b] = ka;
                }
            }
            __syncthreads();
        }
}

// The top_k / top_p set's last member (w_last, id_last), from the candidates of find_threshold: each packed as a
// key, weight bits high (a nonnegative float orders as its bits) and ~id low, and sorted falling, they run by
// falling weight, ties by ascending id; then cut at top_k, then where the running mass (float64) first reaches top_p
// of the top_k set's mass, or without top_k of every token's, as engine/sampling.py _nucleus cuts. False: the
// candidates do not fit (the host's row).
__device__ bool find_last_kept(const float* row, int V, float top, float temperature, int top_k, double top_p,
                               u64* keys, double* scratch, float& w_last, int& id_last) {
    __shared__ int num;
    __shared__ u64 last;
    float thr;
    double total = 0.0;
    const int count = find_threshold(row, V, top, temperature, top_k, top_p, thr, total, scratch);
    if (count < 0) return false;
    if (threadIdx.x == 0) num = 0;
    __syncthreads();
    const float inv_temp = 1.f / temperature, floor = logf(thr);
    for_tokens(row, threadIdx.x, V, blockDim.x, [&](int k, float logit) {
        if (surely_below(logit, top, inv_temp, floor)) return;
        const float w = choose_weight(logit, top, temperature);
        if (w < thr) return;
        const int at = atomicAdd(&num, 1);  // below count: the same weights met the same test in find_threshold
        if (at < CHOOSE_CAP) keys[at] = (u64)__float_as_uint(w) << 32 | (u32)~k;
    });
    int n2 = 1;
    while (n2 < count) n2 <<= 1;
    for (int j = count + threadIdx.x; j < n2; j += blockDim.x) keys[j] = 0;  // after every candidate
    __syncthreads();
    bitonic_sort_falling(keys, n2);
    if (threadIdx.x == 0) {
        const int n = top_k > 0 ? min(top_k, count) : count;
        // the first whose running mass reaches top_p; without top_p, or where the mass falls short of it (only past
        // rounding: every weighted token's), the n-th
        const int at = top_p < 1.0 ? first_reaching(keys, n, top_k > 0 ? sum_in_order(keys, n) : total, top_p) : n;
        last = keys[min(at, n - 1)];
    }
    __syncthreads();
    w_last = __uint_as_float(last >> 32);
    id_last = (int)~(u32)last;
    return true;
}

// ---- choose_rows' passes spread over a row's blocks (ops.choose_rows with scratch) ----
// One block reading a 248K-token row waits on latency pass after pass (~0.12 ms a sampled row on the H200, bench/
// NOTES.md Z28). choose_top (the max) and choose_weigh (pass 0 of find_threshold with its candidates, or the
// segments' sums) spread those passes over CHOOSE_CHUNKS blocks a row, each a chunk of whole segments; choose_rows
// then reads their parts instead of the row, and draws a top_k / top_p row from its kept set alone. A row the parts
// do not settle (a threshold past pass 0, candidates past CHOOSE_CANDIDATES) takes choose_rows' own passes.
#define CHOOSE_CHUNKS 64
#define CHOOSE_CANDIDATES 16384  // tokens of weight >= 2^-12 (pass 0's lowest probe) kept for choose_rows
#define CHOOSE_STAGE_THREADS 256

struct ChooseParts {  // one row's; engine/cuda/ops.py CHOOSE_PARTS_BYTES
    double mass[CHOOSE_CHUNKS][CHOOSE_PROBES];  // pass 0's masses at 2^0, 2^-4, 2^-8, 2^-12, by chunk
    double all[CHOOSE_CHUNKS];                   // every token's mass (top_p without top_k), by chunk
    double seg_w[1024];                          // the segments' kept weights (neither top_k nor top_p)
    u64 cand[CHOOSE_CANDIDATES];                 // find_last_kept's keys of the tokens of weight >= 2^-12
    float top_v[CHOOSE_CHUNKS];                  // each chunk's max, its lowest id, whether it holds a NaN
    int top_i[CHOOSE_CHUNKS];
    int nan[CHOOSE_CHUNKS];
    int count[CHOOSE_CHUNKS][CHOOSE_PROBES];     // pass 0's counts
    int num_cand;                                // candidates found (past CHOOSE_CANDIDATES: not all kept)
    int pad;
};
#define CHOOSE_PARTS_BYTES 143624
static_assert(sizeof(ChooseParts) == CHOOSE_PARTS_BYTES, "engine/cuda/ops.py mirrors this size");

// Tokens a segment: a multiple of 32, so that at most 1024 segments cover the row (V <= 2^20).
__device__ __forceinline__ int choose_seg(int V) { return 32 * ((V + 32 * 1024 - 1) / (32 * 1024)); }

// Tokens a chunk: whole segments, so that a segment's sum is one block's.
__device__ __forceinline__ int choose_chunk(int V) {
    const int seg = choose_seg(V), num_seg = (V + seg - 1) / seg;
    return seg * ((num_seg + CHOOSE_CHUNKS - 1) / CHOOSE_CHUNKS);
}

// The row's (top, lowest id, NaN anywhere) from its chunks' parts, in every thread.
__device__ __forceinline__ void top_of_parts(const ChooseParts* p, float& top, int& at, bool& nan) {
    top = NEG_INF;
    at = 0x7fffffff;
    bool n = false;
    for (int c = threadIdx.x; c < CHOOSE_CHUNKS; c += blockDim.x) {
        argmax_merge(top, at, p->top_v[c], p->top_i[c]);
        n |= p->nan[c] != 0;
    }
    block_argmax(top, at);
    nan = __syncthreads_or(n);
}

// Grid (T, CHOOSE_CHUNKS): each chunk's max as choose_rows' first pass finds it (a NaN flagged, never the max).
__global__ void __launch_bounds__(CHOOSE_STAGE_THREADS)
choose_top(const float* __restrict__ logits, int V, int ld, ChooseParts* __restrict__ parts) {
    PDL_ENTER();
    const int t = blockIdx.x, c = blockIdx.y, chunk = choose_chunk(V);
    float top;
    int at;
    bool nan;
    scan_max(logits + (i64)t * ld, c * chunk, min(V, (c + 1) * chunk), top, at, nan);
    if (threadIdx.x == 0) {
        ChooseParts* p = parts + t;
        p->top_v[c] = top;
        p->top_i[c] = at;
        p->nan[c] = nan;
        if (c == 0) p->num_cand = 0;  // choose_weigh's blocks count from here
    }
}

// Grid (T, CHOOSE_CHUNKS), after choose_top, for sampled rows: neither top_k nor top_p, the chunk's segments' kept
// weights (min_p's cut alone); else pass 0 of find_threshold over the chunk (counts and masses at its four probes,
// and with top_p alone every token's mass) and the keys of its tokens of weight >= 2^-12.
__global__ void __launch_bounds__(CHOOSE_STAGE_THREADS)
choose_weigh(const float* __restrict__ logits, int V, int ld, float temperature, float min_p, int top_k, double top_p,
             ChooseParts* __restrict__ parts) {
    PDL_ENTER();
    __shared__ u64 keys[CHOOSE_CAP];
    __shared__ double scratch[32];
    __shared__ int num, base;
    const int t = blockIdx.x, c = blockIdx.y, chunk = choose_chunk(V), seg = choose_seg(V);
    const int begin = c * chunk, end = min(V, begin + chunk);
    ChooseParts* p = parts + t;
    const float* row = logits + (i64)t * ld;
    float top;
    int at;
    bool nan;
    top_of_parts(p, top, at, nan);
    if (nan || top == NEG_INF || top == -NEG_INF) return;  // choose_rows decides such a row from the parts alone
    if (top_k == 0 && top_p >= 1.0) {
        for (int b = begin + (threadIdx.x >> 5) * seg; b < end; b += blockDim.x / 32 * seg) {
            const double w = segment_weight(row, b, min(end, b + seg), top, temperature, min_p, 0.f, 0x7fffffff,
                                            logf(min_p));
            if ((threadIdx.x & 31) == 0) p->seg_w[b / seg] = w;
        }
        return;
    }
    if (threadIdx.x == 0) num = 0;
    __syncthreads();
    float thr[CHOOSE_PROBES];
#pragma unroll
    for (int i = 0; i < CHOOSE_PROBES; ++i) thr[i] = exp2f(-4.f * i);  // find_threshold's pass 0
    int count[CHOOSE_PROBES];
    double mass[CHOOSE_PROBES], total = 0.0;
    weigh_probes(row, begin, end, top, temperature, thr, top_k == 0, count, mass, total, scratch, [&](int k, float w) {
        const int j = atomicAdd(&num, 1);
        if (j < CHOOSE_CAP) keys[j] = (u64)__float_as_uint(w) << 32 | (u32)~k;
    });
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < CHOOSE_PROBES; ++i) {
            p->count[c][i] = count[i];
            p->mass[c][i] = mass[i];
        }
        p->all[c] = total;
        // a block past the shared cap leaves the list incomplete: counted past CHOOSE_CANDIDATES, never used
        base = num > CHOOSE_CAP ? atomicAdd(&p->num_cand, CHOOSE_CANDIDATES + 1) : atomicAdd(&p->num_cand, num);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < min(num, CHOOSE_CAP); j += blockDim.x)
        if (base + j < CHOOSE_CANDIDATES) p->cand[base + j] = keys[j];
}

// The row's choice from choose_weigh's parts where they settle it (top_k / top_p: pass 0 of find_threshold holds
// the set in at most CHOOSE_CAP candidates, all in the list): the candidates sorted as find_last_kept sorts them,
// cut, then the kept tokens by ascending id for the keep test and the inverse CDF's walk (the host's order).
// False: choose_rows' own passes decide the row.
__device__ bool choose_kept_of_parts(const ChooseParts* p, int x, const double* uniforms, float min_p, int top_k,
                                     double top_p, u64* keys, i32* out) {
    __shared__ int first, num, kept;
    __shared__ double total;
    if (threadIdx.x < 32) {  // warp 0 sums the chunks' parts, the same way every run
        int count[CHOOSE_PROBES] = {};
        double mass[CHOOSE_PROBES] = {}, all = 0.0;
        for (int c = threadIdx.x; c < CHOOSE_CHUNKS; c += 32) {
#pragma unroll
            for (int i = 0; i < CHOOSE_PROBES; ++i) {
                count[i] += p->count[c][i];
                mass[i] += p->mass[c][i];
            }
            all += p->all[c];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int i = 0; i < CHOOSE_PROBES; ++i) {
                count[i] += __shfl_xor_sync(FULL_MASK, count[i], o);
                mass[i] += __shfl_xor_sync(FULL_MASK, mass[i], o);
            }
            all += __shfl_xor_sync(FULL_MASK, all, o);
        }
        if (threadIdx.x == 0) {
            first = -1;
            if (!(top_k == 0 && top_p * all > CHOOSE_CAP)) {
#pragma unroll
                for (int i = CHOOSE_PROBES - 1; i >= 0; --i)
                    if (top_k > 0 ? count[i] >= top_k : mass[i] >= top_p * all) first = i;
            }
            if (first >= 0 && (count[first] > CHOOSE_CAP || p->num_cand > CHOOSE_CANDIDATES)) first = -1;
            total = all;
            num = 0;
        }
    }
    __syncthreads();
    if (first < 0) return false;
    const float thr = exp2f(-4.f * first);
    const int listed = p->num_cand;
    for (int j = threadIdx.x; j < listed; j += blockDim.x) {
        const u64 key = p->cand[j];
        if (__uint_as_float(key >> 32) < thr) continue;
        const int at = atomicAdd(&num, 1);  // below count[first] <= CHOOSE_CAP: the same weights met the same test
        if (at < CHOOSE_CAP) keys[at] = key;
    }
    __syncthreads();
    const int n = min(num, CHOOSE_CAP);
    int n2 = 1;
    while (n2 < n) n2 <<= 1;
    for (int j = n + threadIdx.x; j < n2; j += blockDim.x) keys[j] = 0;
    __syncthreads();
    bitonic_sort_falling(keys, n2);
    if (threadIdx.x == 0) {
        const int nk = top_k > 0 ? min(top_k, n) : n;
        const int at = top_p < 1.0 ? first_reaching(keys, nk, top_k > 0 ? sum_in_order(keys, nk) : total, top_p) : nk;
        kept = min(at, nk - 1) + 1;
    }
    __syncthreads();
    // the kept prefix by ascending id: each key's halves swapped (~id high, the weight low) and sorted falling
    const int m = kept;
    int m2 = 1;
    while (m2 < m) m2 <<= 1;
    for (int j = threadIdx.x; j < m2; j += blockDim.x) keys[j] = j < m ? keys[j] << 32 | keys[j] >> 32 : 0;
    __syncthreads();
    bitonic_sort_falling(keys, m2);
    if (threadIdx.x != 0) return true;
    double sum = 0.0, wx = 0.0;
    for (int j = 0; j < m; ++j) {
        const float w = __uint_as_float((u32)keys[j]);
        const double wk = w >= min_p ? w : 0.f;
        sum += wk;
        if ((int)~(u32)(keys[j] >> 32) == x) wx = wk;
    }
    const double u1 = uniforms[0], u2 = uniforms[1];
    if (x >= 0 && (u1 * sum < wx || sum - wx <= 0.0)) {  // kept (or, through rounding, nothing else has mass)
        out[0] = x;
        out[1] = 1;
        return true;
    }
    double target = (x >= 0 ? u2 : u1) * (sum - wx);
    int last = -1;
    for (int j = 0; j < m; ++j) {  // walk's rule over the kept tokens without the draft
        const float w = __uint_as_float((u32)keys[j]);
        const int id = (int)~(u32)(keys[j] >> 32);
        if (w < min_p || w <= 0.f || id == x) continue;
        last = id;
        if (target < w) break;
        target -= w;
    }
    out[0] = last;
    out[1] = 0;
    return true;
}

__global__ void __launch_bounds__(1024)
choose_rows(const float* __restrict__ logits, int V, int ld, const i32* __restrict__ drafts,
            const double* __restrict__ uniforms, float temperature, float min_p, int top_k, double top_p, int greedy,
            const ChooseParts* __restrict__ parts, i32* __restrict__ out) {
    PDL_ENTER();
    __shared__ union {
        u64 keys[CHOOSE_CAP];  // the top_k / top_p candidates, done with before the segments are summed
        double seg_w[1024];
    } sh;
    __shared__ double scratch[32];
    const int t = blockIdx.x, x = drafts[t];
    const float* row = logits + (i64)t * ld;
    const ChooseParts* p = parts ? parts + t : nullptr;  // choose_top's and choose_weigh's, or none: every pass here
    float top;
    int at;
    bool nan;
    if (p)
        top_of_parts(p, top, at, nan);
    else
        scan_max(row, 0, V, top, at, nan);
    const bool bad = nan || top == NEG_INF;
    if (bad || greedy || top == -NEG_INF) {
        if (threadIdx.x == 0) {
            out[2 * t] = bad ? -1 : (greedy ? at : -2);
            out[2 * t + 1] = !bad && greedy && at == x;
        }
        return;
    }
    const bool cut = top_k > 0 || top_p < 1.0;
    if (p && cut && choose_kept_of_parts(p, x, uniforms + 2 * t, min_p, top_k, top_p, sh.keys, out + 2 * t)) return;
    float w_last = 0.f;
    int id_last = 0x7fffffff;  // without top_k and top_p, every token
    if (cut && !find_last_kept(row, V, top, temperature, top_k, top_p, sh.keys, scratch, w_last, id_last)) {
        if (threadIdx.x == 0) {
            out[2 * t] = -2;  // the set does not fit: the host's row
            out[2 * t + 1] = 0;
        }
        return;
    }
    // tokens whose weight is surely 0 (after the set's last member, or below min_p) skip the division and the exp
    const float floor = logf(fmaxf(w_last, min_p));
    const int seg = choose_seg(V), num_seg = (V + seg - 1) / seg;
    if (p && !cut) {  // choose_weigh summed the segments
        for (int s = threadIdx.x; s < num_seg; s += blockDim.x) sh.seg_w[s] = p->seg_w[s];
    } else {
        for (int s = threadIdx.x >> 5; s < num_seg; s += blockDim.x >> 5) {
            const double w = segment_weight(row, s * seg, min(V, (s + 1) * seg), top, temperature, min_p, w_last,
                                            id_last, floor);
            if ((threadIdx.x & 31) == 0) sh.seg_w[s] = w;
        }
    }
    __syncthreads();
    // thread 0: the keep test, then the segment the draw lands in (a walk over shared memory)
    __shared__ int pick;  // the segment (>= 0), or -1 - the token decided already
    __shared__ double rest;  // the target's remainder inside the segment
    if (threadIdx.x == 0) {
        const double total = sum_in_order(sh.seg_w, num_seg);
        const float wx = x >= 0 ? kept_weight(row[x], x, top, temperature, min_p, w_last, id_last) : 0.f;
        const double u1 = uniforms[2 * t], u2 = uniforms[2 * t + 1];
        pick = -1 - x;  // kept (or, through rounding, nothing else has mass)
        if (!(x >= 0 && (u1 * total < wx || total - wx <= 0.0))) {
            double target = (x >= 0 ? u2 : u1) * (total - wx);
            if (x >= 0) sh.seg_w[x / seg] -= wx;  // p without the draft
            pick = walk(sh.seg_w, num_seg, target);
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
        sh.seg_w[threadIdx.x] = k == x ? 0.0 : (double)kept_weight(row[k], k, top, temperature, min_p, w_last, id_last);
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    double target = rest;
    out[2 * t] = b0 + walk(sh.seg_w, e0 - b0, target);  // the segment has mass: walk finds a token
    out[2 * t + 1] = 0;
}
