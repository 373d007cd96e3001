// Single weights of the device layout as f32 (embedding rows: EMBED and MTP_IN), for every weight type.
// The formats are those of engine/cuda/repack.py (planes; Q6_K regrouped; the K-quant words tiled), read through
// a WeightRef.
#pragma once
#include "mk_common.cuh"

__device__ __forceinline__ void k4_scale_min_at(const u8* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

__device__ __forceinline__ float h2f(const u8* p) { return f16_to_f32(*reinterpret_cast<const f16*>(p)); }

// Weight (row, k) of w (row relative to w.row_offset).
template <int QT> __device__ float weight_at(const WeightRef& w, int row, int k);

template <> __device__ float weight_at<QT_F32>(const WeightRef& w, int row, int k) {
    return reinterpret_cast<const float*>(w.ptr)[(i64)(w.row_offset + row) * w.cols + k];
}
template <> __device__ float weight_at<QT_F16>(const WeightRef& w, int row, int k) {
    return f16_to_f32(reinterpret_cast<const f16*>(w.ptr)[(i64)(w.row_offset + row) * w.cols + k]);
}
template <> __device__ float weight_at<QT_Q4_0>(const WeightRef& w, int row, int k) {
    const i64 nb = w.cols / 32, ntot = (i64)w.rows_total * nb, idx = (w.row_offset + row) * nb + k / 32;
    const int l = k % 32, q = (w.ptr[idx * 16 + (l & 15)] >> (l >= 16 ? 4 : 0)) & 0xF;
    return h2f(w.ptr + ntot * 16 + idx * 2) * (q - 8);
}
template <> __device__ float weight_at<QT_Q5_0>(const WeightRef& w, int row, int k) {
    const i64 nb = w.cols / 32, ntot = (i64)w.rows_total * nb, idx = (w.row_offset + row) * nb + k / 32;
    const int l = k % 32;
    const u32 qh = *reinterpret_cast<const u32*>(w.ptr + ntot * 16 + idx * 4);
    const int q = ((w.ptr[idx * 16 + (l & 15)] >> (l >= 16 ? 4 : 0)) & 0xF) | (((qh >> l) & 1) << 4);
    return h2f(w.ptr + ntot * 20 + idx * 2) * (q - 16);
}
template <> __device__ float weight_at<QT_Q8_0>(const WeightRef& w, int row, int k) {
    const i64 nb = w.cols / 32, ntot = (i64)w.rows_total * nb, idx = (w.row_offset + row) * nb + k / 32;
    return h2f(w.ptr + ntot * 32 + idx * 2) * (float)(i8)w.ptr[idx * 32 + k % 32];
}
template <> __device__ float weight_at<QT_Q4_K>(const WeightRef& w, int row, int k) {
    const i64 nb = w.cols / 256, ntot = (i64)w.rows_total * nb, idx = (w.row_offset + row) * nb + k / 256;
    const int p = k % 256, q = (w.ptr[idx * 128 + 32 * (p / 64) + p % 32] >> (4 * ((p / 32) & 1))) & 0xF;
    int sc, m;
    const int r = w.row_offset + row;
    k4_scale_min_at(tile_scales(w.ptr + ntot * 128, (int)nb, r, k / 256), p / 32, sc, m);
    const u8* dm = tile_dm(w.ptr + ntot * 128, (int)nb, r, k / 256);
    return h2f(dm) * sc * q - h2f(dm + 2) * m;
}
template <> __device__ float weight_at<QT_Q5_K>(const WeightRef& w, int row, int k) {
    const i64 nb = w.cols / 256, ntot = (i64)w.rows_total * nb, idx = (w.row_offset + row) * nb + k / 256;
    const int p = k % 256, chunk = p / 64, l = p % 32, high = (p / 32) & 1;
    const int hbit = (w.ptr[ntot * 128 + idx * 32 + l] >> (2 * chunk + high)) & 1;
    const int q = ((w.ptr[idx * 128 + 32 * chunk + l] >> (4 * high)) & 0xF) | (hbit << 4);
    int sc, m;
    const int r = w.row_offset + row;
    k4_scale_min_at(tile_scales(w.ptr + ntot * 160, (int)nb, r, k / 256), p / 32, sc, m);
    const u8* dm = tile_dm(w.ptr + ntot * 160, (int)nb, r, k / 256);
    return h2f(dm) * sc * q - h2f(dm + 2) * m;
}
template <> __device__ float weight_at<QT_Q6_K>(const WeightRef& w, int row, int k) {
    const i64 nb = w.cols / 256, ntot = (i64)w.rows_total * nb, idx = (w.row_offset + row) * nb + k / 256;
    const int p = k % 256, chunk = p / 64, within = p % 64, high = within / 32, l = within % 32;
    const int low4 = (w.ptr[idx * 128 + 32 * chunk + l] >> (4 * high)) & 0xF;
    const int hi2 = (w.ptr[ntot * 128 + idx * 64 + 16 * chunk + (l & 15)] >> (2 * high + 4 * (l >= 16))) & 3;
    const int sc = (int)(i8)w.ptr[ntot * 192 + idx * 16 + p / 16];
    return h2f(w.ptr + ntot * 208 + idx * 2) * sc * ((low4 | (hi2 << 4)) - 32);
}

template <int QT>
__device__ void weight_row_range(const WeightRef& w, int row, int k0, int k1, float* out, int stride, int first) {
    for (int k = k0 + first; k < k1; k += stride) out[k - k0] = weight_at<QT>(w, row, k);
}

// out[k - k0] = W[row][k] for k in [k0, k1), threads `first`, `first + stride`, ... sharing the work.
__device__ __noinline__ void weight_row(const Globals& g, const WeightRef& w, int row, int k0, int k1, float* out, int stride,
                           int first) {
    switch (w.qtype) {
        case QT_Q4_K: weight_row_range<QT_Q4_K>(w, row, k0, k1, out, stride, first); break;
        case QT_Q5_K: weight_row_range<QT_Q5_K>(w, row, k0, k1, out, stride, first); break;
        case QT_Q6_K: weight_row_range<QT_Q6_K>(w, row, k0, k1, out, stride, first); break;
        case QT_Q8_0: weight_row_range<QT_Q8_0>(w, row, k0, k1, out, stride, first); break;
        case QT_Q5_0: weight_row_range<QT_Q5_0>(w, row, k0, k1, out, stride, first); break;
        case QT_Q4_0: weight_row_range<QT_Q4_0>(w, row, k0, k1, out, stride, first); break;
        case QT_F16: weight_row_range<QT_F16>(w, row, k0, k1, out, stride, first); break;
        case QT_F32: weight_row_range<QT_F32>(w, row, k0, k1, out, stride, first); break;
        default:
            if (first == 0) mk_fail(g, ERR_BAD_QTYPE, blockIdx.x, -1, w.qtype, 1, 0, 0);
    }
}
