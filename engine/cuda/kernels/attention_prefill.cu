// Causal grouped-query attention over the f16 KV cache for a prefill run (engine/reference/ops.py: attention;
// attention.cu has the decode/verify kernel with key splits), flash-attention style on mma.sync with f16 operands
// and f32 accumulation, no key splits. A block owns one KV head and ATTN_MMA_ROWS query rows of it, row R being
// (token R / G, query head kvh G + R % G); warp w takes rows 16 w .. 16 w + 15. Per tile of ATTN_MMA_KEYS keys the
// block copies K and V (f16, zero past the visible length) into shared memory by cp.async; each warp forms S = Q K^T
// (A fragments of Q by ldmatrix, B of K by ldmatrix), masks and exponentiates it into P with an online softmax
// (rows g and g + 8 of the lane, their max and sum shared by the quad), and adds P V (P's accumulator fragments
// are the A fragments of the next mma; V's B fragments by ldmatrix.trans). Rows of D + 8 halves keep the eight
// row addresses of every ldmatrix in different banks. Dynamic shared memory 3 * ATTN_MMA_ROWS * (D + 8) * 2 bytes.
#include "attention.cuh"

#define ATTN_MMA_ROWS 64
#define ATTN_MMA_KEYS 64

template <int D>
__global__ void __launch_bounds__(128) attn_mma(AttnArgs a) {
    PDL_ENTER();
    constexpr int P = D + 8, NT = D / 8;  // row pitch (halves); 8-wide output tiles per row
    extern __shared__ __align__(16) f16 smem_h[];
    f16* sq = smem_h;                     // [ROWS][P] queries
    f16* sk = sq + ATTN_MMA_ROWS * P;     // [KEYS][P] the key tile
    f16* sv = sk + ATTN_MMA_KEYS * P;     // [KEYS][P] the value tile
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int kvh = blockIdx.x, r0 = blockIdx.y * ATTN_MMA_ROWS;
    const int G = a.num_heads / a.num_kv_heads, rows = a.T * G;
    for (int i = tid; i < ATTN_MMA_ROWS * D / 2; i += 128) {  // queries as f16 pairs; rows past the run zero
        const int lr = i / (D / 2), d = 2 * (i % (D / 2)), row = r0 + lr;
        u32 v = 0u;
        if (row < rows) {
            const float* q = a.q + (i64)(row / G) * a.ld_q + (i64)(kvh * G + row % G) * a.q_head_stride + d;
            v = pack_f16x2(q[0], q[1]);
        }
        *reinterpret_cast<u32*>(sq + lr * P + d) = v;
    }
    // the lane's two rows: their positions (-1: past the run, sees nothing) and the block's visible length
    const int row_a = r0 + 16 * warp + g, row_b = row_a + 8;
    const int pos_a = row_a < rows ? a.positions[row_a / G] : -1, pos_b = row_b < rows ? a.positions[row_b / G] : -1;
    const int kv_len = a.positions[(min(rows, r0 + ATTN_MMA_ROWS) - 1) / G] + 1;  // the block's last row sees most
    const f16* kc = a.kcache + (i64)kvh * a.capacity * D;
    const f16* vc = a.vcache + (i64)kvh * a.capacity * D;
    const float scale_log2 = a.scale * 1.4426950408889634f;
    const u32 sq_s = smem_u32(sq), sk_s = smem_u32(sk), sv_s = smem_u32(sv);
    // ldmatrix row addresses of this lane (matrix i = lane / 8, its row lane % 8): for Q (A fragments: matrices
    // rows 0-7 | 8-15 by columns 0-7 | 8-15), for K (B: keys 0-7 | 8-15 of a 16-key pair, columns 0-7 | 8-15 within
    // each), for V (B of P V, transposed: keys 0-7 | 8-15 by dims 0-7 | 8-15)
    const int mi = lane >> 3, mr = lane & 7;
    const u32 q_addr = sq_s + 2 * ((16 * warp + mr + 8 * (mi & 1)) * P + 8 * (mi >> 1));
    const u32 k_addr = sk_s + 2 * ((mr + 8 * (mi >> 1)) * P + 8 * (mi & 1));
    const u32 v_addr = sv_s + 2 * ((mr + 8 * (mi & 1)) * P + 8 * (mi >> 1));

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.f, l_b = 0.f;
    for (int k0 = 0; k0 < kv_len; k0 += ATTN_MMA_KEYS) {
        __syncthreads();  // every warp is done with the previous tile (and, the first time, the queries are in)
        for (int i = tid; i < ATTN_MMA_KEYS * D / 8; i += 128) {
            const int key = i / (D / 8), d = 8 * (i % (D / 8));
            const bool live = k0 + key < kv_len;
            const i64 at = (i64)(live ? k0 + key : 0) * D + d;
            cp_async16z(sk_s + 2 * (key * P + d), kc + at, live ? 16u : 0u);
            cp_async16z(sv_s + 2 * (key * P + d), vc + at, live ? 16u : 0u);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        // S = Q K^T over the tile: 8 key tiles of 8
        float s[ATTN_MMA_KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < ATTN_MMA_KEYS / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            u32 qa[4];
            ldmatrix_x4(qa, q_addr + 32 * ks);
#pragma unroll
            for (int np = 0; np < ATTN_MMA_KEYS / 16; ++np) {
                u32 kb[4];
                ldmatrix_x4(kb, k_addr + 2 * (16 * np * P) + 32 * ks);
                mma_f16_16816(s[2 * np], qa, kb);
                mma_f16_16816(s[2 * np + 1], qa, kb + 2);
            }
        }
        // online softmax: mask, tile max per row, rescale what came before
        float mx_a = NEG_INF, mx_b = NEG_INF;
#pragma unroll
        for (int j = 0; j < ATTN_MMA_KEYS / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = k0 + 8 * j + 2 * c + e;
                s[j][e] = key <= pos_a ? s[j][e] * scale_log2 : NEG_INF;
                s[j][2 + e] = key <= pos_b ? s[j][2 + e] * scale_log2 : NEG_INF;
                mx_a = fmaxf(mx_a, s[j][e]);
                mx_b = fmaxf(mx_b, s[j][2 + e]);
            }
        mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, 1));
        mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, 2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, 1));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, 2));
        const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
        // a row that has seen no key yet keeps m = -inf: its p are 0 and nothing is rescaled
        const float base_a = new_a == NEG_INF ? 0.f : new_a, base_b = new_b == NEG_INF ? 0.f : new_b;
        const float corr_a = exp2f(m_a - base_a), corr_b = exp2f(m_b - base_b);
        m_a = new_a;
        m_b = new_b;
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int j = 0; j < ATTN_MMA_KEYS / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                s[j][e] = exp2f(s[j][e] - base_a);
                s[j][2 + e] = exp2f(s[j][2 + e] - base_b);
                sum_a += s[j][e];
                sum_b += s[j][2 + e];
            }
        l_a = l_a * corr_a + sum_a;
        l_b = l_b * corr_b + sum_b;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= corr_a;
            o[n][1] *= corr_a;
            o[n][2] *= corr_b;
            o[n][3] *= corr_b;
        }
        // O += P V: P's key tiles 2kk, 2kk + 1 are the A fragment of keys 16 kk .. 16 kk + 15
