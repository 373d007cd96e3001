// Weights into L2 ahead of the matmul that reads them (engine/cuda/ops.py prefetch_l2).
//
// Between two matmuls of a decode or verify pass run kernels that read little from memory (the producers, the
// convolution, the delta rule, attention) and the gaps between launches: DRAM idles for about a fifth of a pass.
// Launched beside them on the side stream, this kernel asks for the next matmul's first bytes then, so that the
// matmul finds them in L2 instead of waiting on DRAM. It only issues requests (a prefetch never blocks and never
// faults) and returns; nothing waits for the bytes, and nothing is wrong if they are evicted before use.
#include "common.cuh"

#define L2P_MAX_RANGES 8
#define L2P_CHUNK 16384  // bytes a request (sm_90+: one bulk prefetch; before: a 128-byte line per lane and step)

// Byte ranges [ptr, ptr + bytes), each 16-byte aligned and a multiple of 16 long (mirror of ops.L2Ranges).
struct L2Ranges {
    u64 ptr[L2P_MAX_RANGES];
    u64 bytes[L2P_MAX_RANGES];
    int n;
};

__device__ __forceinline__ void prefetch_chunk(u64 p, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    for (u32 o = 0; o < bytes; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

// The ranges' chunks of L2P_CHUNK bytes, numbered across the ranges in order, one a thread and step of the grid.
__global__ void __launch_bounds__(128) l2_prefetch(const __grid_constant__ L2Ranges r) {
    const u64 step = (u64)gridDim.x * blockDim.x;
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;  // this thread's next chunk, counted from range i's first
    for (int i = 0; i < r.n; ++i) {
        const u64 chunks = (r.bytes[i] + L2P_CHUNK - 1) / L2P_CHUNK;
        for (; t < chunks; t += step)
            prefetch_chunk(r.ptr[i] + t * L2P_CHUNK, (u32)min((u64)L2P_CHUNK, r.bytes[i] - t * L2P_CHUNK));
        t -= chunks;
    }
}
