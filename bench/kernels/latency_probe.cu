// bench/gpu_latency.py: what the megakernel's fixed cost per instruction is made of, measured on one SM (block 0)
// while the other SMs idle or stream DRAM (`load`): a d = 0 cycle spends ~8 of its 12.7 ms outside the weights'
// streaming, in small steps that each take microseconds (bench/MEGAKERNEL.md "Where the skeleton's time may go").
// One block an SM (the host asks for the megakernel's shared memory), 256 threads. Block 0 measures, in SM cycles:
//   l2 / dram  a dependent chain of ld.global.cg over 2 MB (L2-resident) and over 1 GB (L2 misses), per load
//   l1         the same through L1 over 8 KB (what a table read costs where no acquire emptied L1 since)
//   solo       8 MB streamed by block 0's 256 threads, 64 KB in flight: one SM's bandwidth, alone (a group's tail,
//              where its last SMs stream) or beside the loaders (its share of DRAM)
//   fence      __threadfence() and fence.acq_rel.gpu alone, and after the block's 16 KB of stores and a barrier
//   ping       a signal to block 1 and its answer, through the megakernel's own wait_counter / signal_counter
//              (mk_common.cuh; this file is built once per MK_SYNC_ACQREL), after the block's stores and a barrier as
//              an instruction's end does: the per-step synchronisation
//   code       straight-line code (FFMA chains): 128 KB of it the first time (from DRAM: the host's flush left
//              nothing in L2), then a 16 KB body right after itself (warm: the instruction cache) and after 16-256
//              KB of other code: what an instruction's code costs when the layer's other instructions ran between
//              (the megakernel runs ~7 instructions' code a layer); the loaders stream evict-first, as its rings do
// Blocks 2 .. grid - 1 stream a buffer until block 0 is done when `load` is set; block 1 only answers pings.
#include "mk_common.cuh"

// The result slots (bench/gpu_latency.py SLOTS, in this order).
enum Slot {
    S_NS0, S_NS1, S_CLK0, S_CLK1,  // the global timer and clock64 around ~20 us of waiting: cycles per ns
    S_L2, S_DRAM, S_L1,             // cycles for CHASE_STEPS dependent loads
    S_SOLO,                         // cycles for SOLO_BYTES
    S_FENCE_IDLE, S_FENCE_STORES,   // the build's fence_release(), alone and after 16 KB of stores
    S_SC_IDLE, S_SC_STORES,         // __threadfence() likewise (the same as the above where MK_SYNC_ACQREL=0)
    S_PING,                         // cycles for PING_ROUNDS round trips
    S_CODE_DRAM,                    // all CODE_BLOCKS_ALL blocks of code_run, their first run
    S_CODE_WARM,                    // the last BODY_BLOCKS of them right after themselves
    S_CODE_AFTER0, S_CODE_AFTER1, S_CODE_AFTER2, S_CODE_AFTER3, S_CODE_AFTER4,  // after OTHER_BLOCKS[i] of code_other
    S_LOAD_NS, S_LOAD_BYTES,        // how long the loaders streamed, and how many bytes
    S_SINK, S_ERROR, NUM_SLOTS
};

#define CHASE_STEPS 256
#define PING_ROUNDS 64
#define LOAD_UNROLL 16
#define SOLO_BYTES (8 << 20)
#define PROBE_TIMEOUT_NS 2000000000ull

__device__ __forceinline__ u64 clk() {
    u64 c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
    return c;
}

// ---- straight-line code: blocks of 4 KB (256 FFMAs on 8 chains, which no compiler may fold) ----

#define FMA8(y, z) a0 = fmaf(a0, y, z); a1 = fmaf(a1, y, z); a2 = fmaf(a2, y, z); a3 = fmaf(a3, y, z); \
                   a4 = fmaf(a4, y, z); a5 = fmaf(a5, y, z); a6 = fmaf(a6, y, z); a7 = fmaf(a7, y, z);