#pragma unroll
        for (int kk = 0; kk < ATTN_MMA_KEYS / 16; ++kk) {
            const u32 pa[4] = {pack_f16x2(s[2 * kk][0], s[2 * kk][1]), pack_f16x2(s[2 * kk][2], s[2 * kk][3]),
                               pack_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
                u32 vb[4];
                ldmatrix_x4_trans(vb, v_addr + 2 * (16 * kk * P) + 32 * np);
                mma_f16_16816(o[2 * np], pa, vb);
                mma_f16_16816(o[2 * np + 1], pa, vb + 2);
            }
        }
    }
    cp_async_wait<0>();
    l_a += __shfl_xor_sync(FULL_MASK, l_a, 1);
    l_a += __shfl_xor_sync(FULL_MASK, l_a, 2);
    l_b += __shfl_xor_sync(FULL_MASK, l_b, 1);
    l_b += __shfl_xor_sync(FULL_MASK, l_b, 2);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = half ? row_b : row_a;
        if (row >= rows) continue;
        const float l = half ? l_b : l_a, inv = l > 0.f ? 1.f / l : 0.f;
        const int t = row / G, h = kvh * G + row % G;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int d = 8 * n + 2 * c + e;
                float val = o[n][2 * half + e] * inv;
                if (a.gate) val *= sigmoidf_(a.gate[(i64)t * a.ld_gate + (i64)h * a.gate_head_stride + d]);
                a.out[(i64)t * a.ld_out + (i64)h * D + d] = val;
            }
    }
}
