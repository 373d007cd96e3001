// Gated DeltaNet (qwen35): causal conv1d with its rolling state, the gates, and the gated delta rule
// (engine/reference/ops.py: causal_conv1d, gated_delta_rule; engine/reference/qwen35.py), float32 arithmetic.
//
// Speculative passes do not commit: the conv kernel appends the pass's inputs after the state rows of its window
// buffer, and the delta rule leaves the recurrent state untouched. Accepting n tokens then shifts the window
// (conv_commit) and re-runs the rule over the first n tokens with commit on (state written back); prefill and
// plain decode commit directly.
#include "common.cuh"

#define CONV_CHUNK 16  // tokens per thread: chunks of a long prefill run in parallel

// window: [K - 1 + max_tokens, C] f32, rows 0 .. K-2 the committed state. x: [T, ld_x] new inputs (the qkv
// projections); out[t, c] = silu(sum_j w[c, j] * window[t + j, c]) with x appended as rows K-1 ... A thread owns
// one channel for CONV_CHUNK consecutive tokens (grid y: chunks); its history comes from the state rows or from x.
// Nothing is written to the state rows here: a non-committing pass appends x after them (for conv_commit), and a
// committing one writes the new state to the scratch rows K-1 .. 2K-3 (conv_commit(K-1) then moves it), so no
// chunk can read a state row another chunk already replaced.
__global__ void __launch_bounds__(256)
conv1d_silu(float* __restrict__ window, const float* __restrict__ x, const float* __restrict__ w,
            float* __restrict__ out, int T, int C, int K, int ld_x, int ld_out, int commit) {
    PDL_ENTER();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * CONV_CHUNK;
    if (c >= C) return;
    float hist[8];  // the K-1 inputs before the current token, oldest first (K <= 9)
    for (int j = 0; j < K - 1; ++j) {
        const int t = t0 - (K - 1) + j;  // < 0: a state row
        hist[j] = t < 0 ? window[(i64)(K - 1 + t) * C + c] : x[(i64)t * ld_x + c];
    }
    float wc[9];
    for (int j = 0; j < K; ++j) wc[j] = w[(i64)c * K + j];
    const int t1 = min(T, t0 + CONV_CHUNK);
    for (int t = t0; t < t1; ++t) {
        const float xt = x[(i64)t * ld_x + c];
        float acc = wc[K - 1] * xt;
        for (int j = 0; j < K - 1; ++j) acc += wc[j] * hist[j];
        out[(i64)t * ld_out + c] = siluf_(acc);
        if (!commit) window[(i64)(K - 1 + t) * C + c] = xt;
        for (int j = 0; j + 1 < K - 1; ++j) hist[j] = hist[j + 1];
        if (K > 1) hist[K - 2] = xt;
    }
    if (commit && t1 == T)  // the chunk holding the last token: the new state, into the scratch rows
        for (int j = 0; j < K - 1; ++j) window[(i64)(K - 1 + j) * C + c] = hist[j];
}

// After a non-committing pass: the state after its first n tokens is window rows n .. n + K-2.
__global__ void __launch_bounds__(256) conv_commit(float* __restrict__ window, int n, int C, int K) {
    PDL_ENTER();
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
    PDL_ENTER();
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * H) return;
    const int t = idx / H, h = idx % H;
    g[idx] = a[h] * softplusf_(alpha[(i64)t * ld_alpha + h] + dt_bias[h]);
    beta[idx] = sigmoidf_(b[(i64)t * ld_b + h]);
}

#define GDN_WARPS 4  // warps a block; each keeps COLS (8, or 4 for twice the warps a head) state columns

// One DeltaNet layer's buffers for the accept (engine/cuda/model.py DeltaNetBuffers): the normalised q | k rows
// of 2 Hk Dk, v's conv output in rows of C channels (at channel 2 Hk Dk), the gates [T, Hv], the state
// [Hv, Dk, Dv] and the conv window [K - 1 + tokens, C].
struct GdnLayer {
    const float* qk;
    const float* v;
    float* g;
    float* beta;
    float* state;
    float* window;
};

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
    // TAPS > 0 (the conv inside the rule): q, k, v are the raw projections (channel hk Dk + row, Hk Dk + hk Dk +
    // row, 2 Hk Dk + h Dv + j of conv1d_silu's C channels), conv_w [C, TAPS], window as conv1d_silu's (its state
    // rows read, the pass's raw inputs appended) and conv_out [T, C] (only v's channels written: the commit re-run's
    // input)
    const float* conv_w;
    float* window;
    float* conv_out;
    int C;
    // LAYERS (the accept of every DeltaNet layer in one launch, grid z the layer): layer z's saved inputs, state
    // and window (T the accepted tokens, C and conv_k its window's channels and taps)
    const GdnLayer* layers;
    int conv_k;
};


