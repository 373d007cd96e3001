// One verify row at temperature > 0, on the consumer warps of one SM (engine/cuda/megakernel/sampling.py is the
// specification: candidates, kept_weights, sample_row, uniform).
//
// s = penalised logit / temperature; candidates are the tokens with s >= max - MK_SAMPLE_CUTOFF, in token order,
// at most MK_CAND_MAX of them (the largest, lower token first on ties, found by a radix select when more qualify);
// they are sorted by (probability desc, token asc) for top_k / top_p, min_p is applied, and the draft is kept with
// probability p(draft) or the token is drawn from p without it, by inverse CDF in token order.
#pragma once
#include "penalties.cuh"

struct SampleScratch {  // laid out in the scratch area
    u64 key[MK_CAND_MAX];    // sort keys: ~bits(w) << 32 | candidate position
    int idx[MK_CAND_MAX];    // candidates' tokens, ascending
    float w[MK_CAND_MAX];    // e^(s - max)
    float kw[MK_CAND_MAX];   // kept weights in token order (w or 0), summed in double
    int hist[256];
    float red_f[32];
    double red_d[32];
    int red_i[32];
    int result[4];
};

__device__ __forceinline__ u32 order_key(float v) {  // larger float -> larger unsigned key
    const u32 u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ float block_max_c(float v, SampleScratch& s) {
    v = warp_max(v);
    if ((threadIdx.x & 31) == 0) s.red_f[cwarp()] = v;
    consumers_sync();
    float r = NEG_INF;
    for (int w = 0; w < MK_CONSUMER_WARPS; ++w) r = fmaxf(r, s.red_f[w]);
    consumers_sync();
    return r;
}

__device__ double block_sum_d(double v, SampleScratch& s) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    if ((threadIdx.x & 31) == 0) s.red_d[cwarp()] = v;
    consumers_sync();
    double r = 0.0;
    for (int w = 0; w < MK_CONSUMER_WARPS; ++w) r += s.red_d[w];
    consumers_sync();
    return r;
}

// Exclusive prefix over the consumer threads, in thread order (returns the total through `total`).
__device__ int block_scan_i(int v, int& total, SampleScratch& s) {
    const int lane = threadIdx.x & 31;
    int inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(FULL_MASK, inc, o);
        if (lane >= o) inc += n;
    }
    if (lane == 31) s.red_i[cwarp()] = inc;
    consumers_sync();
    int before = 0;
    total = 0;
    for (int w = 0; w < MK_CONSUMER_WARPS; ++w) {
        if (w < cwarp()) before += s.red_i[w];
        total += s.red_i[w];
    }
    consumers_sync();
    return before + inc - v;
}

struct RowSampler {
    const Globals& g;
    const float* row;
    Penalties pen;
    float inv_temp, top_p, min_p;
    int top_k, V;

    __device__ float score(int v) const { return pen.apply(g, v, ld_cg(row + v)) * inv_temp; }

    // The key of the k-th largest score (radix select over the order-preserving keys, 8 bits a pass).
    __device__ __noinline__ u32 kth_key(int k, SampleScratch& s) const {
        u32 prefix = 0, mask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = ctid(); b < 256; b += MK_CONSUMER_THREADS) s.hist[b] = 0;
            consumers_sync();
            for (int v = ctid(); v < V; v += MK_CONSUMER_THREADS) {
                const u32 key = order_key(score(v));
                if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255], 1);
            }
            consumers_sync();
            if (ctid() == 0) {
                int b = 255;
                for (; b > 0 && s.hist[b] < k; --b) k -= s.hist[b];
                s.result[0] = b;
                s.result[1] = k;
            }
            consumers_sync();
            prefix |= (u32)s.result[0] << shift;
            mask |= 255u << shift;
            k = s.result[1];
            consumers_sync();
        }
        return prefix;
    }

    // Candidates in token order into s.idx / s.w; returns their number (clipped: more qualified).
    __device__ __noinline__ int collect(float m, SampleScratch& s, bool& clipped) const {
        const float floor_s = m - MK_SAMPLE_CUTOFF;
        const int per = (V + MK_CONSUMER_THREADS - 1) / MK_CONSUMER_THREADS, b0 = ctid() * per, b1 = min(V, b0 + per);
        int mine = 0;
        for (int v = b0; v < b1; ++v) mine += score(v) >= floor_s;
        int total;
        int at = block_scan_i(mine, total, s);
        clipped = total > MK_CAND_MAX;
        u32 thr = order_key(floor_s);
        int ties_left = MK_CAND_MAX;  // without clipping every qualifying token is taken
        if (clipped) {
            thr = kth_key(MK_CAND_MAX, s);
            int above = 0, ties = 0;
            for (int v = b0; v < b1; ++v) {
                const u32 key = order_key(score(v));
                above += key > thr;
                ties += key == thr;
            }
            int above_total, ties_total;
            at = block_scan_i(above, above_total, s);
            const int ties_before = block_scan_i(ties, ties_total, s);
            ties_left = MK_CAND_MAX - above_total - ties_before;  // this thread's share of the ties, in token order
            at += min(ties_before, MK_CAND_MAX - above_total);
        }
        for (int v = b0; v < b1; ++v) {
            const float sv = score(v);
            const u32 key = order_key(sv);
            const bool take = clipped ? key > thr || (key == thr && ties_left-- > 0) : sv >= floor_s;
            if (take && at < MK_CAND_MAX) {
                s.idx[at] = v;
                s.w[at] = expf(sv - m);
                ++at;
            }
        }
        consumers_sync();
        return clipped ? MK_CAND_MAX : total;
    }

    // Bitonic sort of s.key[0, n) ascending (padded to a power of two with the largest key).
    __device__ __noinline__ static void sort_keys(int n, SampleScratch& s) {
        int size = 1;
        while (size < n) size <<= 1;
        for (int i = n + ctid(); i < size; i += MK_CONSUMER_THREADS) s.key[i] = ~0ull;
        consumers_sync();
        for (int k = 2; k <= size; k <<= 1)
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = ctid(); i < size; i += MK_CONSUMER_THREADS) {
                    const int partner = i ^ j;
                    if (partner > i) {
                        const bool up = (i & k) == 0;
                        const u64 a = s.key[i], b = s.key[partner];
                        if ((a > b) == up) {
                            s.key[i] = b;
                            s.key[partner] = a;
                        }
                    }
                }
                consumers_sync();
            }
    }

    // Weights after top_k, top_p and min_p, in token order (zero where cut), into s.kw; returns their sum.
    __device__ __noinline__ double kept(int n, SampleScratch& s) const {
        for (int i = ctid(); i < n; i += MK_CONSUMER_THREADS)
            s.key[i] = ((u64)(~__float_as_uint(s.w[i])) << 32) | (u32)i;
        consumers_sync();
        sort_keys(n, s);
        int num_keep = top_k > 0 ? min(top_k, n) : n;
        if (top_p < 1.f && ctid() == 0) {  // the smallest prefix (by probability) whose mass reaches top_p
            double total = 0.0, cum = 0.0;
            for (int i = 0; i < num_keep; ++i) total += s.w[(u32)s.key[i]];
            int i = 0;
            for (; i < num_keep; ++i) {
                cum += s.w[(u32)s.key[i]] / total;
                if (cum >= top_p) break;
            }
            s.result[0] = min(num_keep, i + 1);
        }
        consumers_sync();
        if (top_p < 1.f) num_keep = s.result[0];
        const float w_max = s.w[(u32)s.key[0]];
        for (int i = ctid(); i < n; i += MK_CONSUMER_THREADS) s.kw[i] = 0.f;
        consumers_sync();
        for (int r = ctid(); r < num_keep; r += MK_CONSUMER_THREADS) {
            const int pos = (int)(u32)s.key[r];
            if (!(min_p > 0.f) || s.w[pos] >= min_p * w_max) s.kw[pos] = s.w[pos];
        }
        consumers_sync();
        double part = 0.0;
        for (int i = ctid(); i < n; i += MK_CONSUMER_THREADS) part += s.kw[i];
        return block_sum_d(part, s);
    }
};