#define X2(s) s s
#define X4(s) X2(s) X2(s)
#define BLOCK_4K(y, z) X2(X4(X4(FMA8(y, z))))
#define CASES8(k, y, z) case k: BLOCK_4K(y, z) case k + 1: BLOCK_4K(y, z) case k + 2: BLOCK_4K(y, z) \
    case k + 3: BLOCK_4K(y, z) case k + 4: BLOCK_4K(y, z) case k + 5: BLOCK_4K(y, z) case k + 6: BLOCK_4K(y, z) \
    case k + 7: BLOCK_4K(y, z)
#define CODE_BLOCKS_ALL 32
#define OTHER_BLOCKS_ALL 64
#define BODY_BLOCKS 4

// Both functions run the blocks from `first` to their end (a switch falling through: one straight run of code).
// The empty asm with a memory clobber makes each call a side effect: without it NVVM took them for pure functions,
// ran code_other once for all five passes and merged each timed pair of code_run calls into one, so every figure
// of rounds 11-13 but the 128 KB one timed no code at all (the PTX had 6 calls of code_run for 11 in the source).
__device__ __noinline__ float code_run(int first, float y, float z) {
    asm volatile("" ::: "memory");
    float a0 = y, a1 = z, a2 = y + z, a3 = y - z, a4 = 2.f * y, a5 = 2.f * z, a6 = y * z, a7 = y + 1.f;
    switch (first) { CASES8(0, y, z) CASES8(8, y, z) CASES8(16, y, z) CASES8(24, y, z) default: break; }
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
}

// 256 KB of other code, to push code_run's lines out of the instruction caches.
__device__ __noinline__ float code_other(int first, float y, float z) {
    asm volatile("" ::: "memory");
    float a0 = z, a1 = y, a2 = y * z, a3 = z - y, a4 = 3.f * y, a5 = 3.f * z, a6 = y + z, a7 = z + 1.f;
    switch (first) {
        CASES8(0, z, y) CASES8(8, z, y) CASES8(16, z, y) CASES8(24, z, y)
        CASES8(32, z, y) CASES8(40, z, y) CASES8(48, z, y) CASES8(56, z, y) default: break;
    }
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
}

__constant__ int OTHER_BLOCKS[5] = {4, 8, 16, 32, 64};  // 16 .. 256 KB

// ---- the measurements ----

struct Probe {
    u32* words;         // [0] loaders' stop, [1] loaders started, then the counters (stage 0: the ping's) and ctl
    const u32* l2_ring;  // next index (in u32 words) at each node
    const u32* dram_ring;
    const u32* l1_ring;
    const uint4* stream;  // what the loaders read
    long long stream_words;
    u32* scratch;        // [2][256 * 16] u32: blocks 0 and 1's stores before a fence or a signal
    u64* out;            // [NUM_SLOTS]
    float y, z;          // the code's operands (run-time values)
    int load;            // the other blocks stream while block 0 measures: 1 normal, 2 evict-first lines
};

// CHASE_STEPS dependent loads from `at` on (through L2 alone, or L1 where `cached`).
__device__ u64 chase(const u32* ring, u32& at, bool cached) {
    const u64 c0 = clk();
    for (int i = 0; i < CHASE_STEPS; ++i)
        at = cached ? *(ring + at) : (u32)ld_cg(reinterpret_cast<const int*>(ring) + at);
    return clk() - c0 + (at == 0xFFFFFFFFu);  // `at` used: the chain stays
}

__device__ void store_all(u32* scratch, u32 v) {  // 16 KB, 64 bytes a thread
#pragma unroll
    for (int k = 0; k < 4; ++k) reinterpret_cast<uint4*>(scratch)[threadIdx.x * 4 + k] = make_uint4(v, v, v, v);
}

// fence_release() of this build, or __threadfence(), after the block's stores (when `stores`) and a barrier.
template <bool SC> __device__ u64 time_fence(u32* scratch, bool stores) {
    if (stores) store_all(scratch, threadIdx.x);
    __syncthreads();
    u64 dt = 0;
    if (threadIdx.x == 0) {
        const u64 c0 = clk();
        if (SC) __threadfence(); else fence_release();
        dt = clk() - c0;
    }
    __syncthreads();
    return dt;
}