// The gated delta rule over T tokens, one token at a time, per value head h (key head h % Hk), S [Dk, Dv]:
//   S = e^g S; u = beta (v - S^T k); S += k u^T; o = S^T q,
// with q, k L2-normalised (q times q_scale) and g = a softplus(alpha + dt_bias), beta = sigmoid(b) computed here
// unless `prepared` (then q, k, g, beta are read as given). `save` writes the normalised q/k and the gates for
// a later commit. A warp keeps COLS columns of S in registers (lane holds rows lane + 32 i, i < KL), so the
// whole chunk of tokens runs on-chip and S is read once and (if commit) written once. Grid
// (ceil(Dv / (GDN_WARPS COLS)), Hv).
// TAPS (a non-committing pass of up to GDN_CONV_TOKENS tokens, raw gates): the causal conv and SiLU of q, k and v
// (conv1d_silu's arithmetic) done here on the raw projections, one launch and one kernel boundary fewer a DeltaNet
// layer. Every token's inputs are loaded at once and staged in shared memory before the recurrence, so its tokens
// wait for no load. The block's warps share the key head's q and k: thread (warp, lane) convolves rows lane +
// 32 (warp + GDN_WARPS m), and the block's first GDN_WARPS COLS threads its v columns; the key head's first block
// appends the raw q and k to the window, each v column's thread its raw v, and writes v's conv output for the
// commit. Every form loads the state S before the PDL wait (TAPS also the conv weights and the window's state rows
// of the thread's channels): the kernel before this one writes none of them (the last writer of each is at least
// two launches back, and a kernel triggers its dependents only after its own wait).
#define GDN_CONV_TOKENS 8  // the tokens a TAPS launch stages (engine/cuda/mixers.py GDN_CONV_MAX_TOKENS)
// One token's inputs for the lane: raw (or prepared) q/k rows, its COLS values of v, the gate inputs.
template <int KL, int COLS>
struct GdnToken {
    float kk[KL], qq[KL], v[COLS], ga, gb;
};

template <int KL, int COLS>
__device__ __forceinline__ void gdn_load(const GdnArgs& p, int t, int h, int hk, int j0, int lane,
                                         GdnToken<KL, COLS>& in) {
#pragma unroll
    for (int i = 0; i < KL; ++i) {
        const int row = lane + 32 * i;
        in.kk[i] = row < p.Dk ? p.k[(i64)t * p.ld_qk + hk * p.Dk + row] : 0.f;
        in.qq[i] = row < p.Dk ? p.q[(i64)t * p.ld_qk + hk * p.Dk + row] : 0.f;
    }
#pragma unroll
    for (int cj = 0; cj < COLS; ++cj)
        in.v[cj] = j0 + cj < p.Dv ? p.v[(i64)t * p.ld_v + (i64)h * p.Dv + j0 + cj] : 0.f;
    // prepared: g and beta; raw: alpha and b (the gates are formed after the load)
    in.ga = p.prepared ? p.g[(i64)t * p.num_v_heads + h] : p.alpha[(i64)t * p.ld_gate + h];
    in.gb = p.prepared ? p.beta[(i64)t * p.num_v_heads + h] : p.b[(i64)t * p.ld_gate + h];
}

// GDN_VEC_STATE (default 1): the lane's COLS columns of each of its rows of S moved as float4s (the launchers
// require Dv a multiple of 4, so a float4 of a row lies in S or wholly past its columns). A warp's scalar loads
// touch 32 rows a load, 512 bytes apart: one 4-byte load a lane is a wavefront a lane, four times a float4's.
#ifndef GDN_VEC_STATE
#define GDN_VEC_STATE 1
#endif
// S's columns j0 .. j0 + COLS - 1 of the lane's rows lane + 32 i (zeros outside S), read into s or (STORE) written
// from it.
template <int KL, int COLS, bool STORE>
__device__ __forceinline__ void gdn_state_io(float* sh, float (&s)[KL][COLS], int Dk, int Dv, int j0, int lane) {
#pragma unroll
    for (int i = 0; i < KL; ++i) {
        const int row = lane + 32 * i;
#if GDN_VEC_STATE
        static_assert(COLS % 4 == 0, "whole float4s of a row");
        float4* at = reinterpret_cast<float4*>(sh + (i64)row * Dv + j0);
#pragma unroll
        for (int c4 = 0; c4 < COLS / 4; ++c4) {
            const bool in = row < Dk && j0 + 4 * c4 < Dv;
            if (STORE) {
                const float4 v = make_float4(s[i][4 * c4], s[i][4 * c4 + 1], s[i][4 * c4 + 2], s[i][4 * c4 + 3]);
                if (in) at[c4] = v;
            } else {
                const float4 v = in ? at[c4] : make_float4(0.f, 0.f, 0.f, 0.f);
                s[i][4 * c4] = v.x;
                s[i][4 * c4 + 1] = v.y;
                s[i][4 * c4 + 2] = v.z;
                s[i][4 * c4 + 3] = v.w;
            }
        }
#else
#pragma unroll
        for (int cj = 0; cj < COLS; ++cj) {
            const bool in = row < Dk && j0 + cj < Dv;
            if (STORE) {
                if (in) sh[(i64)row * Dv + j0 + cj] = s[i][cj];
            } else {
                s[i][cj] = in ? sh[(i64)row * Dv + j0 + cj] : 0.f;
            }
        }
#endif
    }
}