__device__ __forceinline__ u64 splitmix64_mk(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// U[0, 1) for (seed, position, purpose): sampling.uniform.
__device__ __forceinline__ double uniform_mk(u64 seed, int position, int purpose) {
    const u64 r = splitmix64_mk(seed ^ splitmix64_mk(((u64)position << 2) | (u64)purpose));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

// Inverse CDF in token order over the kept weights (s.kw, n of them, summing to total): sampling.draw_index.
__device__ int draw_position(int n, double total, double u, SampleScratch& s) {
    if (ctid() == 0) {
        const double target = u * total;
        double cum = 0.0;
        int index = n - 1;
        for (int i = 0; i < n; ++i) {
            cum += s.kw[i];
            if (cum > target) {
                index = i;
                break;
            }
        }
        while (index > 0 && s.kw[index] == 0.f) --index;
        s.result[2] = index;
    }
    consumers_sync();
    return s.result[2];
}

// Row t of the verify pass at temperature > 0: returns the emitted token; *kept: the draft (>= 0) was accepted.
__device__ __noinline__ int sample_row(const Globals& g, int t, int draft, int position, bool& kept, bool& clipped, float* scratch) {
    SampleScratch& s = *reinterpret_cast<SampleScratch*>(scratch);
    const RowSampler rs{g, g.logits + (i64)t * g.vocab, Penalties::for_row(g, t), 1.f / ctl_getf(g, CTL_TEMPERATURE),
                        ctl_getf(g, CTL_TOP_P), ctl_getf(g, CTL_MIN_P), ctl_get(g, CTL_TOP_K), g.vocab};
    const u64 seed = ((u64)(u32)ctl_get(g, CTL_SEED_HI) << 32) | (u32)ctl_get(g, CTL_SEED_LO);
    float m = NEG_INF;
    for (int v = ctid(); v < rs.V; v += MK_CONSUMER_THREADS) m = fmaxf(m, rs.score(v));
    m = block_max_c(m, s);
    const int n = rs.collect(m, s, clipped);
    double total = rs.kept(n, s);
    kept = false;
    if (draft >= 0) {
        if (ctid() == 0) {  // the draft's position among the candidates (they are in token order)
            int lo = 0, hi = n;
            while (lo < hi) {
                const int mid = (lo + hi) / 2;
                if (s.idx[mid] < draft) lo = mid + 1; else hi = mid;
            }
            s.result[3] = lo < n && s.idx[lo] == draft ? lo : -1;
        }
        consumers_sync();
        const int pos = s.result[3];
        const double p_x = pos >= 0 ? s.kw[pos] / total : 0.0;
        if (uniform_mk(seed, position, 0) < p_x) {
            kept = true;
            return draft;
        }
        consumers_sync();
        if (pos >= 0 && ctid() == 0) s.kw[pos] = 0.f;
        consumers_sync();
        double part = 0.0;
        for (int i = ctid(); i < n; i += MK_CONSUMER_THREADS) part += s.kw[i];
        total = block_sum_d(part, s);
        if (total <= 0.0) {  // only rounding when p is (almost) one-hot at the draft: keep it
            kept = true;
            return draft;
        }
    }
    return s.idx[draw_position(n, total, uniform_mk(seed, position, 1), s)];
}
