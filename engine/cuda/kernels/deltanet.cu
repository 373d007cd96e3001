// Gated DeltaNet (qwen35): causal conv1d with its rolling state, the gates, and the gated delta rule
// (engine/reference/ops.py: causal_conv1d, gated_delta_rule; engine/reference/qwen35.py), float32 arithmetic.
//
// Speculative passes do not commit: the conv kernel appends the pass's inputs after the state rows of its window
// buffer, and the delta rule leaves the recurrent state untouched. Accepting n tokens then shifts the window
// (conv_commit) and re-runs the rule over the first n tokens with commit on (state written back); prefill and
// plain decode commit directly.
#include "common.cuh"

// window: [K - 1 + max_tokens, C] f32, rows 0 .. K-2 the committed state. x: [T, ld_x] new inputs (the qkv
// projections); out[t, c] = silu(sum_j w[c, j] * window[t + j, c]) with x appended as rows K-1 ... Each thread owns
// one channel, so reading the state and writing the window never race.
__global__ void __launch_bounds__(256)
conv1d_silu(float* __restrict__ window, const float* __restrict__ x, const float* __restrict__ w,
            float* __restrict__ out, int T, int C, int K, int ld_x, int ld_out, int commit) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float hist[8];  // the last K-1 inputs, oldest first (K <= 9)
    for (int j = 0; j < K - 1; ++j) hist[j] = window[(i64)j * C + c];
    float wc[9];
    for (int j = 0; j < K; ++j) wc[j] = w[(i64)c * K + j];
    for (int t = 0; t < T; ++t) {
        const float xt = x[(i64)t * ld_x + c];
        float acc = wc[K - 1] * xt;
        for (int j = 0; j < K - 1; ++j) acc += wc[j] * hist[j];
        out[(i64)t * ld_out + c] = siluf_(acc);
        if (!commit) window[(i64)(K - 1 + t) * C + c] = xt;
        for (int j = 0; j + 1 < K - 1; ++j) hist[j] = hist[j + 1];
        if (K > 1) hist[K - 2] = xt;
    }
    if (commit)
        for (int j = 0; j < K - 1; ++j) window[(i64)j * C + c] = hist[j];
}

// After a non-committing pass: the state after its first n tokens is window rows n .. n + K-2.
__global__ void __launch_bounds__(256) conv_commit(float* __restrict__ window, int n, int C, int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float hist[8];
    for (int j = 0; j < K - 1; ++j) hist[j] = window[(i64)(n + j) * C + c];
    for (int j = 0; j < K - 1; ++j) window[(i64)j * C + c] = hist[j];
}

// g[t, h] = a[h] * softplus(alpha[t, h] + dt_bias[h]) (a = -exp(A_log) as stored); beta[t, h] = sigmoid(b[t, h]).
__global__ void __launch_bounds__(256)
gdn_gates(const float* __restrict__ alpha, const float* __restrict__ b, const float* __restrict__ a,
          const float* __restrict__ dt_bias, float* __restrict__ g, float* __restrict__ beta, int T, int H,
          int ld_alpha, int ld_b) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * H) return;
    const int t = idx / H, h = idx % H;
    g[idx] = a[h] * softplusf_(alpha[(i64)t * ld_alpha + h] + dt_bias[h]);
    beta[idx] = sigmoidf_(b[(i64)t * ld_b + h]);
}

#define GDN_COLS 8   // state columns per warp
#define GDN_WARPS 4

// The gated delta rule over T tokens, one token at a time, per value head h (key head h % Hk), S [Dk, Dv]:
//   S = e^g S; u = beta (v - S^T k); S += k u^T; o = S^T q.
// A warp keeps GDN_COLS columns of S in registers (lane holds rows lane + 32 i, i < KL = Dk / 32), so the whole
// chunk of tokens runs on-chip and S is read once and (if commit) written once. Grid (ceil(Dv / 32), Hv).
// q, k: rows of T at q[t * ld_qk + hk * Dk]; v: v[t * ld_v + h * Dv]; g, beta: [T, Hv]; o: o[t * ld_o + h * Dv].
template <int KL>
__global__ void __launch_bounds__(GDN_WARPS * 32)
gdn_recurrent(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
              const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ state,
              float* __restrict__ o, int T, int num_k_heads, int num_v_heads, int Dk, int Dv, int ld_qk, int ld_v,
              int ld_o, int commit) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, hk = h % num_k_heads;
    const int j0 = (blockIdx.x * GDN_WARPS + warp) * GDN_COLS;
    if (j0 >= Dv) return;
    float* sh = state + (i64)h * Dk * Dv;
    float s[KL][GDN_COLS];
#pragma unroll
    for (int i = 0; i < KL; ++i) {
        const int row = lane + 32 * i;
#pragma unroll
        for (int cj = 0; cj < GDN_COLS; ++cj)
            s[i][cj] = (row < Dk && j0 + cj < Dv) ? sh[(i64)row * Dv + j0 + cj] : 0.f;
    }
    for (int t = 0; t < T; ++t) {
        float kk[KL], qq[KL];
#pragma unroll
        for (int i = 0; i < KL; ++i) {
            const int row = lane + 32 * i;
            kk[i] = row < Dk ? k[(i64)t * ld_qk + hk * Dk + row] : 0.f;
            qq[i] = row < Dk ? q[(i64)t * ld_qk + hk * Dk + row] : 0.f;
        }
        const float decay = __expf(g[(i64)t * num_v_heads + h]), bt = beta[(i64)t * num_v_heads + h];
        float out_mine = 0.f;
#pragma unroll
        for (int cj = 0; cj < GDN_COLS; ++cj) {
            float pred = 0.f;
#pragma unroll
            for (int i = 0; i < KL; ++i) pred += kk[i] * s[i][cj];
            pred = warp_sum(pred) * decay;  // k^T (e^g S)
            const float vj = j0 + cj < Dv ? v[(i64)t * ld_v + (i64)h * Dv + j0 + cj] : 0.f;
            const float u = bt * (vj - pred);
            float oj = 0.f;
#pragma unroll
            for (int i = 0; i < KL; ++i) {
                s[i][cj] = s[i][cj] * decay + kk[i] * u;
                oj += qq[i] * s[i][cj];
            }
            oj = warp_sum(oj);
            if (lane == cj) out_mine = oj;
        }
        if (lane < GDN_COLS && j0 + lane < Dv) o[(i64)t * ld_o + (i64)h * Dv + j0 + lane] = out_mine;
    }
    if (commit) {
#pragma unroll
        for (int i = 0; i < KL; ++i) {
            const int row = lane + 32 * i;
#pragma unroll
            for (int cj = 0; cj < GDN_COLS; ++cj)
                if (row < Dk && j0 + cj < Dv) sh[(i64)row * Dv + j0 + cj] = s[i][cj];
        }
    }
}