// Block `me` (0 or 1) of the ping: block 0 signals counter 0 and waits on counter 1, block 1 the other way round,
// each signal after the block's stores and a barrier (count_instruction), each wait by thread 0 then a barrier (the
// consumers released).
__device__ u64 ping(const Globals& g, int me, u32* scratch) {
    u64 c0 = 0;
    for (int r = 0; r < PING_ROUNDS + 4; ++r) {
        if (r == 4 && me == 0 && threadIdx.x == 0) c0 = clk();  // four rounds to warm up
        bool ok = true;
        if (me == 1) {
            if (threadIdx.x == 0) ok = wait_counter(g, 0, 0, r + 1, blockIdx.x, r);
            if (__syncthreads_or(!ok)) break;
        }
        store_all(scratch, r);
        __syncthreads();
        if (threadIdx.x == 0) signal_counter(g, 0, me);
        if (me == 0) {
            if (threadIdx.x == 0) ok = wait_counter(g, 0, 1, r + 1, blockIdx.x, r);
            if (__syncthreads_or(!ok)) break;
        }
    }
    return me == 0 && threadIdx.x == 0 ? clk() - c0 : 0;
}

// ld_cg_u4 with the L2 evict-first policy the megakernel's weight copies carry (common.cuh l2_evict_first).
__device__ __forceinline__ uint4 ld_ef_u4(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(l2_evict_first()));
    return v;
}

// One turn of a block's stream: LOAD_UNROLL 16-byte loads a thread from `src` on (64 KB), folded into `fold`;
// EVICT_FIRST: the lines marked first to go from L2.
template <bool EVICT_FIRST = false> __device__ __forceinline__ void stream_turn(const uint4* src, u32& fold) {
    uint4 v[LOAD_UNROLL];
#pragma unroll
    for (int j = 0; j < LOAD_UNROLL; ++j)
        v[j] = EVICT_FIRST ? ld_ef_u4(src + j * 256 + threadIdx.x) : ld_cg_u4(src + j * 256 + threadIdx.x);
#pragma unroll
    for (int j = 0; j < LOAD_UNROLL; ++j) fold ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
}

__device__ void stream_until_stopped(const Probe& p, const Globals& g) {
    const long long per_block = p.stream_words / (gridDim.x - 2);
    const long long begin = (blockIdx.x - 2) * per_block;
    u32 fold = 0;
    long long bytes = 0;
    if (threadIdx.x == 0) atomicAdd(p.words + 1, 1u);
    for (int turn = 0;; ++turn) {
        if ((turn & 15) == 0 && (ld_acquire(p.words) != 0 || mk_failed(g))) break;
        const long long base = begin + (long long)(turn % (int)(per_block / (256 * LOAD_UNROLL))) * 256 * LOAD_UNROLL;
        if (p.load == 2)
            stream_turn<true>(p.stream + base, fold);
        else
            stream_turn(p.stream + base, fold);
        bytes += 16 * LOAD_UNROLL;
    }
    if (fold == 0x9E3779B9u) p.out[S_SINK] = fold;
    atomicAdd(reinterpret_cast<unsigned long long*>(p.out + S_LOAD_BYTES), (unsigned long long)bytes);
}

