// The gated delta rule over a long run of committed tokens (prefill), in chunks of GDN_CHUNK tokens
// (engine/reference/ops.py: gated_delta_rule_chunked), float32 arithmetic, two launches a layer:
//
// gdn_chunk_prep, one block per (chunk, value head h), every chunk at once: L2-normalises q and k (q times q_scale),
// forms the gates g = a softplus(alpha + dt_bias) and beta = sigmoid(b), and with c = cumsum(g) within the chunk,
// A[t, i] = beta_t e^(c_t - c_i) k_t.k_i (i < t) and T = (I + A)^-1 (forward substitution), writes
//   W = T diag(beta e^c) K,   U~ = T diag(beta) V,   P[t, i] = e^(c_t - c_i) q_t.k_i (i <= t),
//   Q' = diag(e^c) Q,   K' = diag(e^(c_end - c)) K,   e^(c_end).
// gdn_chunk_scan, one block per (NC columns of the state, value head), chunk after chunk:
//   U = U~ - W S;   O = Q' S + P U;   S = e^(c_end) S + K'^T U.
// State columns are independent (u_t[j] needs column j alone), so the scan splits them across blocks; the
// matrices that depend on k, q and the gates alone are made once per chunk by the prep. Tokens past T pad the
// last chunk with k = q = v = 0 and g = beta = 0, which leaves every sum exact. Every exponent is <= 0 (g <= 0).
// Key and value head sizes are equal (D) and a multiple of 32.
#include "common.cuh"

#define GDN_CHUNK 64      // tokens per chunk (the prep's 64 x 64 tiles and its cumsum assume it)
#define GDN_THREADS 256
#define GDN_SCAN_COLS 32  // state columns per scan block

// The prep's output for one (value head, chunk), in floats; offsets are multiples of 4 (float4 stores).
template <int D>
struct ChunkWork {
    static constexpr int C = GDN_CHUNK;
    static constexpr i64 W = 0, U = (i64)C * D, QS = 2 * (i64)C * D, KS = 3 * (i64)C * D, P = 4 * (i64)C * D,
                         TAIL = 4 * (i64)C * D + C * C, FLOATS = TAIL + 4;
};

struct GdnChunkArgs {
    const float* q;        // raw q of (t, key head hk): q[t * ld_qk + hk * D]; k likewise
    const float* k;
    const float* v;        // v[t * ld_v + h * D]
    const float* alpha;    // gate inputs alpha[t * ld_gate + h], b[...]
    const float* b;
    const float* a;        // ssm_a [Hv] (= -exp(A_log)) and ssm_dt.bias [Hv]
    const float* dt_bias;
    float* work;           // [Hv, num_chunks, ChunkWork<D>::FLOATS]
    float* state;          // [Hv, D, D], read and written back
    float* o;              // o[t * ld_o + h * D] (ld_o and the base 16-byte aligned)
    int T, num_k_heads, num_v_heads, ld_qk, ld_v, ld_o, ld_gate;
    float eps, q_scale;
};

__device__ __forceinline__ void fma4(float4& acc, float s, const float4& x) {
    acc.x += s * x.x;
    acc.y += s * x.y;
    acc.z += s * x.z;
    acc.w += s * x.w;
}

// acc += x.x s[0] + x.y s[1] + x.z s[2] + x.w s[3]: four rows s of a product, weighted by x.
__device__ __forceinline__ void fma4x4(float4& acc, const float4& x, const float4 (&s)[4]) {
    fma4(acc, x.x, s[0]);
    fma4(acc, x.y, s[1]);
    fma4(acc, x.z, s[2]);
    fma4(acc, x.w, s[3]);
}

__device__ __forceinline__ float dot4(const float4& x, const float4& y) {
    return x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, const float4& v) { *reinterpret_cast<float4*>(p) = v; }

