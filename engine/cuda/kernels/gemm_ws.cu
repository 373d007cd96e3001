// The prefill matmul on warpgroup MMA with its decode apart (OPENJET_CUDA_GEMM_WG=3, instances gemm_wg_<qt>_ws;
// sm_90a alone, as kernels/gemm_wg.cu; y[T, rows] = x[T, K] @ W^T (+ residual), W Q4_K or Q6_K).
//
// In gemm_wg every warp decodes its own A between its wgmmas (bench/NOTES.md Y3: ~200 TFLOP/s). Here warpgroups 0
// and 1 (the producers, a row tile a warp, two at WS_ROWS=256) copy each superblock's raw weights ahead and have
// the tensor copy engine bring its activations (WS_TMA_B), decode the tile's rows into A once (wgmma's 128-byte
// swizzle, k' in the act layout's order), and hand each chunk of a superblock (WS_CHUNK_STEPS steps of A and of B)
// to warpgroups 2 and 3, half the rows each, which multiply from shared memory (wgmma with both operands there), so
// the decode overlaps the MMAs instead of alternating with them. Named barriers pass the chunks: FULL (the
// producers arrive, the consumers wait) and EMPTY (the consumers arrive once their wgmmas on a chunk are done, the
// producers wait before refilling its slots), one of each an A slot; the consumers keep a wgmma group in flight
// across chunks. Where the time went (Z16, 249 TFLOP/s at 8,192 tokens): the activations' copies most, then the
// decode; with the copies on the tensor copy engine and Q4_K's row constants kept through a superblock, 370-382
// TFLOP/s on the Q4_K shapes and 276 on Q6_K (Z18, H100).
//
// Instances gemm_wg_<qt>_ws_swiglu (EPI = WS_EPI_SWIGLU) multiply gate | up and store silu(gate) * up straight into
// the act layout of ffn_down's input, as f16 (what a prefill GEMM reads), instead of the f32 rows act_swiglu would
// read back: that launch and three quarters of the bytes the epilogue stored go (engine/cuda/gemm.py
// launch_swiglu; bench/NOTES.md Z19: gate | up with SwiGLU at 8,192 tokens 8.47 ms against 8.92 apart, H200).
#ifndef WEIGHT_EVICT_FIRST
#define WEIGHT_EVICT_FIRST 0  // a weight tile is read again by every token tile (common.cuh)
#endif
#include "common.cuh"
#include "quants.cuh"
#include "stage.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#define WS_THREADS 512
#define WS_PRODUCERS 256  // warpgroups 0 and 1
// A superblock's 16 steps go in WS_CHUNKS chunks (2, 4 or 8), each handed over through a slot of A (WS_ASLOTS of
// them) and one of B (WS_BSLOTS, or as many as fit: WsSmem), so the activations can be asked for ahead of the
// decode. A chunk's slots are refilled once the consumers are done with it: its A slot with chunk + WS_ASLOTS's
// decode, its B slot with chunk + BSLOTS's copy, which the producers thus issue BSLOTS - WS_ASLOTS chunks ahead of
// their decode (far ahead measured no faster than one chunk: bench/NOTES.md Z16). The raw weights come two
// superblocks ahead through two slots at 128 rows (a slot is free once its superblock is in the warp's
// registers), one at 256.
#ifndef WS_CHUNKS
#define WS_CHUNKS 4
#endif
#ifndef WS_ASLOTS
#define WS_ASLOTS 2
#endif
#ifndef WS_BSLOTS
#define WS_BSLOTS 8
#endif
// WS_ROWS (256, or 128 through OPENJET_CUDA_DEFINES): the rows a tile. At 256 each activation chunk serves twice
// the rows, so the activations' bytes a FLOP halve (their copies were the largest cost at 128: bench/NOTES.md Z16);
// each producer warp decodes two row tiles (re-reading its raw rows from shared memory every chunk rather than
// holding two tiles' rows in registers), each consumer warpgroup multiplies 128 rows with two wgmmas a step (128
// accumulators), and setmaxnreg moves registers from the producers to the consumers. Measured at 8,192 tokens
// (bench/NOTES.md Z17, H100): 270-279 TFLOP/s on the 27B shapes against 242-249 at 128 rows.
#ifndef WS_ROWS
#define WS_ROWS 256
#endif
#define WS_TILES (WS_ROWS / 16)                            // row tiles of 16 a block
#define WS_WARP_TILES (WS_TILES / 8)                       // a producer warp's: tiles warp and warp + 8
#define WS_SETS (WS_ROWS / 128)                            // a consumer warpgroup's accumulator sets of 64 rows
#define WS_CHUNK_STEPS (SB_STEPS / WS_CHUNKS)              // steps of 16 k a chunk
#define WS_STEP_A_BYTES (WS_ROWS * 32)                     // a step's A: the rows x 16 k of f16
#define WS_A_BYTES (WS_CHUNK_STEPS * WS_STEP_A_BYTES)      // an A slot
#define WS_B_BYTES (WS_CHUNK_STEPS * WG_STEP_BYTES)        // a B slot
#define WS_A_QUARTER (WS_ROWS * 128)                       // 4 steps of A (the swizzle's rows)
#define WS_B_QUARTER (WG_TOKENS * 128)                     // 4 steps of B
#define WS_SMEM_MAX (227 * 1024)                           // sm_90's opt-in maximum: engine/cuda/gemm.py WS_SMEM
#define WS_BAR_FULL 1                                      // + the chunk's A slot (barrier 0 is __syncthreads)
#define WS_BAR_EMPTY (1 + WS_ASLOTS)
#ifndef WS_PRODUCER_REGS
#define WS_PRODUCER_REGS 96  // setmaxnreg at 256 rows: 256 x 96 + 256 x 160 = 64 K registers (ptxas: no spills)
#endif
#ifndef WS_CONSUMER_REGS
#define WS_CONSUMER_REGS 160
#endif
// WS_TMA_B (1, the default; 0 through OPENJET_CUDA_DEFINES): B by the tensor copy engine, one 4-D box a chunk (the
// act layout's token groups x steps x 8 tokens x a step's 32 bytes, engine/cuda/gemm.py b_map) issued by one
// producer thread and counted in at an mbarrier a B slot, which that thread waits on before the chunk's FULL (the
// consumers, at 160 registers, spill with a wait of their own), instead of 256 threads' cp.async of 16 bytes and
// the producers' wait for them (the activations' copies cost the most of anything the producers do: bench/NOTES.md
// Z16, 249 -> 378 TFLOP/s without them at 128 rows). The box lands a step's 128 tokens in wgmma's 32-byte swizzle
// (a token's step one 32-byte row, 8 rows an atom of 256 bytes, the chunk's steps 256 bytes apart within a token
// group and the groups WS_CHUNK_STEPS x 256 apart: the descriptor's stride), as the map's swizzle writes it.
// Measured at 8,192 tokens (bench/NOTES.md Z18, H100): 276-278 -> 286-330 TFLOP/s, the 27B prefill 4,233 -> 4,684
// tok/s; at 512 tokens it draws level with gemm_cp on attn_q.
#ifndef WS_TMA_B
#define WS_TMA_B 1
#endif
#define WS_BARS_BYTES (WS_TMA_B ? 128 : 0)  // an mbarrier a B slot (WS_BSLOTS <= 16), after the B slots

