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