// Dynamic shared memory (engine/cuda/mixers.py _gdn_prep_smem): k and q|v rows (pitch D + 4), A and T (pitch
// C + 1), c and beta.
template <int D>
__global__ void __launch_bounds__(GDN_THREADS) gdn_chunk_prep(GdnChunkArgs p) {
    PDL_ENTER();
    using Out = ChunkWork<D>;
    constexpr int C = GDN_CHUNK, PITCH = D + 4, CP = C + 1, KL = D / 32, WARPS = GDN_THREADS / 32;
    extern __shared__ float4 smem4[];
    float* sk = reinterpret_cast<float*>(smem4);  // [C][PITCH]: k, then beta e^c k
    float* sx = sk + C * PITCH;                    // [C][PITCH]: q, then beta v
    float* sa = sx + C * PITCH;                    // [C][CP]: A
    float* st = sa + C * CP;                       // [C][CP]: T
    float* sc = st + C * CP;                       // [C]: g, then c = cumsum(g)
    float* sb = sc + C;                            // [C]: beta
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunk = blockIdx.x, h = blockIdx.y, hk = h % p.num_k_heads;
    const int t0 = chunk * C, n = min(C, p.T - t0);
    float* out = p.work + ((i64)h * gridDim.x + chunk) * Out::FLOATS;

    // 1. normalised q and k rows (a warp a row), the gates
    for (int t = warp; t < C; t += WARPS) {
        float kk[KL], qq[KL], ss[2] = {0.f, 0.f};
        const i64 row = (i64)(t0 + t) * p.ld_qk + hk * D;
#pragma unroll
        for (int i = 0; i < KL; ++i) {
            kk[i] = t < n ? p.k[row + lane + 32 * i] : 0.f;
            qq[i] = t < n ? p.q[row + lane + 32 * i] : 0.f;
            ss[0] += kk[i] * kk[i];
            ss[1] += qq[i] * qq[i];
        }
        warp_sum_n<2>(ss);
        const float kn = rsqrtf(ss[0] + p.eps), qn = rsqrtf(ss[1] + p.eps) * p.q_scale;
#pragma unroll
        for (int i = 0; i < KL; ++i) {
            sk[t * PITCH + lane + 32 * i] = kk[i] * kn;
            sx[t * PITCH + lane + 32 * i] = qq[i] * qn;
        }
        if (lane == 0) {
            const i64 gi = (i64)(t0 + t) * p.ld_gate + h;
            sc[t] = t < n ? p.a[h] * softplusf_(p.alpha[gi] + p.dt_bias[h]) : 0.f;
            sb[t] = t < n ? sigmoidf_(p.b[gi]) : 0.f;
        }
    }
    __syncthreads();
    if (warp == 0) {  // inclusive prefix sum over the 64 gates, two halves of 32
        float lo = sc[lane], hi = sc[lane + 32];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float l = __shfl_up_sync(FULL_MASK, lo, o), u = __shfl_up_sync(FULL_MASK, hi, o);
            if (lane >= o) lo += l, hi += u;
        }
        hi += __shfl_sync(FULL_MASK, lo, 31);
        sc[lane] = lo;
        sc[lane + 32] = hi;
    }
    __syncthreads();

    // 2. Q' and K' out; A and P from k_t.k_i and q_t.k_i, a 4 x 4 tile a thread (rows ty + 16 a, columns tx + 16 b:
    // the eight threads of a 128-bit load phase read eight different banks)
    const float c_end = sc[C - 1];
    for (int idx = tid; idx < C * D; idx += GDN_THREADS) {
        const int t = idx / D, r = idx % D;
        out[Out::QS + idx] = expf(sc[t]) * sx[t * PITCH + r];
        out[Out::KS + idx] = expf(c_end - sc[t]) * sk[t * PITCH + r];
    }
    {
        const int tx = tid & 15, ty = tid >> 4;
        float kk[4][4] = {}, qk[4][4] = {};
        for (int r = 0; r < D; r += 4) {
            float4 ki[4], kt[4], qt[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                ki[m] = ld4(&sk[(tx + 16 * m) * PITCH + r]);
                kt[m] = ld4(&sk[(ty + 16 * m) * PITCH + r]);
                qt[m] = ld4(&sx[(ty + 16 * m) * PITCH + r]);
            }
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    kk[a][b] += dot4(kt[a], ki[b]);
                    qk[a][b] += dot4(qt[a], ki[b]);
                }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int t = ty + 16 * a, i = tx + 16 * b;
                const float decay = i <= t ? expf(sc[t] - sc[i]) : 0.f;
                sa[t * CP + i] = i < t ? sb[t] * decay * kk[a][b] : 0.f;
                out[Out::P + t * C + i] = decay * qk[a][b];
            }
    }
    __syncthreads();

    // 3. the right-hand sides: beta e^c k over k, beta v over q
    for (int t = warp; t < C; t += WARPS) {
        const float scale_k = sb[t] * expf(sc[t]);
        const i64 row = (i64)(t0 + t) * p.ld_v + (i64)h * D;
#pragma unroll
        for (int i = 0; i < KL; ++i) {
            sk[t * PITCH + lane + 32 * i] *= scale_k;
            sx[t * PITCH + lane + 32 * i] = t < n ? sb[t] * p.v[row + lane + 32 * i] : 0.f;
        }
    }
    // 4. T = (I + A)^-1, lower unit-triangular, by forward substitution: T[t, j] = -sum_{j <= i < t} A[t, i] T[i, j].
    // Column j belongs to four lanes of one warp (each sums every fourth i); its rows come out in order, so the
    // column's lanes only need each other's writes.
    {
        const int j = warp * 8 + (lane >> 2), part = lane & 3;
        for (int t = 0; t < C; ++t) {
            float acc = 0.f;
            for (int i = j + part; i < t; i += 4) acc += sa[t * CP + i] * st[i * CP + j];
            acc += __shfl_xor_sync(FULL_MASK, acc, 1);
            acc += __shfl_xor_sync(FULL_MASK, acc, 2);
            if (part == 0) st[t * CP + j] = t < j ? 0.f : (t == j ? 1.f : -acc);
            __syncwarp();
        }
    }
    __syncthreads();

    // 5. W = T (beta e^c K) and U~ = T (beta V): rows gy + TY a, float4 columns gx + TX b a thread
    {
        constexpr int TX = D / 4 < 16 ? D / 4 : 16, TY = GDN_THREADS / TX, RA = C / TY, GB = D / 4 / TX;
        const int gx = tid % TX, gy = tid / TX;
        float4 w[RA][GB], u[RA][GB];
#pragma unroll
        for (int a = 0; a < RA; ++a)
#pragma unroll
            for (int b = 0; b < GB; ++b) w[a][b] = u[a][b] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i = 0; i < C; ++i) {
            float tv[RA];
#pragma unroll
            for (int a = 0; a < RA; ++a) tv[a] = st[(gy + TY * a) * CP + i];
#pragma unroll
            for (int b = 0; b < GB; ++b) {
                const float4 kv = ld4(&sk[i * PITCH + 4 * (gx + TX * b)]), xv = ld4(&sx[i * PITCH + 4 * (gx + TX * b)]);
#pragma unroll
                for (int a = 0; a < RA; ++a) {
                    fma4(w[a][b], tv[a], kv);
                    fma4(u[a][b], tv[a], xv);
                }
            }
        }