static_assert(WS_CHUNKS == 2 || WS_CHUNKS == 4 || WS_CHUNKS == 8, "a superblock's 16 steps in equal chunks");
static_assert(WS_ROWS == 128 || WS_ROWS == 256, "one or two row tiles a producer warp");
static_assert(WS_ASLOTS >= 2 && WS_BSLOTS >= WS_ASLOTS && 1 + 2 * WS_ASLOTS <= 16, "FULL and EMPTY an A slot");
static_assert(!WS_TMA_B || WS_BSLOTS <= 16, "an mbarrier a B slot in WS_BARS_BYTES");

__host__ __device__ constexpr int ws_min(int a, int b) { return a < b ? a : b; }

// Shared memory by weight type: two raw slots (a superblock's row tiles, 4 KB a tile at 128 rows as timed, the
// type's stage at 256), the A slots, then as many B slots as fit, up to WS_BSLOTS. A copy group a chunk: the raw
// weights' copy must land before the chunk that reads them waits, with BSLOTS - WS_ASLOTS groups left in flight
// (raw(sb + 2) is copied at chunk WS_CHUNKS sb at 128 rows, raw(sb + 1) at 256, where the slot is re-read all
// through its superblock).
// WS_Q6_TIGHT (1, or 0 through OPENJET_CUDA_DEFINES): Q6_K's raw rows at a 128-byte ql' pitch, swizzled (stage.cuh
// Q6KStage SWZ) instead of padded to 144: 8 KB of raw slots less at 256 rows, where Q6_K had room for only two B
// slots (each chunk's activations asked for no chunk ahead of its decode) and so has three: ffn_down at 8,192 tokens
// 308 TFLOP/s (H200) against 276-286 with two (H100; bench/NOTES.md Z19). Not with WS_TMA_B=0, whose producers'
// copies of a third B slot spill.
#ifndef WS_Q6_TIGHT
#define WS_Q6_TIGHT WS_TMA_B
#endif
template <int QT, bool TIGHT = (WS_Q6_TIGHT != 0)> struct WsStageOf { using T = Stage<QT>; };
template <> struct WsStageOf<QT_Q6_K, true> { using T = Q6KStage<128, 64, true>; };
template <int QT> using WsStage = typename WsStageOf<QT>::T;