// One channel's conv output for input x after its history (oldest first), SiLU applied; the history moves on.
__device__ __forceinline__ float gdn_conv(float4 w, float (&hist)[3], float x) {
    const float acc = w.x * hist[0] + w.y * hist[1] + w.z * hist[2] + w.w * x;
    hist[0] = hist[1];
    hist[1] = hist[2];
    hist[2] = x;
    return siluf_(acc);
}

// TAPS: thread (warp, lane) loads its q and k rows of every token, appends them to the window (the key head's
// first block), convolves them into the stage; the first VC threads do the same for v (and write its conv
// output), the last 2 GDN_CONV_TOKENS load the gate inputs.
template <int KL, int COLS, int SHARE>
__device__ __forceinline__ void gdn_stage_conv(const GdnArgs& p, float* stage, int h, int hk, int key, int vcol,
                                               bool vmine, const float4 (&wq)[SHARE], const float4 (&wk)[SHARE],
                                               float4 wv, float (&hq)[SHARE][3], float (&hkk)[SHARE][3],
                                               float (&hv)[3]) {
    constexpr int VC = GDN_WARPS * COLS, TM = GDN_CONV_TOKENS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, Dk = p.Dk, T = p.T;
    const bool appends = blockIdx.x == 0 && h < p.num_k_heads;
    const int gi = (int)threadIdx.x - (GDN_WARPS * 32 - 2 * TM);  // the gate inputs: alpha | b of token gi / 2
    const i64 vch = 2 * key + (i64)h * p.Dv + vcol;
    // every load first (a store may alias any later load for the compiler): one round trip for all of them
    float rq[SHARE][TM], rk[SHARE][TM], rv[TM];
#pragma unroll
    for (int m = 0; m < SHARE; ++m) {
        const int row = lane + 32 * (warp + GDN_WARPS * m);
        const bool real = warp + GDN_WARPS * m < KL && row < Dk;
#pragma unroll
        for (int t = 0; t < TM; ++t) {
            rq[m][t] = real && t < T ? p.q[(i64)t * p.ld_qk + hk * Dk + row] : 0.f;
            rk[m][t] = real && t < T ? p.k[(i64)t * p.ld_qk + hk * Dk + row] : 0.f;
        }
    }
#pragma unroll
    for (int t = 0; t < TM; ++t) rv[t] = vmine && t < T ? p.v[(i64)t * p.ld_v + vch - 2 * key] : 0.f;
    const float gate = gi >= 0 && gi / 2 < T ? (gi & 1 ? p.b : p.alpha)[(i64)(gi / 2) * p.ld_gate + h] : 0.f;
#pragma unroll
    for (int m = 0; m < SHARE; ++m) {
        const int i = warp + GDN_WARPS * m, row = lane + 32 * i;
        if (i >= KL) break;
#pragma unroll
        for (int t = 0; t < TM; ++t) {
            if (t >= T) break;
            if (row < Dk && appends) {
                p.window[(i64)(3 + t) * p.C + hk * Dk + row] = rq[m][t];
                p.window[(i64)(3 + t) * p.C + key + hk * Dk + row] = rk[m][t];
            }
            stage[t * 64 * KL + row] = gdn_conv(wq[m], hq[m], rq[m][t]);
            stage[t * 64 * KL + 32 * KL + row] = gdn_conv(wk[m], hkk[m], rk[m][t]);
        }
    }
    if (threadIdx.x < VC) {
#pragma unroll
        for (int t = 0; t < TM; ++t) {
            if (t >= T) break;
            const float y = gdn_conv(wv, hv, rv[t]);
            stage[TM * 64 * KL + t * VC + threadIdx.x] = y;
            if (vmine) {
                p.window[(i64)(3 + t) * p.C + vch] = rv[t];
                p.conv_out[(i64)t * p.C + vch] = y;
            }
        }
    }
    if (gi >= 0 && gi / 2 < T) stage[TM * (64 * KL + VC) + gi] = gate;
}

