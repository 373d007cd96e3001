// Penalised logits as engine/sampling.py apply_penalties computes them (VM: sampling.penalize): repetition over the
// prompt and everything generated, frequency and presence over what was generated, row t's history extended by
// the drafts 1..t this cycle emits before it.
#pragma once
#include "mk_common.cuh"

struct Penalties {
    bool on;
    float repetition, frequency, presence;
    int extra[MK_MAX_ROWS];
    int num_extra;

    __device__ static Penalties for_row(const Globals& g, int t) {
        Penalties p;
        p.on = ctl_get(g, CTL_PENALTIES) != 0;
        p.repetition = ctl_getf(g, CTL_REP_PENALTY);
        p.frequency = ctl_getf(g, CTL_FREQ_PENALTY);
        p.presence = ctl_getf(g, CTL_PRES_PENALTY);
        p.num_extra = t;
        for (int j = 0; j < MK_MAX_ROWS; ++j) p.extra[j] = j < t ? ctl_get(g, CTL_IDS + 1 + j) : -1;
        return p;
    }

    __device__ float apply(const Globals& g, int token, float z) const {
        if (!on) return z;
        int count = g.counts[token];
        for (int j = 0; j < num_extra; ++j) count += extra[j] == token;
        if (repetition != 1.f && (g.seen[token] || count > 0)) z = z > 0.f ? z / repetition : z * repetition;
        if (frequency != 0.f || presence != 0.f)
            z = (float)((double)z - ((double)frequency * count + (double)presence * (count > 0 ? 1.0 : 0.0)));
        return z;
    }
};

// The larger value wins; the lower token on a tie (numpy's argmax).
__device__ __forceinline__ void argmax_merge(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

// Column t's (t < cols) maximum over out[r * 8 + t], r < n (token base + r), merged into keeper thread t's (v, i):
// every consumer thread takes a slice of the rows, the warps reduce theirs, and the keeper merges the warps' in
// warp order (argmax_merge is commutative and associative: the order changes nothing). slots: 2 x MK_MAX_ROWS x
// MK_CONSUMER_WARPS words of free shared scratch; the caller syncs before slots or out are written again. A
// keeper's serial walk of a 256-row batch took ~10 us of each LM_HEAD batch (bench/MEGAKERNEL.md round 7).
__device__ __forceinline__ void consumers_argmax(const float* out, int n, int cols, int base, float* slots,
                                                 float& v, int& i) {
    int* slot_i = reinterpret_cast<int*>(slots + MK_MAX_ROWS * MK_CONSUMER_WARPS);
    for (int t = 0; t < cols; ++t) {
        float bv = NEG_INF;
        int bi = 0x7fffffff;
        for (int r = ctid(); r < n; r += MK_CONSUMER_THREADS) argmax_merge(bv, bi, out[r * 8 + t], base + r);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(FULL_MASK, bv, o);
            const int i2 = __shfl_xor_sync(FULL_MASK, bi, o);
            argmax_merge(bv, bi, v2, i2);
        }
        if ((threadIdx.x & 31) == 0) {
            slots[t * MK_CONSUMER_WARPS + cwarp()] = bv;
            slot_i[t * MK_CONSUMER_WARPS + cwarp()] = bi;
        }
    }
    consumers_sync();
    if (ctid() < cols)
        for (int w = 0; w < MK_CONSUMER_WARPS; ++w)
            argmax_merge(v, i, slots[ctid() * MK_CONSUMER_WARPS + w], slot_i[ctid() * MK_CONSUMER_WARPS + w]);
}