template <int QT> struct WsSmem {
    static constexpr int RAW_TILE = WS_ROWS == 128 ? 4096 : (WsStage<QT>::BYTES + 127) / 128 * 128;
    static constexpr int RAW = WS_TILES * RAW_TILE;
    static constexpr int FIXED = 1024 + 2 * RAW + WS_ASLOTS * WS_A_BYTES + WS_BARS_BYTES;  // 1024: atoms' alignment
    static constexpr int LEAD = WS_ROWS == 128 ? 2 * WS_CHUNKS - 1 : WS_CHUNKS - 1;
    static constexpr int FIT = (WS_SMEM_MAX - FIXED) / WS_B_BYTES;
    static constexpr int BSLOTS = ws_min(ws_min(WS_BSLOTS, FIT), WS_ASLOTS + LEAD);
    static_assert(WsStage<QT>::BYTES <= RAW_TILE, "a row tile's stage fits its part of a raw slot");
    static_assert(BSLOTS >= WS_ASLOTS && FIXED + BSLOTS * WS_B_BYTES <= WS_SMEM_MAX, "the slots fit shared memory");
};

__device__ __forceinline__ void ws_arrive(int id) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(WS_THREADS) : "memory");
}
__device__ __forceinline__ void ws_wait(int id) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(WS_THREADS) : "memory");
}
__device__ __forceinline__ void st_shared_v2(u32 addr, u32 lo, u32 hi) {
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(lo), "r"(hi) : "memory");
}

// WS_SWIZZLE (1, the default): A and B in wgmma's 128-byte swizzle, K-major: 4 steps (64 k') a 128-byte row, rows
// of 8 an atom (1,024 bytes, aligned), row r's 16-byte chunk j at j ^ (r % 8), so that the tensor cores' reads of a
// step's two 16-byte pieces from 8 rows fall in different banks. A step's 16 k' are pieces 2 (s % 4) and + 1.
// Measured against gemm_wg's unswizzled core matrices (WS_SWIZZLE=0): 196 -> 226 TFLOP/s (bench/NOTES.md Z16).
#ifndef WS_SWIZZLE
#define WS_SWIZZLE 1
#endif
static_assert(!WS_SWIZZLE || WS_CHUNK_STEPS >= 4, "a swizzled row is 4 steps: chunks of 4 or 8 steps");
// Measurement builds (wrong results by design: timed by bench/gpu_profile.py, never checked or run by the engine):
// WS_SKIP_DECODE=1 leaves A as it is (the producers still copy the raw weights), WS_SKIP_B=1 copies no
// activations, so the time without that part says what it costs the pipeline.
#ifndef WS_SKIP_DECODE
#define WS_SKIP_DECODE 0
#endif
#ifndef WS_SKIP_B
#define WS_SKIP_B 0
#endif
__device__ __forceinline__ u32 sw128(int row, int piece) { return row * 128 + ((piece ^ (row & 7)) << 4); }
// Its descriptor: a step's start (the 4 steps' base + 32 (s % 4)), the atoms 1,024 bytes apart, layout SW128.
__device__ __forceinline__ u64 wg_desc_sw128(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// B's descriptor with WS_TMA_B: a step's start (the chunk's slot + 256 s), 32-byte swizzle, its 8-token atoms
// WS_CHUNK_STEPS x 256 bytes apart (the box's token groups).
__device__ __forceinline__ u64 wg_desc_sw32(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(WS_CHUNK_STEPS * 256 >> 4) << 32) | ((u64)3 << 62);
}

