// bench/gpu_stream.py: how fast the H200 streams a matrix's bytes with no decoding at all. Each warp reads a
// contiguous range of 16-byte words, UNROLL loads in flight per lane, and folds them into one value so that the
// loads cannot be dropped; the result (one float per warp) is written only to keep the compiler honest.
#include "common.cuh"

#define PROBE_UNROLL 8

extern "C" __global__ void __launch_bounds__(256)
stream_read(const uint4* __restrict__ src, float* __restrict__ out, long long words, long long per_warp) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long begin = warp * per_warp, end = min(begin + per_warp, words);
    u32 fold = 0;
    for (long long i = begin + lane; i < end; i += 32 * PROBE_UNROLL) {
        uint4 v[PROBE_UNROLL];
#pragma unroll
        for (int j = 0; j < PROBE_UNROLL; ++j) {
            const long long k = i + 32LL * j;
            v[j] = k < end ? __ldg(src + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < PROBE_UNROLL; ++j) fold ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) fold ^= __shfl_xor_sync(FULL_MASK, fold, m);
    if (lane == 0) out[warp] = __int_as_float(fold & 0x007FFFFFu);
}
