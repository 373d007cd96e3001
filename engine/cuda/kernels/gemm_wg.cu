// The prefill matmul on Hopper's warpgroup MMA (wgmma): built for sm_90a alone (instances.ARCH_FEATURE_FILES; on
// every other target the kernel traps), run by ops.matmul where OPENJET_CUDA_GEMM_WG asks for it (off by default:
// bench/gpu_gemm_wg.py checks and times it against gemm_cp first, bench/NOTES.md Y3).
//
// y[T, rows] = x[T, K] @ W^T (+ residual) for a K-quant W with a Stage (Q4_K, Q6_K: gemm_cp's types), decoded
// to scaled f16 (FullFrag). A block is two warpgroups, 128 rows x 128 tokens: each warp decodes its 16 rows of a
// superblock (the weights staged by cp.async exactly as gemm_cp stages them) into the A registers of m64n128k16
// (per warp the fragment of mma.sync's m16n8k16), and the 128 tokens' activations of the superblock wait in shared
// memory as B, in wgmma's K-major core matrices without swizzle. The act layout keeps each token's 16 halves of a
// step in the mma fragment's order, position p = 4 c + e holding k = 2 c + (e & 1) + 8 (e >> 1), so B's k' (what
// wgmma takes for k) is that position: a token's 32 bytes of a step are its rows of two core matrices, copied as
// they are, and the A registers are regrouped to match (wg_regroup). Two slots (weights + activations)
// double-buffer the superblocks. OVERLAP = false asks for superblock sb + 1 before the barrier that says sb has
// landed, and ends each superblock with a second barrier (every warpgroup done with its slot); true asks for sb + 1
// right after that first barrier (which already says both warpgroups are done with sb - 1's slot: each drains its
// wgmmas at the end of a superblock), one barrier a superblock. (Leaving the wgmmas in flight across superblocks
// made ptxas serialise them: it cannot follow the A registers around the loop.)
#ifndef WEIGHT_EVICT_FIRST
#define WEIGHT_EVICT_FIRST 0  // a weight tile is read again by every token tile (common.cuh)
#endif
#include "common.cuh"
#include "quants.cuh"
#include "stage.cuh"

#define WG_WARPS 8                      // two warpgroups
#define WG_ROWS (WG_WARPS * 16)         // 128 rows a block
#define WG_TOKENS 128                   // a warpgroup's N
#define WG_STEP_BYTES (WG_TOKENS * 32)  // one step's B: 16 token groups x 2 core matrices x 128 bytes
#define WG_ACT_BYTES (SB_STEPS * WG_STEP_BYTES)  // 64 KB a superblock
#define WG_SMEM_BYTES (2 * (WG_WARPS * 4096 + WG_ACT_BYTES) + 128)  // the launch's: two slots, any type, aligned

template <int QT>
struct WgStage {
    static constexpr int WEIGHTS = WG_WARPS * Stage<QT>::BYTES, BYTES = WEIGHTS + WG_ACT_BYTES;
    static_assert(WEIGHTS % 128 == 0, "the activations start 128-byte aligned");
    static_assert(2 * BYTES + 127 <= WG_SMEM_BYTES, "two slots fit the launch's shared memory");
};

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