// Chunk PART of a superblock's steps of the warp's row tile (rows r, constants k) into the A slot, in B's layout.
// A lane's fragment registers f0 (slots 2c, 2c + 1) and f2 (2c + 8, 2c + 9) of a row are wgmma's k' = 4c .. 4c + 3
// (wgmma.cuh: position p = 4c + e holds slot 2c + (e & 1) + 8 (e >> 1)), 8 contiguous bytes of the row's step, so
// each row goes to shared memory in one 8-byte store, without gemm_wg's regrouping shuffles (A in registers needs
// them; A in shared memory does not: 227 -> 249 TFLOP/s without them, bench/NOTES.md Z16).
template <int QT, int PART>
__device__ __forceinline__ void ws_decode(const typename QTraits<QT>::Row (&r)[2],
                                          const typename FullFrag<QT>::Consts (&k)[2], u32 a_slot, int tile, int g,
                                          int c) {
    using F = FullFrag<QT>;
#pragma unroll
    for (int sl = 0; sl < WS_CHUNK_STEPS; ++sl) {
        u32 f[4];
        F::frag(r[0], k[0], c, WS_CHUNK_STEPS * PART + sl, f[0], f[2]);  // row g
        F::frag(r[1], k[1], c, WS_CHUNK_STEPS * PART + sl, f[1], f[3]);  // row g + 8
#if WS_SWIZZLE  // k' 4c .. 4c + 3: 16-byte piece 2 (s % 4) + c / 2 of the row's 128 bytes, its half c % 2
        const u32 quarter = a_slot + (sl >> 2) * WS_A_QUARTER + 8 * (c & 1);
        const int row = 16 * tile + g, piece = 2 * (sl & 3) + (c >> 1);
        st_shared_v2(quarter + sw128(row, piece), f[0], f[2]);
        st_shared_v2(quarter + sw128(row + 8, piece), f[1], f[3]);
#else  // a step's 128 rows as 16 core matrices of 8 rows x 16 bytes: consumer tile >> 2's 64 rows at 2 KB, the
       // tile's rows g and g + 8 in its 8-row groups 2 (tile & 3) and + 1 (256 bytes on), k' 0-7 and 8-15 128
       // bytes apart
        const u32 at = a_slot + sl * WS_STEP_A_BYTES + (tile >> 2) * 2048 + (tile & 3) * 512 + g * 16 +
                       (c >> 1) * 128 + (c & 1) * 8;
        st_shared_v2(at, f[0], f[2]);
        st_shared_v2(at + 256, f[1], f[3]);
#endif
    }
}

// ws_decode of chunk `part` (a run-time value), the part a template argument so that every step's bytes of the
// rows are picked at compile time (a run-time step put the rows in local memory).
template <int QT, int PART = 0>
__device__ __forceinline__ void ws_decode_part(int part, const typename QTraits<QT>::Row (&r)[2],
                                               const typename FullFrag<QT>::Consts (&k)[2], u32 a_slot, int tile,
                                               int g, int c) {
    if constexpr (PART < WS_CHUNKS) {
        if (part == PART) ws_decode<QT, PART>(r, k, a_slot, tile, g, c);
        else ws_decode_part<QT, PART + 1>(part, r, k, a_slot, tile, g, c);
    }
}

// WS_KEEP_CONSTS (1, the default): at 256 rows a Q4_K row's constants (its sub-blocks' scales and mins, prepared
// from the raw words) are computed once a superblock and kept through its chunks (2 tiles x 2 rows x 4 registers),
// each chunk reading only the 8 bytes of a row's quants it decodes; at 0 every chunk reads both rows of each tile
// whole and prepares them again (a quarter of the quants used, the preparation about as long as the chunk's
// decode). Measured at 8,192 tokens (bench/NOTES.md Z18, H100): Q4_K 324-330 -> 370-382 TFLOP/s. Q6_K, whose
// preparation is short, lost 3 % with it (8 + 8 bytes of quants and high bits a chunk: WS_KEEP_CONSTS=2 builds
// that), so it reads its rows whole.
#ifndef WS_KEEP_CONSTS
#define WS_KEEP_CONSTS 1
#endif
template <int QT> __host__ __device__ constexpr bool ws_keeps_consts() {
    return WS_KEEP_CONSTS && WS_WARP_TILES > 1 && WS_CHUNKS == 4 && (QT == QT_Q4_K || (WS_KEEP_CONSTS == 2 &&
                                                                                     QT == QT_Q6_K));
}

// Words 2 (PART & 1) and + 1 of v from 8 bytes at p (8-byte aligned).
template <int PART> __device__ __forceinline__ void ws_set_pair(uint4& v, const u8* p) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    if constexpr (PART & 1) {
        v.z = x.x;
        v.w = x.y;
    } else {
        v.x = x.x;
        v.y = x.y;
    }
}

// Chunk PART (of 4) of the lane's rows g, g + 8 from the stage at st: the quants frag_full reads for steps 4 PART ..
// 4 PART + 3 (words 2 PART, 2 PART + 1 of the lane's 32 bytes; Q6_K's high bits: words 2 (PART & 1), + 1 of its
// 16); the rest of r is not read.
template <int QT, int PART>
__device__ __forceinline__ void ws_words(typename QTraits<QT>::Row (&r)[2], const u8* st, int g, int c) {
    using S = WsStage<QT>;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int lr = g + 8 * h;
        if constexpr (QT == QT_Q4_K) {
            ws_set_pair<PART>(r[h].q[PART >> 1], st + S::QS + lr * S::QS_PITCH + 32 * c + 8 * PART);
        } else {
            ws_set_pair<PART>(r[h].q[PART >> 1], st + S::ql_at(lr, 2 * c + (PART >> 1)) + 8 * (PART & 1));
            ws_set_pair<PART>(r[h].qh, st + S::QH + lr * S::QH_PITCH + 16 * c + 8 * (PART & 1));
        }
    }
}

