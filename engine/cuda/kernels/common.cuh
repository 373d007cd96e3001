// Shared device helpers: fixed-width types, f16 without cuda_fp16.h, warp reductions, mma.sync, cache-hinted loads.
// NVRTC needs no CUDA headers for anything here, so kernels compile from the cuda-toolkit[nvrtc] wheel alone.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// A half is carried as its bit pattern; a pair of halves (f16x2) as one u32, low half first.
typedef u16 f16;

// ---- programmatic dependent launch (sm_90+) ----
// Under PDL (engine/cuda/device.py PDL_POLICIES: by default the passes of 1, 2, 4 and 5-8 tokens on sm_90+, every
// pass with OPENJET_CUDA_PDL=1) every kernel here is launched so that it may start while its predecessor is still
// finishing: the launch latency and the first loads of constant data (weights) then overlap the previous kernel's
// tail. pdl_wait() returns once the predecessor has completed and its writes are visible,
// so every kernel runs PDL_ENTER() before it reads anything an earlier kernel wrote or writes anything an earlier
// kernel reads; only loads of weights may come before it. pdl_launch_dependents() lets the next kernel's blocks
// be scheduled into whatever this one leaves free (they wait in their own PDL_ENTER). Without PDL, or before
// sm_90, both do nothing. tests/kernels/test_pdl.py checks that every kernel calls it.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#define PDL_ENTER()               \
    do {                          \
        pdl_wait();               \
        pdl_launch_dependents();  \
    } while (0)

#define WARP_SIZE 32
#define NEG_INF __int_as_float(0xff800000)
#define FULL_MASK 0xffffffffu

// ---- f16 conversions and f16x2 arithmetic (PTX, round to nearest even) ----

__device__ __forceinline__ f16 f32_to_f16(float x) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ float f16_to_f32(f16 h) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
    return x;
}

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
}

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// Byte permute: result byte j = byte (sel >> 4j) & 7 of the 8-byte value {b, a}.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// (a & b) | c in one LOP3.
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// f16x2 constants built from two f32 (host-free: the compiler folds the conversion of literals).
#define F16X2_1024 0x64006400u  // (1024, 1024)

// ---- warp reductions ----

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Butterfly sums of N values at once: the N shuffle chains interleave instead of running back to back.
template <int N>
__device__ __forceinline__ void warp_sum_n(float (&v)[N]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] += __shfl_xor_sync(FULL_MASK, v[j], o);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch /* [32] shared */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < num_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch /* [32] shared */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < num_warps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

// ---- tensor cores: D = A(16x16 f16, row) * B(16x8 f16, col) + C (f32) ----
// Fragments (g = lane / 4, c = lane % 4): a[0] = A[g][2c..2c+1], a[1] = A[g+8][2c..], a[2] = A[g][2c+8..],
// a[3] = A[g+8][2c+8..]; b[0] = B[2c..2c+1][g], b[1] = B[2c+8..2c+9][g]; d[0..1] = D[g][2c..2c+1],
// d[2..3] = D[g+8][2c..2c+1].
__device__ __forceinline__ void mma_f16_16816(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- tensor cores, integers: D = A(16x32 u8, row) * B(32x8 s8, col), int32, C = 0 ----
// Fragments: a[0] = A[g][4c..4c+3], a[1] = A[g+8][4c..], a[2] = A[g][16+4c..], a[3] = A[g+8][16+4c..]; b[0] =
// B[4c..4c+3][g], b[1] = B[16+4c..][g]; d as mma_f16_16816's. Every product and sum is exact.
__device__ __forceinline__ void mma_u8s8_16832(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// The same, accumulating: D += A * B in int32.
__device__ __forceinline__ void mma_u8s8_16832_acc(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with a signed A (kernels/mmvq_i8q6.cu: Q6_K's q - 32), accumulating.
__device__ __forceinline__ void mma_s8s8_16832_acc(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 f16 matrices from shared memory: lanes 8i .. 8i + 7 give the 16-byte row addresses of matrix i, and
// lane (g, c) receives elements (g, 2c), (g, 2c + 1) of each (with .trans: (2c, g), (2c + 1, g)).
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// ---- loads ----

// Weights are read once per pass: stream them past L1 so activations stay cached there.
__device__ __forceinline__ uint4 ld_stream_u4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 ld_stream_u32(const void* p) {
    u32 v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 ld_stream_u16(const void* p) {
    u16 v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// ---- asynchronous global -> shared copies (cp.async, sm_80+): bytes in flight without registers ----

// The shared-memory address (32-bit, .shared window) of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

// 16 bytes, cached in L2 only (weights are streamed once).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// 16 bytes, allocated in L1 as well (data that other blocks on the SM read again).
__device__ __forceinline__ void cp_async16_ca(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// 16 bytes of which the first src_bytes (0 or 16) are read and the rest zero-filled.
__device__ __forceinline__ void cp_async16z(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// 4 bytes of which the first src_bytes are read and the rest zero-filled (src 4-byte aligned).
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, u32 src_bytes = 4u) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// The weight streams' copies (stage.cuh). WEIGHT_EVICT_FIRST (default 1; the megakernel's MK_W_EVICT_FIRST) marks
// their lines first to go from L2: a pass reads each weight once, and at normal priority its ~16 GB turn the 60 MB
// L2 over every ~15 us, taking with them what is read again (each launch's code and parameters, the activations,
// the megakernel's code and counters). H200, 2026-12-05: the 27B pass 6.88 -> 6.74 ms at T = 1, 9.59 -> 9.37 at
// T = 5 (bench/NOTES.md Y0); the megakernel's d = 0 cycle 12.10 -> 10.74 ms. The prefill GEMMs read each weight
// tile again for every token tile, so they keep normal priority (gemm.cu, gemm_wg.cu: 0 before this header).
#ifndef WEIGHT_EVICT_FIRST
#define WEIGHT_EVICT_FIRST 1
#endif
// The policy `createpolicy.fractional.L2::evict_first.b64 p, 1.0` makes (NVRTC 13 folds it to this constant on
// sm_80, 89, 90 and 120), written as the constant: in the megakernel the instruction's result sat in a register
// pair and moved to uniform registers before every copy.
__device__ __forceinline__ u64 l2_evict_first() { return 0x12F0000000000000ull; }
__device__ __forceinline__ void cp_async16_w(u32 dst, const void* src) {
#if WEIGHT_EVICT_FIRST
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "l"(l2_evict_first()) : "memory");
#else
    cp_async16(dst, src);
#endif
}
__device__ __forceinline__ void cp_async4_w(u32 dst, const void* src, u32 src_bytes) {
#if WEIGHT_EVICT_FIRST
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;" ::"r"(dst), "l"(src),
                 "r"(src_bytes), "l"(l2_evict_first()) : "memory");
#else
    cp_async4(dst, src, src_bytes);
#endif
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Activations are re-read by every row block: cached loads.
__device__ __forceinline__ uint2 ld_cached_u2(const void* p) {
    return __ldg(reinterpret_cast<const uint2*>(p));
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }
