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

struct GdnArgs {
    const float* q;        // q of (t, key head hk): q[t * ld_qk + hk * Dk]; k likewise (raw unless prepared)
    const float* k;
    const float* v;        // v[t * ld_v + h * Dv]
    const float* alpha;    // raw gate inputs alpha[t * ld_gate + h], b[...] (unless prepared)
    const float* b;
    const float* a;        // ssm_a [Hv] (= -exp(A_log)) and ssm_dt.bias [Hv]
    const float* dt_bias;
    float* g;              // [T, Hv]: read when prepared, written when save
    float* beta;
    float* qk_out;         // save: normalised q (then k at + Hk * Dk) rows of 2 * Hk * Dk
    float* state;          // [Hv, Dk, Dv]
    float* o;              // o[t * ld_o + h * Dv]
    int T, num_k_heads, num_v_heads, Dk, Dv, ld_qk, ld_v, ld_o, ld_gate, commit, prepared, save;
    float eps, q_scale;
};

// The gated delta rule over T tokens, one token at a time, per value head h (key head h % Hk), S [Dk, Dv]:
//   S = e^g S; u = beta (v - S^T k); S += k u^T; o = S^T q,
// with q, k L2-normalised (q times q_scale) and g = a softplus(alpha + dt_bias), beta = sigmoid(b) computed here
// unless `prepared` (then q, k, g, beta are read as given). `save` writes the normalised q/k and the gates for
// a later commit. A warp keeps GDN_COLS columns of S in registers (lane holds rows lane + 32 i, i < KL), so the
// whole chunk of tokens runs on-chip and S is read once and (if commit) written once. Grid (ceil(Dv / 32), Hv).
template <int KL>
__global__ void __launch_bounds__(GDN_WARPS * 32) gdn_recurrent(GdnArgs p) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, hk = h % p.num_k_heads, Dk = p.Dk, Dv = p.Dv;
    const int j0 = (blockIdx.x * GDN_WARPS + warp) * GDN_COLS;
    if (j0 >= Dv) return;
    // one writer of the saved per-head values: the first warp of the first column block of the head
    const bool writer = p.save && blockIdx.x == 0 && warp == 0;
    float* sh = p.state + (i64)h * Dk * Dv;
    float s[KL][GDN_COLS];
#pragma unroll
    for (int i = 0; i < KL; ++i) {
        const int row = lane + 32 * i;
#pragma unroll
        for (int cj = 0; cj < GDN_COLS; ++cj)
            s[i][cj] = (row < Dk && j0 + cj < Dv) ? sh[(i64)row * Dv + j0 + cj] : 0.f;
    }
    for (int t = 0; t < p.T; ++t) {
        float kk[KL], qq[KL], kss = 0.f, qss = 0.f;
#pragma unroll
        for (int i = 0; i < KL; ++i) {
            const int row = lane + 32 * i;
            kk[i] = row < Dk ? p.k[(i64)t * p.ld_qk + hk * Dk + row] : 0.f;
            qq[i] = row < Dk ? p.q[(i64)t * p.ld_qk + hk * Dk + row] : 0.f;
            kss += kk[i] * kk[i];
            qss += qq[i] * qq[i];
        }
        float decay, bt;
        if (p.prepared) {
            decay = __expf(p.g[(i64)t * p.num_v_heads + h]);
            bt = p.beta[(i64)t * p.num_v_heads + h];
        } else {
            const float kn = rsqrtf(warp_sum(kss) + p.eps), qn = rsqrtf(warp_sum(qss) + p.eps) * p.q_scale;
#pragma unroll
            for (int i = 0; i < KL; ++i) {
                kk[i] *= kn;
                qq[i] *= qn;
            }
            const float gt = p.a[h] * softplusf_(p.alpha[(i64)t * p.ld_gate + h] + p.dt_bias[h]);
            bt = sigmoidf_(p.b[(i64)t * p.ld_gate + h]);
            decay = __expf(gt);
            if (writer) {
                if (lane == 0) {
                    p.g[(i64)t * p.num_v_heads + h] = gt;
                    p.beta[(i64)t * p.num_v_heads + h] = bt;
                }
                if (h < p.num_k_heads)  // one value head per key head saves the shared q/k
#pragma unroll
                    for (int i = 0; i < KL; ++i) {
                        const int row = lane + 32 * i;
                        if (row < Dk) {
                            p.qk_out[(i64)t * 2 * p.num_k_heads * Dk + hk * Dk + row] = qq[i];
                            p.qk_out[(i64)t * 2 * p.num_k_heads * Dk + (p.num_k_heads + hk) * Dk + row] = kk[i];
                        }
                    }
            }
        }
        float out_mine = 0.f;
#pragma unroll
        for (int cj = 0; cj < GDN_COLS; ++cj) {
            float pred = 0.f;
#pragma unroll
            for (int i = 0; i < KL; ++i) pred += kk[i] * s[i][cj];
            pred = warp_sum(pred) * decay;  // k^T (e^g S)
            const float vj = j0 + cj < Dv ? p.v[(i64)t * p.ld_v + (i64)h * Dv + j0 + cj] : 0.f;
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
        if (lane < GDN_COLS && j0 + lane < Dv) p.o[(i64)t * p.ld_o + (i64)h * Dv + j0 + lane] = out_mine;
    }
    if (p.commit) {
#pragma unroll
        for (int i = 0; i < KL; ++i) {
            const int row = lane + 32 * i;
#pragma unroll
            for (int cj = 0; cj < GDN_COLS; ++cj)
                if (row < Dk && j0 + cj < Dv) sh[(i64)row * Dv + j0 + cj] = s[i][cj];
        }
    }
}
