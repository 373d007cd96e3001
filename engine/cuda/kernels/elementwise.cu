// Small element-wise kernels: SwiGLU, embedding lookup from the device weight layout, gating.
#include "common.cuh"
#include "quants.cuh"

// out[t, i] = silu(gate[t, i]) * up[t, i]; gate and up are column ranges of one fused projection y[T, ld_in].
__global__ void __launch_bounds__(256)
swiglu(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out, int T, int F,
       int ld_in, int ld_out) {
    PDL_ENTER();
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)T * F) return;
    const int t = idx / F, i = idx % F;
    const float g = gate[(i64)t * ld_in + i];
    out[(i64)t * ld_out + i] = siluf_(g) * up[(i64)t * ld_in + i];
}

// x[t, i] *= sigmoid(gate[t, i]) (qwen35's gated attention output); gate rows strided by ld_gate.
__global__ void __launch_bounds__(256)
sigmoid_mul(float* __restrict__ x, const float* __restrict__ gate, int T, int N, int ld_x, int ld_gate) {
    PDL_ENTER();
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)T * N) return;
    const int t = idx / N, i = idx % N;
    x[(i64)t * ld_x + i] *= sigmoidf_(gate[(i64)t * ld_gate + i]);
}

// One weight of the device layout (quants.cuh) of row `row`, position k, as f32: the embedding lookup reads the
// same upload as the output head when the two are tied.
template <int QT> __device__ float dequant_one(const u8* w, i64 ntot, int nb, int row, int k);

template <> __device__ float dequant_one<QT_F32>(const u8* w, i64 ntot, int nb, int row, int k) {
    return reinterpret_cast<const float*>(w)[(i64)row * nb + k];
}
template <> __device__ float dequant_one<QT_F16>(const u8* w, i64 ntot, int nb, int row, int k) {
    return f16_to_f32(reinterpret_cast<const f16*>(w)[(i64)row * nb + k]);
}
template <> __device__ float dequant_one<QT_Q4_0>(const u8* w, i64 ntot, int nb, int row, int k) {
    const i64 idx = (i64)row * nb + k / 32;
    const int l = k % 32;
    const int q = (w[idx * 16 + (l & 15)] >> (l >= 16 ? 4 : 0)) & 0xF;
    return f16_to_f32(*reinterpret_cast<const f16*>(w + ntot * 16 + idx * 2)) * (q - 8);
}
template <> __device__ float dequant_one<QT_Q5_0>(const u8* w, i64 ntot, int nb, int row, int k) {
    const i64 idx = (i64)row * nb + k / 32;
    const int l = k % 32;
    const u32 qh = *reinterpret_cast<const u32*>(w + ntot * 16 + idx * 4);
    const int q = ((w[idx * 16 + (l & 15)] >> (l >= 16 ? 4 : 0)) & 0xF) | (((qh >> l) & 1) << 4);
    return f16_to_f32(*reinterpret_cast<const f16*>(w + ntot * 20 + idx * 2)) * (q - 16);
}
template <> __device__ float dequant_one<QT_Q8_0>(const u8* w, i64 ntot, int nb, int row, int k) {
    const i64 idx = (i64)row * nb + k / 32;
    const int q = (int)(i8)w[idx * 32 + k % 32];
    return f16_to_f32(*reinterpret_cast<const f16*>(w + ntot * 32 + idx * 2)) * q;
}
__device__ __forceinline__ void k4_scale_min(const u8* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
template <> __device__ float dequant_one<QT_Q4_K>(const u8* w, i64 ntot, int nb, int row, int k) {
    const i64 idx = (i64)row * nb + k / 256;
    const int p = k % 256, chunk = p / 64, l = p % 32, high = (p / 32) & 1;
    const int q = (w[idx * 128 + 32 * chunk + l] >> (4 * high)) & 0xF;
    int sc, m;
    k4_scale_min(tile_scales(w + ntot * 128, nb, row, k / 256), p / 32, sc, m);
    const f16* dm = reinterpret_cast<const f16*>(tile_dm(w + ntot * 128, nb, row, k / 256));
    return f16_to_f32(dm[0]) * sc * q - f16_to_f32(dm[1]) * m;
}
template <> __device__ float dequant_one<QT_Q5_K>(const u8* w, i64 ntot, int nb, int row, int k) {
    const i64 idx = (i64)row * nb + k / 256;
    const int p = k % 256, chunk = p / 64, l = p % 32, high = (p / 32) & 1;
    const int hbit = (w[ntot * 128 + idx * 32 + l] >> (2 * chunk + high)) & 1;
    const int q = ((w[idx * 128 + 32 * chunk + l] >> (4 * high)) & 0xF) | (hbit << 4);
    int sc, m;
    k4_scale_min(tile_scales(w + ntot * 160, nb, row, k / 256), p / 32, sc, m);
    const f16* dm = reinterpret_cast<const f16*>(tile_dm(w + ntot * 160, nb, row, k / 256));
    return f16_to_f32(dm[0]) * sc * q - f16_to_f32(dm[1]) * m;
}
template <> __device__ float dequant_one<QT_Q6_K>(const u8* w, i64 ntot, int nb, int row, int k) {
    // regrouped layout (repack.py): ql' chunk c byte l: 64c + l (low), 64c + 32 + l (high);
    // qh' chunk c byte l < 16: bit pairs for 64c + l, 64c + 32 + l, 64c + 16 + l, 64c + 48 + l
    const i64 idx = (i64)row * nb + k / 256;
    const int p = k % 256, chunk = p / 64, within = p % 64, high = within / 32, l = within % 32;
    const int low4 = (w[idx * 128 + 32 * chunk + l] >> (4 * high)) & 0xF;
    const int shift = 2 * high + 4 * (l >= 16);
    const int hi2 = (w[ntot * 128 + idx * 64 + 16 * chunk + (l & 15)] >> shift) & 3;
    const int sc = (int)(i8)w[ntot * 192 + idx * 16 + p / 16];
    return f16_to_f32(*reinterpret_cast<const f16*>(w + ntot * 208 + idx * 2)) * sc * ((low4 | (hi2 << 4)) - 32);
}

// out[t, :] = W[ids[t], :] for t < T (ids on the device); grid (T, ceil(H / 256)).
template <int QT>
__global__ void __launch_bounds__(256)
get_rows(const u8* __restrict__ w, const i32* __restrict__ ids, float* __restrict__ out, int rows, int H, int nb,
         int ld_out) {
    PDL_ENTER();
    const int t = blockIdx.x, k = blockIdx.y * blockDim.x + threadIdx.x;
    if (k >= H) return;
    const int row = ids[t];
    const bool ok = row >= 0 && row < rows;  // the host validates ids; a bad one reads as NaN, never out of bounds
    out[(i64)t * ld_out + k] = ok ? dequant_one<QT>(w, (i64)rows * nb, nb, row, k) : __int_as_float(0x7fc00000);
}