// ws_decode_part with the constants kept (ws_keeps_consts): chunk `part`'s words of the tile's stage st, then A.
template <int QT, int PART = 0>
__device__ __forceinline__ void ws_decode_kept(int part, const u8* st, const typename FullFrag<QT>::Consts (&k)[2],
                                               u32 a_slot, int tile, int g, int c) {
    if constexpr (PART < WS_CHUNKS) {
        if (part == PART) {
            typename QTraits<QT>::Row r[2];
            ws_words<QT, PART>(r, st, g, c);
            ws_decode<QT, PART>(r, k, a_slot, tile, g, c);
        } else {
            ws_decode_kept<QT, PART + 1>(part, st, k, a_slot, tile, g, c);
        }
    }
}

// The block's tiles: tile blockIdx.x + i gridDim.x for i = 0, 1, ..., row tiles fastest (the blocks in flight
// share a token tile's activations in L2). A grid of one block a tile runs each once; a persistent grid (a block an
// SM, OPENJET_CUDA_GEMM_WG=4) walks on, so one tile's last chunks, stores and the next tile's first copies overlap
// instead of every block filling its pipeline from cold. Chunks are counted over the block's whole walk (the slots
// and barriers turn on across tiles), WS_CHUNKS nsb a tile.
//
// With SwiGLU behind (WS_EPI_SWIGLU: W is gate | up, `half` rows each, a multiple of 256) a tile's rows are not
// contiguous: tile r of the row tiles takes 128 positions of the gate and the same 128 of up, so that each consumer
// multiplies a gate row and its up row into the same registers of its two accumulator sets (tile_row). Those 128
// positions are the ones whose act layout slots (16 values of a token's step) they fill whole: position k of
// superblock r / 2 with bit 4 of k = r % 2, the consumers' halves by bit 7, their warps' 32 by bits 5-6.
#define WS_EPI_STORE 0   // y[T, rows] = the sums (+ residual), f32
#define WS_EPI_SWIGLU 1  // y is the f16 act layout of silu(gate) * up (W: gate | up); no residual

template <int EPI> struct WsWalk {
    int row_tiles, tiles, nsb, chunks;
    __device__ __forceinline__ WsWalk(int rows, int K, int T) {
        row_tiles = (rows + WS_ROWS - 1) / WS_ROWS;
        tiles = row_tiles * ((T + WG_TOKENS - 1) / WG_TOKENS);
        nsb = K / QK_SB;
        const int mine = blockIdx.x < tiles ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
        chunks = mine * WS_CHUNKS * nsb;
    }
    __device__ __forceinline__ int tile(int i) const { return blockIdx.x + i * gridDim.x; }
    __device__ __forceinline__ int row0(int i) const { return (tile(i) % row_tiles) * WS_ROWS; }
    __device__ __forceinline__ int tok0(int i) const { return (tile(i) / row_tiles) * WG_TOKENS; }
    // The first weight row of the walk's tile i's 16-row tile t (A rows 16 t ..; A's 64-row block t / 4 is
    // consumer t / 8's accumulator set (t / 4) % 2).
    __device__ __forceinline__ int tile_row(int i, int t) const {
        if constexpr (EPI == WS_EPI_STORE) return row0(i) + 16 * t;
        const int r0 = row0(i), up = (t >> 2) & 1;  // up: set 1, else the gate's rows; r0 = 256 r
        return (up ? half() : 0) + ((r0 >> 1) & ~255) + ((r0 >> 4) & 16) + 128 * (t >> 3) + 32 * (t & 3);
    }
    __device__ __forceinline__ int half() const { return row_tiles * (WS_ROWS / 2); }  // WS_EPI_SWIGLU's
};

// Rows g and g + 8 of row tile `tile` at superblock J of the walk from its raw slot, with their constants.
template <int QT, class Walk>
__device__ __forceinline__ void ws_rows(typename QTraits<QT>::Row (&r)[2], typename FullFrag<QT>::Consts (&k)[2],
                                        const u8* raw_g, const Walk& walk, int J, int tile, int rows, int g, int c) {
    const int row0 = walk.tile_row(J / walk.nsb, tile), sb = J % walk.nsb;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        WsStage<QT>::read(r[h], raw_g + (J & 1) * WsSmem<QT>::RAW + tile * WsSmem<QT>::RAW_TILE, g + 8 * h, c,
                          stage_row_base(row0, g + 8 * h, rows, walk.nsb) + sb);
        FullFrag<QT>::prepare(r[h], c, k[h]);
    }
}