// LAYERS: the accept of the last pass's first T tokens in every DeltaNet layer (grid z), prepared inputs, commit
// on, no output: conv_commit's shift of layer z's window, spread over its blocks, then the rule from what the pass
// saved. One launch instead of two a layer: the 27B's 96 launches of ~10 us each were a millisecond a cycle.
__device__ __forceinline__ void gdn_layer_args(GdnArgs& p) {
    const GdnLayer L = p.layers[blockIdx.z];
    const int key = p.num_k_heads * p.Dk;
    p.q = L.qk;
    p.k = L.qk + key;
    p.v = L.v;
    p.g = L.g;
    p.beta = L.beta;
    p.state = L.state;
    PDL_ENTER();  // the window's rows past the state are the pass's
    const int K1 = p.conv_k - 1, stride = gridDim.x * gridDim.y * blockDim.x;
    for (int c = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; c < p.C; c += stride) {
        float hist[8];
        for (int j = 0; j < K1; ++j) hist[j] = L.window[(i64)(p.T + j) * p.C + c];
        for (int j = 0; j < K1; ++j) L.window[(i64)j * p.C + c] = hist[j];
    }
}

// With the conv, three blocks an SM (the 27B's 384 blocks in one wave on 132 SMs) bound its registers (0: none).
template <int KL, int COLS, int TAPS, int LAYERS = 0>
__global__ void __launch_bounds__(GDN_WARPS * 32, TAPS ? 3 : 0) gdn_recurrent(GdnArgs p) {
    static_assert(TAPS == 0 || (TAPS == 4 && GDN_WARPS * COLS <= 32), "one float4 of weights a channel");
    static_assert(!LAYERS || !TAPS, "the accept is the plain rule");
    if constexpr (LAYERS > 0) gdn_layer_args(p);
    constexpr int SHARE = TAPS ? (KL + GDN_WARPS - 1) / GDN_WARPS : 1;  // q (and k) rows a thread convolves
    constexpr int VC = GDN_WARPS * COLS;  // the block's v columns
    // staged tokens: [t][q | k][32 KL rows], [t][v column], [t][alpha | b]
    __shared__ float stage[TAPS ? GDN_CONV_TOKENS * (64 * KL + VC + 2) : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, hk = h % p.num_k_heads, Dk = p.Dk, Dv = p.Dv, key = p.num_k_heads * Dk;
    const int j0 = (blockIdx.x * GDN_WARPS + warp) * COLS;
    if (!TAPS && j0 >= Dv) return;  // with the conv every warp takes part in the block's barrier
    // one writer of the saved per-head values: the first warp of the first column block of the head
    const bool writer = p.save && blockIdx.x == 0 && warp == 0;
    float* sh = p.state + (i64)h * Dk * Dv;
    float s[KL][COLS];
    gdn_state_io<KL, COLS, false>(sh, s, Dk, Dv, j0, lane);
    const float a_h = p.prepared ? 0.f : p.a[h], dt_h = p.prepared ? 0.f : p.dt_bias[h];
    // the conv's weights and history (the window's state rows, then the pass's inputs): rows lane + 32 (warp +
    // GDN_WARPS m) of q and k; the first VC threads' v column
    float4 wq[SHARE], wk[SHARE], wv = make_float4(0.f, 0.f, 0.f, 0.f);
    float hq[SHARE][3], hkk[SHARE][3], hv[3];
    const int vcol = blockIdx.x * VC + threadIdx.x;  // this thread's v column (threads below VC)
    const bool vmine = TAPS && threadIdx.x < VC && vcol < Dv;
    if constexpr (TAPS > 0) {
        const float4* w4 = reinterpret_cast<const float4*>(p.conv_w);
#pragma unroll
        for (int m = 0; m < SHARE; ++m) {
            const int row = lane + 32 * (warp + GDN_WARPS * m);
            const bool real = warp + GDN_WARPS * m < KL && row < Dk;
            wq[m] = real ? w4[hk * Dk + row] : make_float4(0.f, 0.f, 0.f, 0.f);
            wk[m] = real ? w4[key + hk * Dk + row] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int j = 0; j < 3; ++j) {
                hq[m][j] = real ? p.window[(i64)j * p.C + hk * Dk + row] : 0.f;
                hkk[m][j] = real ? p.window[(i64)j * p.C + key + hk * Dk + row] : 0.f;
            }
        }
        if (vmine) wv = w4[2 * key + h * Dv + vcol];
#pragma unroll
        for (int j = 0; j < 3; ++j) hv[j] = vmine ? p.window[(i64)j * p.C + 2 * key + h * Dv + vcol] : 0.f;
    }
    PDL_ENTER();
    GdnToken<KL, COLS> cur, nxt;
    if constexpr (TAPS > 0) {  // every token's raw inputs loaded at once, appended, convolved, staged
        gdn_stage_conv<KL, COLS, SHARE>(p, stage, h, hk, key, vcol, vmine, wq, wk, wv, hq, hkk, hv);
        __syncthreads();
    } else if (p.T > 0) {
        gdn_load<KL, COLS>(p, 0, h, hk, j0, lane, cur);
    }
    for (int t = 0; t < p.T; ++t) {
        if constexpr (TAPS > 0) {
            const float* st = stage + t * 64 * KL;
#pragma unroll
            for (int i = 0; i < KL; ++i) {
                cur.qq[i] = st[lane + 32 * i];
                cur.kk[i] = st[32 * KL + lane + 32 * i];
            }
            const float* sv = stage + GDN_CONV_TOKENS * 64 * KL + t * VC + warp * COLS;
#pragma unroll
            for (int cj = 0; cj < COLS; ++cj) cur.v[cj] = sv[cj];
            const float* sg = stage + GDN_CONV_TOKENS * (64 * KL + VC) + 2 * t;
            cur.ga = sg[0];
            cur.gb = sg[1];
        } else if (t + 1 < p.T) {
            gdn_load<KL, COLS>(p, t + 1, h, hk, j0, lane, nxt);  // the next token's loads fly meanwhile
        }
        // k^T S for every column and the two squared norms, reduced together
        float red[COLS + 2];
#pragma unroll
        for (int cj = 0; cj < COLS; ++cj) {
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < KL; ++i) acc += cur.kk[i] * s[i][cj];
            red[cj] = acc;
        }
        red[COLS] = red[COLS + 1] = 0.f;
#pragma unroll
        for (int i = 0; i < KL; ++i) {
            red[COLS] += cur.kk[i] * cur.kk[i];
            red[COLS + 1] += cur.qq[i] * cur.qq[i];
        }
        warp_sum_n<COLS + 2>(red);
        float kn = 1.f, qn = 1.f, gt = cur.ga, bt = cur.gb;
        if (!p.prepared) {
            kn = rsqrtf(red[COLS] + p.eps);
            qn = rsqrtf(red[COLS + 1] + p.eps) * p.q_scale;
            gt = a_h * softplusf_(cur.ga + dt_h);
            bt = sigmoidf_(cur.gb);
        }
        const float decay = __expf(gt);
        float o[COLS];
#pragma unroll
        for (int cj = 0; cj < COLS; ++cj) {
            const float u = bt * (cur.v[cj] - red[cj] * kn * decay);  // v - k^T (e^g S)
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < KL; ++i) {
                s[i][cj] = s[i][cj] * decay + cur.kk[i] * kn * u;
                acc += cur.qq[i] * s[i][cj];
            }
            o[cj] = acc;
        }
        warp_sum_n<COLS>(o);
        float out_mine = 0.f;
#pragma unroll
        for (int cj = 0; cj < COLS; ++cj)
            if (lane == cj) out_mine = o[cj] * qn;
        if (!LAYERS && lane < COLS && j0 + lane < Dv) p.o[(i64)t * p.ld_o + (i64)h * Dv + j0 + lane] = out_mine;
        if (writer) {
            if (lane == 0) {
                p.g[(i64)t * p.num_v_heads + h] = gt;
                p.beta[(i64)t * p.num_v_heads + h] = bt;
            }
            if (h < p.num_k_heads)  // one value head per key head saves the shared, normalised q/k
#pragma unroll
                for (int i = 0; i < KL; ++i) {
                    const int row = lane + 32 * i;
                    if (row < Dk) {
                        const i64 base = (i64)t * 2 * p.num_k_heads * Dk;
                        p.qk_out[base + hk * Dk + row] = cur.qq[i] * qn;
                        p.qk_out[base + (p.num_k_heads + hk) * Dk + row] = cur.kk[i] * kn;
                    }
                }
        }
        if constexpr (TAPS == 0) cur = nxt;
    }
    if (p.commit) gdn_state_io<KL, COLS, true>(sh, s, Dk, Dv, j0, lane);
}
