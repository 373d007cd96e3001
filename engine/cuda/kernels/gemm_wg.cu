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
#include "wgmma.cuh"

#define WG_ACT_BYTES (SB_STEPS * WG_STEP_BYTES)  // 64 KB a superblock
#define WG_SMEM_BYTES (2 * (WG_WARPS * 4096 + WG_ACT_BYTES) + 128)  // the launch's: two slots, any type, aligned

template <int QT>
struct WgStage {
    static constexpr int WEIGHTS = WG_WARPS * Stage<QT>::BYTES, BYTES = WEIGHTS + WG_ACT_BYTES;
    static_assert(WEIGHTS % 128 == 0, "the activations start 128-byte aligned");
    static_assert(2 * BYTES + 127 <= WG_SMEM_BYTES, "two slots fit the launch's shared memory");
};

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