template <int QT, bool OVERLAP>
__global__ void __launch_bounds__(WG_WARPS * 32, 1)
gemm_wg(const u8* __restrict__ w, const f16* __restrict__ act, float* __restrict__ y,
        const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    PDL_ENTER();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Q = QTraits<QT>;
    using F = FullFrag<QT>;
    using S = Stage<QT>;
    using G = WgStage<QT>;
    constexpr int THREADS = WG_WARPS * 32;
    extern __shared__ __align__(128) u8 ring[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    // x: the row tile, fastest, so the blocks running at once share their tokens' activations (L2) and a wave of
    // them reads each row tile's weights once for the next token tiles too (the 27B's ffn_up: 50 MB of Q4_K, where
    // token tiles fastest would read all 84 MB of an 8,192-token act from DRAM once per row tile)
    const int row0 = blockIdx.x * WG_ROWS + warp * 16, tok0 = blockIdx.y * WG_TOKENS;
    const int nsb = K / QK_SB, groups = (T + 7) / 8;
    const u64 ntot = (u64)rows * nsb;
    const Planes P = Q::planes(w, ntot);
    const u32 ring_s = (smem_u32(ring) + 127) & ~127u;  // the descriptors address 16-byte units; keep 128
    const u8* ring_g = ring + (ring_s - smem_u32(ring));
    typename S::Lane L;
    S::init(L, row0, rows, nsb, lane);
    const u32 base[2] = {stage_row_base(row0, g, rows, nsb), stage_row_base(row0, g + 8, rows, nsb)};
    const i64 group_halves = (i64)nsb * 2048;  // one 8-token group of the act layout

    // Superblock sb into slot: the warp's weight tile, then the activations as core matrices: 16-byte chunk q of
    // the slot's 4096 is step s = q / 256, token group tg = (q / 16) % 16, token n = (q / 2) % 8, half kh = q % 2
    // of the token's 32 bytes, which is row n of core matrix (tg, kh). Groups past T are zero-filled.
    auto copy_stage = [&](int slot, int sb) {
        const u32 dst = ring_s + slot * G::BYTES;
        S::copy(dst + warp * S::BYTES, P, L, sb, lane, ntot);
#pragma unroll
        for (int j = 0; j < WG_ACT_BYTES / 16 / THREADS; ++j) {
            const int q = tid + THREADS * j, st = q >> 8, tg = (q >> 4) & 15, n = (q >> 1) & 7, kh = q & 1;
            const int grp = tok0 / 8 + tg;
            const bool live = grp < groups;
            const f16* src = live ? act + grp * group_halves + ((i64)sb * SB_STEPS + st) * 128 + n * 16 + kh * 8 : act;
            cp_async16z(dst + G::WEIGHTS + st * WG_STEP_BYTES + tg * 256 + kh * 128 + n * 16, src, live ? 16u : 0u);
        }
    };
    copy_stage(0, 0);
    cp_async_commit();

    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;

    for (int sb = 0; sb < nsb; ++sb) {
        if (!OVERLAP) {
            if (sb + 1 < nsb) copy_stage((sb + 1) & 1, sb + 1);  // its slot's wgmmas finished before the last barrier
            cp_async_commit();
            cp_async_wait<1>();  // this thread's copies of superblock sb have landed,
        } else {
            cp_async_wait<0>();  // (the only copies in flight)
        }
        fence_proxy_async();  // are visible to the async proxy (wgmma's reads),
        __syncthreads();      // and so are every other thread's
        if (OVERLAP) {        // and every warpgroup has drained superblock sb - 1, whose slot this refills
            if (sb + 1 < nsb) copy_stage((sb + 1) & 1, sb + 1);
            cp_async_commit();
        }
        const u8* st = ring_g + (sb & 1) * G::BYTES;
        typename Q::Row r[2];
        typename F::Consts k[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            S::read(r[h], st + warp * S::BYTES, g + 8 * h, c, base[h] + sb);
            F::prepare(r[h], c, k[h]);
        }
        const u32 act_s = ring_s + (sb & 1) * G::BYTES + G::WEIGHTS;
        u32 a[2][4];
#pragma unroll
        for (int s = 0; s < SB_STEPS; ++s) {
            u32* as = a[s & 1];
            u32 f[4];
            F::frag(r[0], k[0], c, s, f[0], f[2]);
            F::frag(r[1], k[1], c, s, f[1], f[3]);
            wg_regroup(f, c, as);
            wg_fence();  // the A registers written above, before the wgmma reads them
            wgmma_m64n128k16(d, a[s & 1], wg_desc(act_s + s * WG_STEP_BYTES));
            wg_commit();
            wg_wait<1>();  // the step before is done with a[(s + 1) & 1], which the next step rewrites
        }
        wg_wait<0>();
        if (!OVERLAP) __syncthreads();  // every warpgroup is done with the slot the next iteration's copy refills
    }
    cp_async_wait<0>();
    wg_store(d, y, residual, row0, tok0, rows, T, ldy, g, c);
#else
    __trap();  // a build for another target: launching it is a dispatch bug
#endif
}

// ---- The warp-specialised form (OPENJET_CUDA_GEMM_WG=3, instances gemm_wg_<qt>_ws) ----
// Above, every warp decodes its own A between its wgmmas, and the decode, not the tensor cores, set the pace
// (bench/NOTES.md Y3: ~200 TFLOP/s). Here warpgroups 0 and 1 (the producers, a row tile a warp) copy each
// superblock's raw weights (a superblock ahead) and activations (half a superblock ahead), decode the block's 128
// rows into A once, in K-major core matrices as B is laid out (wg_regroup's k' order), and hand each half
// superblock (8 steps: A 32 KB, B 32 KB) to warpgroups 2 and 3, 64 rows each, which multiply from shared memory
// (wgmma with both operands there), so the decode overlaps the MMAs instead of alternating with them. (One
// producer warpgroup decoding two tiles a warp set the pace again: 170 TFLOP/s against gemm_cp's 235, Z15.)
// Named barriers pass the halves: FULL (the producer arrives, the consumers wait) and EMPTY (the consumers arrive
// once their wgmmas on a half are done, the producer waits before refilling it); two halves are in flight, and the
// consumers keep a wgmma group in flight across them.
#define WS_THREADS 512
#define WS_PRODUCERS 256  // warpgroups 0 and 1
#define WS_HALF_STEPS 8                                    // steps of 16 k a half superblock
#define WS_STEP_A_BYTES (WG_ROWS * 32)                     // a step's A: 128 rows x 16 k of f16
#define WS_A_BYTES (WS_HALF_STEPS * WS_STEP_A_BYTES)       // 32 KB
#define WS_HALF_BYTES (WS_A_BYTES + WS_HALF_STEPS * WG_STEP_BYTES)  // A then B: 64 KB
#define WS_RAW_BYTES (WG_WARPS * 4096)                     // a superblock's raw weights: 8 row tiles, any type
#define WS_QUARTER_BYTES (WG_ROWS * 128)                // a quarter superblock of A, or of B: 128 rows x 4 steps
#define WS_SMEM_BYTES (2 * WS_RAW_BYTES + 2 * WS_HALF_BYTES + 1024)  // mirrored by engine/cuda/ops.py GEMM_WS_SMEM
#define WS_BAR_FULL 1                                      // + the half's slot (barrier 0 is __syncthreads)
#define WS_BAR_EMPTY 3

__device__ __forceinline__ void ws_arrive(int id) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(WS_THREADS) : "memory");
}
__device__ __forceinline__ void ws_wait(int id) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(WS_THREADS) : "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// WS_SWIZZLE=1 (OPENJET_CUDA_DEFINES; built and compiled, not yet run on a GPU, and it spills 4-40 bytes): A and B
// in wgmma's 128-byte swizzle, K-major: a quarter superblock (4 steps, 64 k') a 128-byte row, rows of 8 an atom
// (1,024 bytes, aligned), row r's 16-byte chunk j at j ^ (r % 8), so that the tensor cores' reads of a step's two
// chunks from 8 rows fall in different banks (with the core matrices unswizzled, gemm_wg and gemm_ws both stay near
// 200 TFLOP/s whoever decodes: bench/NOTES.md Z15). A step's 16 k' are chunks 2 (s % 4) and + 1. The default (0)
// keeps gemm_wg's core matrices, as checked and timed.
#ifndef WS_SWIZZLE
#define WS_SWIZZLE 0
#endif
__device__ __forceinline__ u32 sw128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }
// Its descriptor: a step's start (the quarter's base + 32 (s % 4)), the atoms 1,024 bytes apart, layout SW128.
__device__ __forceinline__ u64 wg_desc_sw128(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// Half HALF of a superblock's steps of the warp's row tile (rows r, constants k) into the A slot, in B's layout.
template <int QT, int HALF>
__device__ __forceinline__ void ws_decode(const typename QTraits<QT>::Row (&r)[2],
                                          const typename FullFrag<QT>::Consts (&k)[2], u32 a_slot, int tile, int g,
                                          int c) {
    using F = FullFrag<QT>;
#pragma unroll
    for (int sl = 0; sl < WS_HALF_STEPS; ++sl) {
        u32 f[4], a[4];
        F::frag(r[0], k[0], c, WS_HALF_STEPS * HALF + sl, f[0], f[2]);
        F::frag(r[1], k[1], c, WS_HALF_STEPS * HALF + sl, f[1], f[3]);
        wg_regroup(f, c, a);
#if WS_SWIZZLE
        const u32 quarter = a_slot + (sl >> 2) * WS_QUARTER_BYTES + 4 * c;
        const int row = 16 * tile + g, chunk = 2 * (sl & 3);
        st_shared_u32(quarter + sw128(row, chunk), a[0]);
        st_shared_u32(quarter + sw128(row + 8, chunk), a[1]);
        st_shared_u32(quarter + sw128(row, chunk + 1), a[2]);
        st_shared_u32(quarter + sw128(row + 8, chunk + 1), a[3]);
#else  // a step's 128 rows as 16 core matrices of 8 rows x 16 bytes: consumer tile >> 2's 64 rows at 2 KB, the
       // tile's rows g and g + 8 in its 8-row groups 2 (tile & 3) and + 1, k' 0-7 and 8-15 128 bytes apart
        const u32 at = a_slot + sl * WS_STEP_A_BYTES + (tile >> 2) * 2048 + (tile & 3) * 512 + g * 16 + c * 4;
        st_shared_u32(at, a[0]);
        st_shared_u32(at + 256, a[1]);
        st_shared_u32(at + 128, a[2]);
        st_shared_u32(at + 384, a[3]);
#endif
    }
}

// The producer warpgroups: warp w stages, reads and decodes the block's row tile w.
template <int QT>
__device__ __forceinline__ void ws_produce(const u8* w, const f16* act, u32 raw_s, const u8* raw_g, u32 half_s,
                                           int blk_row0, int tok0, int rows, int nsb, int T) {
    using Q = QTraits<QT>;
    using F = FullFrag<QT>;
    using S = Stage<QT>;
    static_assert(S::BYTES <= 4096, "a row tile's stage fits its part of WS_RAW_BYTES");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const u64 ntot = (u64)rows * nsb;
    const Planes P = Q::planes(w, ntot);
    const i64 group_halves = (i64)nsb * 2048;  // one 8-token group of the act layout
    const int groups = (T + 7) / 8, halves = 2 * nsb;
    typename S::Lane L;
    const int row0 = blk_row0 + 16 * warp;
    S::init(L, row0, rows, nsb, lane);
    const u32 base[2] = {stage_row_base(row0, g, rows, nsb), stage_row_base(row0, g + 8, rows, nsb)};
    auto copy_raw = [&](int sb) { S::copy(raw_s + (sb & 1) * WS_RAW_BYTES + warp * 4096, P, L, sb, lane, ntot); };
    auto copy_b = [&](int hs) {  // half superblock hs's activations into its slot's B: token tg * 8 + n a row, sw128
        const int sb = hs >> 1, step0 = WS_HALF_STEPS * (hs & 1);
        const u32 dst = half_s + (hs & 1) * WS_HALF_BYTES + WS_A_BYTES;
#pragma unroll
        for (int j = 0; j < WS_HALF_STEPS * WG_STEP_BYTES / 16 / WS_PRODUCERS; ++j) {
            const int q = tid + WS_PRODUCERS * j, st = q >> 8, tg = (q >> 4) & 15, n = (q >> 1) & 7, kh = q & 1;
            const int grp = tok0 / 8 + tg;
            const bool live = grp < groups;
            const f16* src = live ? act + grp * group_halves + ((i64)sb * SB_STEPS + step0 + st) * 128 + n * 16 + kh * 8
                                  : act;
#if WS_SWIZZLE
            const u32 at = dst + (st >> 2) * WS_QUARTER_BYTES + sw128(8 * tg + n, 2 * (st & 3) + kh);
#else
            const u32 at = dst + st * WG_STEP_BYTES + tg * 256 + kh * 128 + n * 16;  // copy_stage's core matrices
#endif
            cp_async16z(at, src, live ? 16u : 0u);
        }
    };
    copy_raw(0);
    copy_b(0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();  // the warp's raw tiles, copied by all its lanes
    typename Q::Row r[2];
    typename F::Consts k[2];
    for (int hs = 0; hs < halves; ++hs) {
        const int sb = hs >> 1, half = hs & 1;
        if (half == 0) {  // raw(sb) landed at the last wait (the one before, or the prologue's)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                S::read(r[h], raw_g + (sb & 1) * WS_RAW_BYTES + warp * 4096, g + 8 * h, c, base[h] + sb);
                F::prepare(r[h], c, k[h]);
            }
        }
        // A of this half into its slot (the consumers released it before B went in, at the end of hs - 1); the
        // half a template argument, so that every step's bytes of the rows are picked at compile time
        const u32 a_slot = half_s + (hs & 1) * WS_HALF_BYTES;
        if (half) ws_decode<QT, 1>(r, k, a_slot, warp, g, c);
        else ws_decode<QT, 0>(r, k, a_slot, warp, g, c);
        cp_async_wait<0>();   // B(hs), and raw(sb + 1) where it was asked for
        __syncwarp();
        fence_proxy_async();  // A's stores and B's copies visible to the wgmmas
        ws_arrive(WS_BAR_FULL + (hs & 1));
        if (hs + 1 < halves) {
            if (hs + 1 >= 2) ws_wait(WS_BAR_EMPTY + ((hs + 1) & 1));  // the consumers are done with hs - 1
            copy_b(hs + 1);
            if (half == 0 && sb + 1 < nsb) copy_raw(sb + 1);  // its slot held raw(sb - 1), read at hs - 2
            cp_async_commit();
        }
    }
}

template <int QT>
__global__ void __launch_bounds__(WS_THREADS, 1)
gemm_ws(const u8* __restrict__ w, const f16* __restrict__ act, float* __restrict__ y,
        const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    PDL_ENTER();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(128) u8 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int blk_row0 = blockIdx.x * WG_ROWS, tok0 = blockIdx.y * WG_TOKENS, nsb = K / QK_SB, halves = 2 * nsb;
    const u32 base_s = (smem_u32(smem) + 1023) & ~1023u;  // the swizzle atoms are 1,024-byte aligned
    const u32 half_s = base_s + 2 * WS_RAW_BYTES;
    if (warp < WS_PRODUCERS / 32) {
        ws_produce<QT>(w, act, base_s, smem + (base_s - smem_u32(smem)), half_s, blk_row0, tok0, rows, nsb, T);
        return;
    }
    const int cw = (warp >> 2) - WS_PRODUCERS / 128;  // consumer 0 or 1: rows 64 cw .. of the block's 128
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    for (int hs = 0; hs < halves; ++hs) {
        ws_wait(WS_BAR_FULL + (hs & 1));
        const u32 slot = half_s + (hs & 1) * WS_HALF_BYTES;
        wg_fence();
#pragma unroll
        for (int sl = 0; sl < WS_HALF_STEPS; ++sl)
#if WS_SWIZZLE
            wgmma_ss_m64n128k16(d, wg_desc_sw128(slot + (sl >> 2) * WS_QUARTER_BYTES + 64 * 128 * cw + 32 * (sl & 3)),
                                wg_desc_sw128(slot + WS_A_BYTES + (sl >> 2) * WS_QUARTER_BYTES + 32 * (sl & 3)));
#else
            wgmma_ss_m64n128k16(d, wg_desc(slot + sl * WS_STEP_A_BYTES + cw * 2048),
                                wg_desc(slot + WS_A_BYTES + sl * WG_STEP_BYTES));
#endif
        wg_commit();
        wg_wait<1>();  // the half before is done with its slot
        if (hs >= 1 && hs - 1 < halves - 2) ws_arrive(WS_BAR_EMPTY + ((hs - 1) & 1));  // the producer refills it
    }
    wg_wait<0>();
    wg_store(d, y, residual, blk_row0 + 64 * cw + 16 * (warp & 3), tok0, rows, T, ldy, g, c);
#else
    __trap();  // a build for another target: launching it is a dispatch bug
#endif
}