#pragma unroll
        for (int a = 0; a < RA; ++a)
#pragma unroll
            for (int b = 0; b < GB; ++b) {
                const i64 at = (i64)(gy + TY * a) * D + 4 * (gx + TX * b);
                st4(&out[Out::W + at], w[a][b]);
                st4(&out[Out::U + at], u[a][b]);
            }
    }
    if (tid == 0) out[Out::TAIL] = expf(c_end);
}

// GDN_ASYNC_COPY (1, the default; 0 through OPENJET_CUDA_DEFINES): the scan's per-chunk inputs come by cp.async,
// all of a thread's copies in flight at once (a float4 through registers each waits an L2 round trip: ~30 a thread
// a chunk), Q' and P of the next chunk and K' of this one issued while the phase before runs. Measured (bench/
// NOTES.md Z18, H100): the scan of a 4,096-token chunk's 48 layers 61.3 -> 53.4 ms, the 27B prefill of 8,192 tokens
// +0.9 %.
#ifndef GDN_ASYNC_COPY
#define GDN_ASYNC_COPY 1
#endif

// Copy rows of `cols` floats (a multiple of 4, rows 16-byte aligned) between global and shared memory, float4 at a
// time through registers, or (ASYNC: global into shared) by cp.async, which the caller commits and waits for.
template <bool ASYNC = false>
__device__ __forceinline__ void copy_rows(float* dst, int dst_pitch, const float* src, i64 src_pitch, int rows,
                                          int cols) {
    const int per_row = cols / 4;
    for (int idx = threadIdx.x; idx < rows * per_row; idx += GDN_THREADS) {
        const int r = idx / per_row, c4 = idx % per_row;
        if constexpr (ASYNC) cp_async16(smem_u32(&dst[r * dst_pitch + 4 * c4]), &src[r * src_pitch + 4 * c4]);
        else st4(&dst[r * dst_pitch + 4 * c4], ld4(&src[r * src_pitch + 4 * c4]));
    }
}