extern "C" __global__ void __launch_bounds__(256, 1) latency_probe(Probe p) {
    Globals g{};
    g.counters = p.words + 2;
    g.ctl = reinterpret_cast<i32*>(p.words + 2 + 2 * NUM_OPCODES);
    if (blockIdx.x >= 2) {
        if (p.load) stream_until_stopped(p, g);
        return;
    }
    if (blockIdx.x == 1) {
        ping(g, 1, p.scratch + 256 * 16);
        return;
    }
    const bool t0 = threadIdx.x == 0;
    if (t0 && p.load) {  // every loader streaming, then ~50 us for DRAM to fill up
        const u64 t = global_ns();
        // ld_acquire, not ld_cg: the compiler hoisted ld_cg's asm (no memory clobber) out of this loop, so the
        // count was read once, before any loader had started (round 13: 0 of 130 after 2 s, every load run)
        int started = 0;
        while ((started = (int)ld_acquire(p.words + 1)) < (int)gridDim.x - 2) {
            if (global_ns() - t > PROBE_TIMEOUT_NS) {  // not every loader counted: no loaded figures
                mk_fail(g, ERR_WAIT_TIMEOUT, 0, -1, 0, 0, started, (int)gridDim.x - 2);
                break;
            }
        }
        const u64 t1 = global_ns();
        while (global_ns() - t1 < 50000) {}
    }
    __syncthreads();
    u64* out = p.out;
    const u64 load_t0 = global_ns();
    if (t0) {
        out[S_NS0] = global_ns();
        out[S_CLK0] = clk();
        const u64 t = global_ns();
        while (global_ns() - t < 20000) {}
        out[S_NS1] = global_ns();
        out[S_CLK1] = clk();
        u32 at = 0;
        chase(p.l2_ring, at, false);  // brings the walk's nodes into L2
        at = 0;  // the same nodes again (from where the first walk ended, every load missed: round 13's 347 ns)
        out[S_L2] = chase(p.l2_ring, at, false);
        at = 0;
        out[S_DRAM] = chase(p.dram_ring, at, false);
        at = 0;
        chase(p.l1_ring, at, true);
        out[S_L1] = chase(p.l1_ring, at, true);
    }
    {  // one SM streaming: 8 MB from the middle of the DRAM ring's buffer (not in L2, not the loaders')
        const uint4* src = reinterpret_cast<const uint4*>(p.dram_ring) + (64 << 20) / 16;
        u32 fold = 0;
        __syncthreads();
        const u64 c0 = clk();
        for (int t = 0; t < SOLO_BYTES / (16 * 256 * LOAD_UNROLL); ++t) stream_turn(src + t * 256 * LOAD_UNROLL, fold);
        if (__syncthreads_or(fold == 0x9E3779B9u) && t0) out[S_SINK] = 1;
        if (t0) out[S_SOLO] = clk() - c0;
    }
    u64 dt = time_fence<false>(p.scratch, false);
    if (t0) out[S_FENCE_IDLE] = dt;
    dt = time_fence<false>(p.scratch, true);
    if (t0) out[S_FENCE_STORES] = dt;
    dt = time_fence<true>(p.scratch, false);
    if (t0) out[S_SC_IDLE] = dt;
    dt = time_fence<true>(p.scratch, true);
    if (t0) out[S_SC_STORES] = dt;
    dt = ping(g, 0, p.scratch);
    if (t0) out[S_PING] = dt;
    if (threadIdx.x < 32) {  // one warp runs the code (the others would only share its fetches)
        const int body = CODE_BLOCKS_ALL - BODY_BLOCKS;
        u64 c0 = clk();
        float sink = code_run(0, p.y, p.z);
        if (t0) out[S_CODE_DRAM] = clk() - c0;
        c0 = clk();
        sink += code_run(body, p.y, p.z);
        if (t0) out[S_CODE_WARM] = clk() - c0;
        for (int i = 0; i < 5; ++i) {
            sink += code_run(body, p.y, p.z);  // the body in the instruction cache, then the other code over it
            sink += code_other(OTHER_BLOCKS_ALL - OTHER_BLOCKS[i], p.y, p.z);
            c0 = clk();
            sink += code_run(body, p.y, p.z);
            if (t0) out[S_CODE_AFTER0 + i] = clk() - c0;
        }
        if (t0 && sink == 1.2345f) out[S_SINK] = 1;
    }
    __syncthreads();
    if (t0) {
        out[S_LOAD_NS] = global_ns() - load_t0;
        out[S_ERROR] = (u64)ctl_get(g, CTL_ERROR);
        atomicExch(p.words, 1u);  // the loaders stop
    }
}

// Node i of a ring of n nodes `stride` words apart, visited in the order `order` (a permutation, order[0] = 0):
// the word at order[i] * stride holds order[i + 1] * stride.
extern "C" __global__ void latency_ring(u32* ring, const u32* order, int n, int stride) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ring[(long long)order[i] * stride] = order[(i + 1) % n] * (u32)stride;
}