// The producer warpgroups: warp w stages, reads and decodes each tile's row tiles w (and w + 8 at 256 rows); thread
// 0 has the tensor copy engine bring B (WS_TMA_B), else all 256 threads copy it.
template <int QT, class Walk>
__device__ __forceinline__ void ws_produce(const TensorMap& bmap, const u8* w, const f16* act, u32 raw_s,
                                           const u8* raw_g, u32 a_s, u32 b_s, u32 bars, const Walk& walk, int rows,
                                           int T) {
    using Q = QTraits<QT>;
    using F = FullFrag<QT>;
    using S = WsStage<QT>;
    using M = WsSmem<QT>;
    constexpr int BSLOTS = M::BSLOTS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int nsb = walk.nsb, chunks = walk.chunks, per_tile = WS_CHUNKS * nsb;
    const u64 ntot = (u64)rows * nsb;
    const Planes P = Q::planes(w, ntot);
    [[maybe_unused]] const i64 group_halves = (i64)nsb * 2048;  // one 8-token group of the act layout (cp.async)
    [[maybe_unused]] const int groups = (T + 7) / 8;
    auto copy_raw = [&](int J) {  // superblock J of the walk (tile J / nsb) into raw slot J & 1
#pragma unroll
        for (int t = 0; t < WS_WARP_TILES; ++t) {
            const int tile = warp + 8 * t;
            typename S::Lane L;
            S::init(L, walk.tile_row(J / nsb, tile), rows, nsb, lane);
            S::copy(raw_s + (J & 1) * M::RAW + tile * M::RAW_TILE, P, L, J % nsb, lane, ntot);
        }
    };
    auto copy_b = [&](int cs) {  // chunk cs's activations into its B slot: token tg * 8 + n a row
        const int local = cs % per_tile, sb = local / WS_CHUNKS, step0 = WS_CHUNK_STEPS * (local % WS_CHUNKS);
        const int grp0 = walk.tok0(cs / per_tile) / 8;
        const u32 dst = b_s + (cs % BSLOTS) * WS_B_BYTES;
#if WS_TMA_B  // one thread: the box (steps step0.. of superblock sb, token groups grp0..), its bytes counted in
        if (tid == 0) {
            const u32 bar = bars + 8 * (cs % BSLOTS);
            mbar_expect_tx(bar, WS_SKIP_B ? 0 : WS_B_BYTES);
            if (!WS_SKIP_B) tensor_copy_4d(dst, bmap, 0, 0, sb * SB_STEPS + step0, grp0, bar);
        }
#else
        if (WS_SKIP_B) return;
#pragma unroll
        for (int j = 0; j < WS_B_BYTES / 16 / WS_PRODUCERS; ++j) {
            const int q = tid + WS_PRODUCERS * j, st = q >> 8, tg = (q >> 4) & 15, n = (q >> 1) & 7, kh = q & 1;
            const int grp = grp0 + tg;
            const bool live = grp < groups;
            const f16* src = live ? act + grp * group_halves + ((i64)sb * SB_STEPS + step0 + st) * 128 + n * 16 + kh * 8
                                  : act;
#if WS_SWIZZLE
            const u32 at = dst + (st >> 2) * WS_B_QUARTER + sw128(8 * tg + n, 2 * (st & 3) + kh);
#else
            const u32 at = dst + st * WG_STEP_BYTES + tg * 256 + kh * 128 + n * 16;  // copy_stage's core matrices
#endif
            cp_async16z(at, src, live ? 16u : 0u);
        }
#endif
    };
    // Copy groups: the prologue's BSLOTS (the first raw slots in the first, B(j) in group j), then one a chunk
    // (empty past the last): B(j) >= BSLOTS goes in at chunk j - (BSLOTS - WS_ASLOTS), so when chunk cs waits for
    // its B, the BSLOTS - WS_ASLOTS groups after B(cs)'s may stay in flight.
    const int sbs = chunks / WS_CHUNKS;  // superblocks of the walk
    if (sbs > 0) copy_raw(0);
    if (WS_WARP_TILES == 1 && sbs > 1) copy_raw(1);
#pragma unroll
    for (int j = 0; j < BSLOTS; ++j) {
        if (j < chunks) copy_b(j);
        cp_async_commit();
    }
    cp_async_wait<BSLOTS - 1>();  // the first raw slots
    __syncwarp();                 // the warp's raw tiles, copied by all its lanes
    typename Q::Row r[2];
    typename F::Consts k[2];
    [[maybe_unused]] typename F::Consts kept[WS_WARP_TILES][2];  // ws_keeps_consts: each tile's, a superblock
    for (int cs = 0; cs < chunks; ++cs) {
        const int J = cs / WS_CHUNKS, part = cs % WS_CHUNKS;
        if (cs >= WS_ASLOTS) {  // chunk cs - WS_ASLOTS is done: its A slot is cs's, its B slot the next copy's
            ws_wait(WS_BAR_EMPTY + (cs - WS_ASLOTS) % WS_ASLOTS);
            const int ahead = cs - WS_ASLOTS + BSLOTS;
            if (ahead < chunks) copy_b(ahead);
        }
        const u32 a_slot = a_s + (cs % WS_ASLOTS) * WS_A_BYTES;
        if (part == 0) {  // raw(J) landed by the last wait
            // one tile a warp: its rows in registers for the superblock, so the slot takes raw(J + 2) at once; two:
            // their rows read again every chunk, so raw(J + 1) goes to the slot raw(J - 1) left
            if constexpr (WS_WARP_TILES == 1) ws_rows<QT>(r, k, raw_g, walk, J, warp, rows, g, c);
            if constexpr (ws_keeps_consts<QT>())
#pragma unroll
                for (int t = 0; t < WS_WARP_TILES; ++t)
                    ws_rows<QT>(r, kept[t], raw_g, walk, J, warp + 8 * t, rows, g, c);
            __syncwarp();  // every lane's reads of the slot before any lane's copy over them
            if (J + 3 - WS_WARP_TILES < sbs) copy_raw(J + 3 - WS_WARP_TILES);
        }
        cp_async_commit();
        // A of this chunk into its slot, then B(cs) landed (this thread's copies; the barrier publishes all)
#pragma unroll
        for (int t = 0; t < WS_WARP_TILES; ++t) {
            if constexpr (ws_keeps_consts<QT>()) {
                const u8* st = raw_g + (J & 1) * M::RAW + (warp + 8 * t) * M::RAW_TILE;
                if (!WS_SKIP_DECODE) ws_decode_kept<QT>(part, st, kept[t], a_slot, warp + 8 * t, g, c);
            } else {
                if constexpr (WS_WARP_TILES > 1) ws_rows<QT>(r, k, raw_g, walk, J, warp + 8 * t, rows, g, c);
                if (!WS_SKIP_DECODE) ws_decode_part<QT>(part, r, k, a_slot, warp + 8 * t, g, c);
            }
        }
        cp_async_wait<BSLOTS - WS_ASLOTS>();
#if WS_TMA_B  // B(cs)'s bytes in (the slot's use cs / BSLOTS), asked for long ago; FULL then tells the consumers
        if (tid == 0) i8b_wait(bars + 8 * (cs % BSLOTS), cs / BSLOTS);
#endif
        __syncwarp();
        fence_proxy_async();  // A's stores and B's copies visible to the wgmmas
        ws_arrive(WS_BAR_FULL + cs % WS_ASLOTS);
    }
}