// The scan's loads into shared memory: by cp.async with GDN_ASYNC_COPY.
__device__ __forceinline__ void load_rows(float* dst, int dst_pitch, const float* src, i64 src_pitch, int rows,
                                          int cols) {
    copy_rows<GDN_ASYNC_COPY != 0>(dst, dst_pitch, src, src_pitch, rows, cols);
}

// Dynamic shared memory (engine/cuda/mixers.py _gdn_scan_smem): the state's NC columns (pitch NC + 4), W|K' and
// Q' (pitch D + 4), P (pitch C + 4), U (pitch NC + 4).
template <int D>
__global__ void __launch_bounds__(GDN_THREADS) gdn_chunk_scan(GdnChunkArgs p) {
    PDL_ENTER();
    using Out = ChunkWork<D>;
    constexpr int C = GDN_CHUNK, NC = GDN_SCAN_COLS, PITCH = D + 4, SP = NC + 4, PP = C + 4;
    // threads over (rows, float4 column groups): TX groups across the NC columns, TY rows
    constexpr int TX = NC / 4, TY = GDN_THREADS / TX, RA = C / TY, RR = D / TY;
    static_assert(D % NC == 0 && C % TY == 0 && D % TY == 0, "tile shape");
    extern __shared__ float4 smem4[];
    float* ss = reinterpret_cast<float*>(smem4);  // [D][SP]: state columns j0 .. j0 + NC
    float* sw = ss + D * SP;                       // [C][PITCH]: W, then K'
    float* sq = sw + C * PITCH;                    // [C][PITCH]: Q'
    float* sp = sq + C * PITCH;                    // [C][PP]: P
    float* su = sp + C * PP;                       // [C][SP]: U~, then U
    const int tid = threadIdx.x, gx = tid % TX, gy = tid / TX;
    const int h = blockIdx.y, j0 = blockIdx.x * NC, num_chunks = (p.T + C - 1) / C;
    float* state = p.state + (i64)h * D * D + j0;
    const float* work = p.work + (i64)h * num_chunks * Out::FLOATS;  // chunk c's at work + c FLOATS
    load_rows(ss, SP, state, D, D, NC);
#if GDN_ASYNC_COPY
    load_rows(sq, PITCH, work + Out::QS, D, C, D);  // chunk 0's Q' and P (later chunks': during the one before)
    load_rows(sp, PP, work + Out::P, C, C, C);
#endif
    for (int chunk = 0; chunk < num_chunks; ++chunk) {
        const float* in = work + chunk * Out::FLOATS;
        const int t0 = chunk * C, n = min(C, p.T - t0);
        load_rows(sw, PITCH, in + Out::W, D, C, D);
        load_rows(su, SP, in + Out::U + j0, D, C, NC);
#if GDN_ASYNC_COPY
        cp_async_commit();
        cp_async_wait<0>();
#else
        load_rows(sq, PITCH, in + Out::QS, D, C, D);
        load_rows(sp, PP, in + Out::P, C, C, C);
#endif
        __syncthreads();
        // U = U~ - W S and the inter-chunk part of O, Q' S: rows gy + TY a, columns 4 gx .. 4 gx + 3
        float4 uacc[RA], oacc[RA];
#pragma unroll
        for (int a = 0; a < RA; ++a) uacc[a] = oacc[a] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int r = 0; r < D; r += 4) {
            float4 s4[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) s4[m] = ld4(&ss[(r + m) * SP + 4 * gx]);
#pragma unroll
            for (int a = 0; a < RA; ++a) {
                const float4 w4 = ld4(&sw[(gy + TY * a) * PITCH + r]), q4 = ld4(&sq[(gy + TY * a) * PITCH + r]);
                fma4x4(uacc[a], w4, s4);
                fma4x4(oacc[a], q4, s4);
            }
        }
#pragma unroll
        for (int a = 0; a < RA; ++a) {
            float* at = &su[(gy + TY * a) * SP + 4 * gx];
            const float4 ut = ld4(at);
            st4(at, make_float4(ut.x - uacc[a].x, ut.y - uacc[a].y, ut.z - uacc[a].z, ut.w - uacc[a].w));
        }
        __syncthreads();
        load_rows(sw, PITCH, in + Out::KS, D, C, D);  // W is spent: K' in its place, read after the next barrier
#if GDN_ASYNC_COPY
        if (chunk + 1 < num_chunks) load_rows(sq, PITCH, in + Out::FLOATS + Out::QS, D, C, D);  // Q' is spent too
        cp_async_commit();
#endif
        // the intra-chunk part: O += P U (P is zero above the diagonal)
        for (int i = 0; i < C; i += 4) {
            float4 u4[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) u4[m] = ld4(&su[(i + m) * SP + 4 * gx]);
#pragma unroll
            for (int a = 0; a < RA; ++a) {
                fma4x4(oacc[a], ld4(&sp[(gy + TY * a) * PP + i]), u4);
            }
        }
#pragma unroll
        for (int a = 0; a < RA; ++a) {
            const int t = gy + TY * a;
            if (t < n) st4(&p.o[(i64)(t0 + t) * p.ld_o + (i64)h * D + j0 + 4 * gx], oacc[a]);
        }
#if GDN_ASYNC_COPY
        cp_async_wait<0>();  // K' (and the next chunk's Q') in
#endif
        __syncthreads();
#if GDN_ASYNC_COPY
        if (chunk + 1 < num_chunks) load_rows(sp, PP, in + Out::FLOATS + Out::P, C, C, C);  // P is spent
        cp_async_commit();
#endif
        // S = e^(c_end) S + K'^T U: rows RR gy .. RR gy + RR - 1, columns 4 gx .. 4 gx + 3
        {
            const float tail = in[Out::TAIL];
            float4 acc[RR];
#pragma unroll
            for (int m = 0; m < RR; ++m) {
                const float4 s4 = ld4(&ss[(RR * gy + m) * SP + 4 * gx]);
                acc[m] = make_float4(tail * s4.x, tail * s4.y, tail * s4.z, tail * s4.w);
            }
            for (int t = 0; t < C; ++t) {
                const float4 u4 = ld4(&su[t * SP + 4 * gx]);
#pragma unroll
                for (int m = 0; m < RR; ++m) fma4(acc[m], sw[t * PITCH + RR * gy + m], u4);
            }
#pragma unroll
            for (int m = 0; m < RR; ++m) st4(&ss[(RR * gy + m) * SP + 4 * gx], acc[m]);
        }
        __syncthreads();
    }
    copy_rows(state, D, ss, SP, D, NC);  // the state's columns back
}
