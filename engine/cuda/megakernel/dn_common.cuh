// The gated delta rule of one value head held in registers, shared by OP_DN_RULE and OP_DN_COMMIT
// (engine/reference/ops.py: gated_delta_rule; VM: solvers.replay).
//
// State S [Dk, Dv] of head h: lane holds rows lane + 32 i (i < KL), consumer warp w columns w * COLS + j (j < COLS),
// so Dk = 32 KL and Dv = MK_CONSUMER_WARPS * COLS. A step with key k, value v, gate g and beta:
//   S = e^g S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
#pragma once
#include "mk_common.cuh"

template <int KL, int COLS>
struct DnHead {
    static constexpr int ROWS_PER_LANE = KL, COLS_PER_WARP = COLS;
    float s[KL][COLS];

    __device__ __forceinline__ static const float* at(const float* ssm, int h, int row, int col, int dk, int dv) {
        return ssm + ((i64)h * dk + row) * dv + col;
    }
    __device__ void load(const float* ssm, int h) {
        const int lane = threadIdx.x & 31, col0 = cwarp() * COLS;
#pragma unroll
        for (int i = 0; i < KL; ++i)
#pragma unroll
            for (int j = 0; j < COLS; ++j) s[i][j] = ld_cg(at(ssm, h, lane + 32 * i, col0 + j, 32 * KL, 8 * COLS));
    }
    __device__ void store(float* ssm, int h) const {
        const int lane = threadIdx.x & 31, col0 = cwarp() * COLS;
#pragma unroll
        for (int i = 0; i < KL; ++i)
#pragma unroll
            for (int j = 0; j < COLS; ++j)
                *const_cast<float*>(at(ssm, h, lane + 32 * i, col0 + j, 32 * KL, 8 * COLS)) = s[i][j];
    }
    // One step; k: this lane's rows, v: this warp's columns.
    __device__ void update(const float (&k)[KL], const float (&v)[COLS], float g, float beta) {
        const float decay = expf(g);
        float pred[COLS];
#pragma unroll
        for (int j = 0; j < COLS; ++j) {
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < KL; ++i) {
                s[i][j] *= decay;
                acc += k[i] * s[i][j];
            }
            pred[j] = acc;
        }
        warp_sum_n<COLS>(pred);
#pragma unroll
        for (int j = 0; j < COLS; ++j) {
            const float u = (v[j] - pred[j]) * beta;
#pragma unroll
            for (int i = 0; i < KL; ++i) s[i][j] += k[i] * u;
        }
    }
    __device__ void output(const float (&q)[KL], float (&o)[COLS]) const {
#pragma unroll
        for (int j = 0; j < COLS; ++j) {
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < KL; ++i) acc += q[i] * s[i][j];
            o[j] = acc;
        }
        warp_sum_n<COLS>(o);
    }
};

// Apply the last pass's first n_prev rows (saved keys, values, gates) to head h's state.
template <int KL, int COLS>
__device__ void dn_replay(const Globals& g, const LayerRefs& L, int h, int n_prev, DnHead<KL, COLS>& st) {
    const int lane = threadIdx.x & 31, col0 = cwarp() * COLS, hv = g.ssm_v_heads, dk = 32 * KL, dv = 8 * COLS;
    const float* rk = static_cast<const float*>(L.s[LS_RK]);
    const float* rv = static_cast<const float*>(L.s[LS_RV]);
    const float* rg = static_cast<const float*>(L.s[LS_RG]);
    const float* rb = static_cast<const float*>(L.s[LS_RB]);
    for (int t = 0; t < n_prev; ++t) {
        float k[KL], v[COLS];
#pragma unroll
        for (int i = 0; i < KL; ++i) k[i] = ld_cg(rk + ((i64)t * hv + h) * dk + lane + 32 * i);
#pragma unroll
        for (int j = 0; j < COLS; ++j) v[j] = ld_cg(rv + ((i64)t * hv + h) * dv + col0 + j);
        st.update(k, v, ld_cg(rg + (i64)t * hv + h), ld_cg(rb + (i64)t * hv + h));
    }
}

// Head sizes compiled in: MK_DN_DK / MK_DN_DV are set by build.py to the model's (Dk = 32 KL, Dv = 8 COLS);
// without them, Qwen3.8's 128 x 128 and the tiny test models' 64 x 64.
#if defined(MK_DN_DK) && defined(MK_DN_DV)
#define MK_DN_SIZES(X) X(MK_DN_DK, MK_DN_DV)
#else
#define MK_DN_SIZES(X) X(64, 64) X(128, 128)
#endif

// The one switch from the run-time head sizes to a template instance: f(DnHead tag) for the sizes compiled in.
template <class F>
__device__ bool dn_dispatch(const Globals& g, F&& f) {
#define MK_DN_CASE(DK, DV)                                 \
    if (g.ssm_dk == (DK) && g.ssm_dv == (DV)) {            \
        static_assert((DK) % 32 == 0 && (DV) % 8 == 0, ""); \
        f(DnHead<(DK) / 32, (DV) / 8>{});                  \
        return true;                                       \
    }
    MK_DN_SIZES(MK_DN_CASE)
#undef MK_DN_CASE
    if (ctid() == 0) mk_fail(g, ERR_BAD_SHAPE, blockIdx.x, -1, g.ssm_dk, g.ssm_dv, 0, 0);
    return false;
}