// A chunk's steps for 64 rows (block j of the A slot's 64-row blocks) into d.
__device__ __forceinline__ void ws_mma(float (&d)[64], u32 a, u32 b, int j) {
#pragma unroll
    for (int sl = 0; sl < WS_CHUNK_STEPS; ++sl) {
        const u64 da = WS_SWIZZLE ? wg_desc_sw128(a + (sl >> 2) * WS_A_QUARTER + 64 * 128 * j + 32 * (sl & 3))
                                  : wg_desc(a + sl * WS_STEP_A_BYTES + j * 2048);
        const u64 db = WS_TMA_B     ? wg_desc_sw32(b + 256 * sl)
                       : WS_SWIZZLE ? wg_desc_sw128(b + (sl >> 2) * WS_B_QUARTER + 32 * (sl & 3))
                                    : wg_desc(b + sl * WG_STEP_BYTES);
        wgmma_ss_m64n128k16(d, da, db);
    }
}

// The tile's SwiGLU (WS_EPI_SWIGLU) from a consumer's two sets of sums: silu(gate) * up of its rows g, g + 8 (gate
// positions k0 + g, + 8) and its 32 tokens from tok0, rounded to f16 into the act layout of the next matmul's
// input (nsb superblocks a row), as kernels/act.cu's act_swiglu would from the stored f32 rows. The last group's
// slots past T get zeros (sums of zero activations), as act_swiglu's do.
__device__ __forceinline__ void ws_store_swiglu(const float (&gate)[64], const float (&up)[64], f16* out, int nsb,
                                                int k0, int tok0, int T, int g, int c) {
    const i64 group = (i64)nsb * 2048;  // an 8-token group's values; the 32 tokens' groups tok0 / 8 + i
    f16* base = out + (tok0 >> 3) * group + 16 * (2 * c);  // token 2c of the group (then 2c + 1)
    const i64 at[2] = {act_at(k0 + g, 0), act_at(k0 + g + 8, 0)};  // rows g, g + 8
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        if (tok0 + 8 * i >= T) break;  // the last group is written whole (its slots past T: zeros)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            base[i * group + at[e >> 1] + 16 * (e & 1)] = f32_to_f16(siluf_(gate[4 * i + e]) * up[4 * i + e]);
    }
}

