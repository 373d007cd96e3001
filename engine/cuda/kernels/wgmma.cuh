// Hopper's warpgroup MMA for the prefill GEMMs (kernels/gemm_wg.cu, gemm_ws.cu; built for sm_90a alone:
// instances.ARCH_FEATURE_FILES): the tile both use (128 rows x 128 tokens a block, two consumer warpgroups of 64
// rows), B's layout (the act layout's 16 halves of a step in the mma fragment's order, position p = 4 c + e holding
// k = 2 c + (e & 1) + 8 (e >> 1), so wgmma's k' is that position: a token's 32 bytes of a step are its rows of two
// core matrices), the MMA, fence and wait wrappers, A's regrouping to k' order, and the store.
#pragma once
#include "common.cuh"

#define WG_WARPS 8                      // the MMA warps: two warpgroups
#define WG_ROWS (WG_WARPS * 16)         // 128 rows a block
#define WG_TOKENS 128                   // a warpgroup's N
#define WG_STEP_BYTES (WG_TOKENS * 32)  // one step's B: 16 token groups x 2 core matrices x 128 bytes

// Matrix descriptor of a K-major B without swizzle at shared address `addr`: core matrices of 8 tokens x 16 bytes,
// the two k halves 128 bytes apart (leading dimension), the token groups 256 bytes apart (stride dimension).
__device__ __forceinline__ u64 wg_desc(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(128 >> 4) << 16) | ((u64)(256 >> 4) << 32);
}

// The 64 accumulators of an m64n128 wgmma (a thread's share of 64 x 128 f32), as asm operands %0-%63.
#define WG_D_REGS                                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                    \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                            \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                            \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
#define WG_D_OPERANDS                                                                                              \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),   \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),    \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),   \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),   \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),   \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),   \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),   \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d[64] += A (this warp's 16 rows of the warpgroup's 64, in registers) x B (16 x 128 at desc).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], const u32 (&a)[4], u64 desc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\nwgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_D_REGS
                 "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n}\n"
                 : WG_D_OPERANDS
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}

// d[64] += A (64 x 16 at desc_a) x B (16 x 128 at desc_b), both from shared memory, K-major.
__device__ __forceinline__ void wgmma_ss_m64n128k16(float (&d)[64], u64 desc_a, u64 desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\nwgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_D_REGS "%64, %65, 1, 1, 1, 0, 0;\n}\n"
                 : WG_D_OPERANDS
                 : "l"(desc_a), "l"(desc_b));
#endif
}

__device__ __forceinline__ void wg_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wg_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// The generic proxy's writes to shared memory (the cp.async copies) visible to wgmma's (the async proxy's) reads.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// The lane's A registers for k' = position (above) from its group of four lanes' mma fragments f (lane c: k 2 c,
// 2 c + 1 in f[0] / f[1] (rows g / g + 8) and k 2 c + 8, 2 c + 9 in f[2] / f[3]): k' 2 c, 2 c + 1 is lane c / 2's
// f[0] (c even) or f[2] (c odd), k' 2 c + 8, 2 c + 9 the same of lane 2 + c / 2.
__device__ __forceinline__ void wg_regroup(const u32 (&f)[4], int c, u32* a) {
    const int lo = ((threadIdx.x & 31) & ~3) | (c >> 1), hi = lo + 2;
    const bool odd = c & 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // rows g and g + 8
        const u32 lo0 = __shfl_sync(FULL_MASK, f[r], lo), lo2 = __shfl_sync(FULL_MASK, f[r + 2], lo);
        const u32 hi0 = __shfl_sync(FULL_MASK, f[r], hi), hi2 = __shfl_sync(FULL_MASK, f[r + 2], hi);
        a[r] = odd ? lo2 : lo0;
        a[r + 2] = odd ? hi2 : hi0;
    }
}

// y[tok, row] = d (+ residual) for a warp's share of a warpgroup's 64 x 128: d[4 i + e] is row g (e < 2) or g + 8
// of the warp's 16 from row0, token 8 i + 2 c + (e & 1) of the 128 from tok0.
__device__ __forceinline__ void wg_store(const float (&d)[64], float* y, const float* residual, int row0, int tok0,
                                         int rows, int T, int ldy, int g, int c) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = row0 + g + 8 * (e >> 1), tok = tok0 + 8 * i + 2 * c + (e & 1);
            if (row >= rows || tok >= T) continue;
            float v = d[4 * i + e];
            if (residual) v += residual[(i64)tok * ldy + row];
            y[(i64)tok * ldy + row] = v;
        }
}
