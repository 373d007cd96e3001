// The producers' modes, the two-level int8 form of a superblock of activations and the f16 pair of its sums,
// shared by the producers (kernels/act.cu) and the matmul that computes its own activations (kernels/mmvq_i8b.cu),
// so both turn the same value into the same bytes.
#pragma once
#include "common.cuh"

#define ACT_PLAIN 0     // v = x
#define ACT_RMSNORM 1   // v = x / rms(x row) * w
#define ACT_SWIGLU 2    // v = silu(x) * x2
#define ACT_GATEDNORM 3 // v = x / rms(x head) * w[d] * silu(x2), heads of `head` values

// A superblock's two levels from its largest |v| (mx): s = mx / 127, q_hi = rint(v / s), q_lo = rint((v - s q_hi)
// / s_lo) with s_lo = s / 254. Below 1e-30 (and for zeros) both levels are 0, so 254 / s cannot overflow.
struct Act8Levels {
    float s, s_lo, inv, inv_lo;
    __device__ __forceinline__ explicit Act8Levels(float mx) {
        const bool live = mx >= 1e-30f;
        s = live ? mx / 127.f : 0.f;
        s_lo = s / 254.f;
        inv = live ? 127.f / mx : 0.f;
        inv_lo = live ? 254.f / s : 0.f;
    }
    // v's levels (as floats holding integers in [-127, 127]); returns what the int8 mma sees: q_hi s + q_lo s_lo
    __device__ __forceinline__ float quantize(float v, float& qh, float& ql) const {
        qh = fminf(fmaxf(rintf(v * inv), -127.f), 127.f);
        ql = fminf(fmaxf(rintf(fmaf(-qh, s, v) * inv_lo), -127.f), 127.f);
        return fmaf(ql, s_lo, qh * s);
    }
};

// v as an f16 and its rounding residue (the sub-block sums' hi + lo pair).
__device__ __forceinline__ void store_f16_pair(f16* hi, f16* lo, i64 i, float v) {
    const f16 h = f32_to_f16(v);
    hi[i] = h;
    lo[i] = f32_to_f16(v - f16_to_f32(h));
}