template <int QT, int EPI>
__global__ void __launch_bounds__(WS_THREADS, 1)
gemm_ws(const __grid_constant__ TensorMap bmap, const u8* __restrict__ w, const f16* __restrict__ act,
        float* __restrict__ y, const float* __restrict__ residual, int rows, int K, int T, int ldy) {
    PDL_ENTER();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using M = WsSmem<QT>;
    extern __shared__ __align__(128) u8 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const WsWalk<EPI> walk(rows, K, T);
    const u32 base_s = (smem_u32(smem) + 1023) & ~1023u;  // the swizzle atoms are 1,024-byte aligned
    const u32 a_s = base_s + 2 * M::RAW, b_s = a_s + WS_ASLOTS * WS_A_BYTES, bars = b_s + M::BSLOTS * WS_B_BYTES;
#if WS_TMA_B  // the B slots' mbarriers, initialised before any thread copies into or waits on them
    if (threadIdx.x == 0) mbar_init_ring(bars, M::BSLOTS);
    __syncthreads();
#endif
    if (warp < WS_PRODUCERS / 32) {
        if constexpr (WS_ROWS == 256) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(WS_PRODUCER_REGS));
        ws_produce<QT>(bmap, w, act, base_s, smem + (base_s - smem_u32(smem)), a_s, b_s, bars, walk, rows, T);
        return;
    }
    if constexpr (WS_ROWS == 256) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(WS_CONSUMER_REGS));
    const int cw = (warp >> 2) - WS_PRODUCERS / 128;  // consumer 0 or 1: rows WS_ROWS / 2 cw .. of the tile's
    const int per_tile = WS_CHUNKS * walk.nsb, chunks = walk.chunks;
    for (int i = 0, cs0 = 0; cs0 < chunks; ++i, cs0 += per_tile) {  // the block's tiles
        float d[WS_SETS][64];  // a wgmma's 64 rows a set
#pragma unroll
        for (int j = 0; j < WS_SETS; ++j)
#pragma unroll
            for (int e = 0; e < 64; ++e) d[j][e] = 0.f;
        for (int cs = cs0; cs < cs0 + per_tile; ++cs) {
            ws_wait(WS_BAR_FULL + cs % WS_ASLOTS);
            const u32 a = a_s + (cs % WS_ASLOTS) * WS_A_BYTES, b = b_s + (cs % M::BSLOTS) * WS_B_BYTES;
            wg_fence();
#pragma unroll
            for (int j = 0; j < WS_SETS; ++j) ws_mma(d[j], a, b, WS_SETS * cw + j);
            wg_commit();
            wg_wait<1>();  // the chunk before is done with its slots (the tile's first: released at the last store)
            if (cs > cs0 && cs - 1 + WS_ASLOTS < chunks) ws_arrive(WS_BAR_EMPTY + (cs - 1) % WS_ASLOTS);
        }
        // the tile's sums: its last chunk's slots released before the stores, so the next tile's decode and copies
        // overlap them
        wg_wait<0>();
        const int last = cs0 + per_tile - 1;
        if (last + WS_ASLOTS < chunks) ws_arrive(WS_BAR_EMPTY + last % WS_ASLOTS);
        if constexpr (EPI == WS_EPI_SWIGLU) {  // set 0 the gate's rows, set 1 up's (WsWalk::tile_row)
#if WS_ROWS == 256
            const int k0 = walk.tile_row(i, 8 * cw + (warp & 3));
            ws_store_swiglu(d[0], d[1], reinterpret_cast<f16*>(y), walk.half() / QK_SB, k0, walk.tok0(i), T, g, c);
#else
            __trap();  // one set a consumer: the launcher takes it at 256 rows only (engine/cuda/gemm.py)
#endif
        } else {
            const int row0 = walk.row0(i) + (WS_ROWS / 2) * cw + 16 * (warp & 3);
#pragma unroll
            for (int j = 0; j < WS_SETS; ++j)
                wg_store(d[j], y, residual, row0 + 64 * j, walk.tok0(i), rows, T, ldy, g, c);
        }
    }
#else
    __trap();  // a build for another target: launching it is a dispatch bug
#endif
}
