// The gated delta rule of one value head held in registers, shared by OP_DN_RULE and OP_DN_COMMIT
// (engine/reference/ops.py: gated_delta_rule; VM: solvers.replay).
//
// State S [Dk, Dv] of head h: consumer warp w holds columns w * COLS .. w * COLS + COLS - 1 (Dk = 32 KL,
// Dv = MK_CONSUMER_WARPS * COLS); within the warp, lane = rg * CG + cg holds the 4 columns of column group cg
// (CG = COLS / 4 groups) in rows rg, rg + RG, ... (RG = 32 / CG row groups, RPT = Dk / RG rows each). So a state
// row's 4 x CG columns are one contiguous run a warp reads and writes with 16-byte accesses, and a column's sum
// over rows (S^T k, S^T q) is the thread's own RPT terms plus log2(RG) shuffles. A step with key k, value v, gate
// g and beta:
//   S = e^g S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
#pragma once
#include "mk_common.cuh"

template <int KL, int COLS>
struct DnHead {
    static constexpr int ROWS_PER_LANE = KL, COLS_PER_WARP = COLS;
    static constexpr int CG = COLS / 4, RG = 32 / CG, RPT = 32 * KL / RG, DK = 32 * KL, DV = MK_CONSUMER_WARPS * COLS;
    static_assert(COLS % 4 == 0 && 32 % CG == 0 && (32 * KL) % RG == 0, "Dv a multiple of 32, Dk of the row groups");
    float s[RPT][4];

    __device__ __forceinline__ static int cg() { return (threadIdx.x & 31) % CG; }
    __device__ __forceinline__ static int rg() { return (threadIdx.x & 31) / CG; }
    __device__ __forceinline__ static int row(int i) { return rg() + RG * i; }   // the thread's i-th state row
    __device__ __forceinline__ static int col0() { return cwarp() * COLS + 4 * cg(); }  // its first column
    // Sum over the row groups (the lanes sharing this thread's column group); every such lane gets it.
    template <int N>
    __device__ __forceinline__ static void rows_sum(float (&v)[N]) {
#pragma unroll
        for (int o = CG; o < 32; o <<= 1)
#pragma unroll
            for (int j = 0; j < N; ++j) v[j] += __shfl_xor_sync(FULL_MASK, v[j], o);
    }
    __device__ __forceinline__ static float rows_sum(float v) {
        float a[1] = {v};
        rows_sum(a);
        return a[0];
    }

    __device__ __forceinline__ static const float* at(const float* ssm, int h, int r) {
        return ssm + ((i64)h * DK + r) * DV + col0();
    }
    __device__ void load(const float* ssm, int h) {
#pragma unroll
        for (int i = 0; i < RPT; ++i) ld_cg_f4(at(ssm, h, row(i)), s[i]);
    }
    __device__ void store(float* ssm, int h) const {
#pragma unroll
        for (int i = 0; i < RPT; ++i)
            *reinterpret_cast<float4*>(const_cast<float*>(at(ssm, h, row(i)))) = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
    }
    // One step; k: this thread's rows, v: its 4 columns.
    __device__ void update(const float (&k)[RPT], const float (&v)[4], float g, float beta) {
        const float decay = expf(g);
        float pred[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                s[i][j] *= decay;
                acc += k[i] * s[i][j];
            }
            pred[j] = acc;
        }
        rows_sum(pred);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float u = (v[j] - pred[j]) * beta;
#pragma unroll
            for (int i = 0; i < RPT; ++i) s[i][j] += k[i] * u;
        }
    }
    __device__ void output(const float (&q)[RPT], float (&o)[4]) const {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < RPT; ++i) acc += q[i] * s[i][j];
            o[j] = acc;
        }
        rows_sum(o);
    }
};

// Apply the last pass's first n_prev rows (saved keys, values, gates) to head h's state.
template <int KL, int COLS>
__device__ void dn_replay(const Globals& g, const LayerRefs& L, int h, int n_prev, DnHead<KL, COLS>& st) {
    using H = DnHead<KL, COLS>;
    const int hv = g.ssm_v_heads;
    const float* rk = static_cast<const float*>(L.s[LS_RK]);
    const float* rv = static_cast<const float*>(L.s[LS_RV]);
    const float* rgate = static_cast<const float*>(L.s[LS_RG]);
    const float* rb = static_cast<const float*>(L.s[LS_RB]);
    for (int t = 0; t < n_prev; ++t) {
        float k[H::RPT], v[4];
#pragma unroll
        for (int i = 0; i < H::RPT; ++i) k[i] = ld_cg(rk + ((i64)t * hv + h) * H::DK + H::row(i));
        ld_cg_f4(rv + ((i64)t * hv + h) * H::DV + H::col0(), v);
        st.update(k, v, ld_cg(rgate + (i64)t * hv + h), ld_cg(rb + (i64)t * hv + h));
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
        static_assert((DK) % 32 == 0 && (DV) % MK_CONSUMER_WARPS == 0, ""); \
        f(DnHead<(DK) / 32, (DV) / MK_CONSUMER_WARPS>{});                  \
        return true;                                       \
    }
    MK_DN_SIZES(MK_DN_CASE)
#undef MK_DN_CASE
    if (ctid() == 0) mk_fail(g, ERR_BAD_SHAPE, blockIdx.x, -1, g.ssm_dk, g.ssm_dv, 0, 0);
    return false;
}
