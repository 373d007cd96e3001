// Device helpers of the megakernel: coherent loads, named barriers, the counter protocol with its timeout, timing,
// the act-layout store every activation producer uses, and the shared-memory map.
//
// Coherence rule: anything written during the launch (activations, control words, KV rows of this pass, partials)
// is read with ld.global.cg (L2), never through L1 or the read-only path, which may hold a line from an earlier
// phase of the same launch. Only weights (read-only for the whole launch) use the streaming .nc loads.
#pragma once
#include "globals.cuh"
#include "quants.cuh"
#include "act8.cuh"

#ifdef MK_DEBUG
#define MK_PRINTF(...) printf(__VA_ARGS__)
#else
#define MK_PRINTF(...) ((void)0)
#endif

// Dynamic shared memory of the kernel: build.smem_bytes(arch) sets it per GPU (every op's scratch fits the 96 KB
// that every GPU from sm_80 on allows; the matmul rings take what more the GPU has).
#ifndef MK_SMEM_BYTES
#define MK_SMEM_BYTES 98304
#endif

// ---- loads and stores of data produced during the launch ----

__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ int ld_cg(const i32* p) {
    int v;
    asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ uint2 ld_cg_u2(const void* p) {
    uint2 v;
    asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ uint4 ld_cg_u4(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// Four consecutive floats (16-byte aligned) into v.
__device__ __forceinline__ void ld_cg_f4(const float* p, float (&v)[4]) {
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(p));
}

__device__ __forceinline__ u32 ld_cg_u32(const void* p) {
    u32 v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ f16 ld_cg_f16(const f16* p) {
    u16 v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// ---- the fences of the counter protocol ----
//
// MK_SYNC_ACQREL=1 (a benchmark knob, off; not yet run on a GPU): release and acquire operations where the protocol
// had __threadfence(). __threadfence() is a sequentially consistent fence (SASS: MEMBAR.SC.GPU, then CCTL.IVALL,
// which empties the SM's L1); the counters need only release (the writer's stores out before its count: `red.release`
// is MEMBAR.ALL.GPU and the add, no L1 invalidation) and acquire (the waiter's loads after the count it saw: a
// relaxed poll, then one fence.acq_rel, where ld.acquire invalidated L1 on every poll). Each SM signals ~8 times a
// layer, on the step's critical path, and its poll made two dependent L2 round trips a turn (the counter, then the
// error word); with the knob both loads are in flight at once. SASS checked with nvdisasm; the PTX memory model's
// release / acquire patterns, so no result can change.
#ifndef MK_SYNC_ACQREL
#define MK_SYNC_ACQREL 0
#endif

__device__ __forceinline__ u32 ld_relaxed(const u32* p) {
    u32 v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// This thread's stores (and, through a barrier before it, the block's) visible at GPU scope before what follows.
__device__ __forceinline__ void fence_release() {
#if MK_SYNC_ACQREL
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
#else
    __threadfence();
#endif
}

// Other SMs' stores, seen counted by a relaxed or atomic read before it, visible to this thread's loads after it.
__device__ __forceinline__ void fence_acquire() { fence_release(); }

// Counter += 1 after this thread's (and the barrier's) stores: a release add (no L1 invalidation) with the knob.
__device__ __forceinline__ void add_release(u32* counter) {
#if MK_SYNC_ACQREL
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
#else
    __threadfence();
    atomicAdd(counter, 1u);
#endif
}

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---- the timing slots of the bench's launches (g.timings set; opcodes.cuh TIME_*) ----

// The index in the SM's queue of the instruction the block runs (consumer thread 0 sets and reads it), and whether
// its first matmul batch is still to record TIME_FIRST (set with the index, cleared by record_first).
__shared__ int mk_inst_index;
__shared__ int mk_first_pending;

// Slot `slot` of the block's current instruction: now. Consumer thread 0 records; the others pass.
__device__ __forceinline__ void record_time(const Globals& g, int slot) {
    if (g.timings && threadIdx.x == MK_FIRST_CONSUMER * 32)
        g.timings[((i64)blockIdx.x * g.max_len + mk_inst_index) * TIME_SLOTS + slot] = global_ns();
}

// MK_TRACE (a benchmark knob, 0 by default): each consumer warp's lane 0 records the events of opcodes.cuh TRACE_*
// for every instruction (a launch's per-warp timeline: where an instruction's first batch, its units and its fold
// spend their time, warp by warp). Consumer thread 0 points mk_trace_at at the instruction's events with the
// index; each warp counts its batches in mk_trace_batches (its own word: no warp waits on another to read it).
// With the controller (MK_CONTROLLER=1) the pointer is set without a barrier before the consumers read it.
#ifndef MK_TRACE
#define MK_TRACE 0
#endif
#if MK_TRACE
static_assert(MK_CONSUMER_WARPS <= TRACE_WARPS, "the trace has room for TRACE_WARPS consumer warps");
__shared__ u64* mk_trace_at;
__shared__ int mk_trace_batches[MK_CONSUMER_WARPS];
#endif

// MK_TRACE: where the block's current instruction records its warps' events (consumer thread 0, with
// mk_inst_index).
__device__ __forceinline__ void set_trace_slot(const Globals& g) {
#if MK_TRACE
    mk_trace_at = g.timings ? g.timings + (i64)gridDim.x * g.max_len * TIME_SLOTS +
                                  ((i64)blockIdx.x * g.max_len + mk_inst_index) * TRACE_WARPS * TRACE_EVENTS
                            : nullptr;
#endif
}

// TIME_FIRST of the block's current instruction, once: at its first matmul batch.
__device__ __forceinline__ void record_first(const Globals& g) {
    if (g.timings && threadIdx.x == MK_FIRST_CONSUMER * 32 && mk_first_pending) {
        g.timings[((i64)blockIdx.x * g.max_len + mk_inst_index) * TIME_SLOTS + TIME_FIRST] = global_ns();
        mk_first_pending = 0;
    }
}

// ---- named barriers (bar.sync / bar.arrive with a thread count: warp roles meet without __syncthreads) ----

__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void consumers_sync() { bar_sync(BAR_CONSUMERS, MK_CONSUMER_THREADS); }

// Consumer warp index 0 .. MK_CONSUMER_WARPS - 1 and thread index among the consumers.
__device__ __forceinline__ int cwarp() { return (threadIdx.x >> 5) - MK_FIRST_CONSUMER; }
__device__ __forceinline__ int ctid() { return threadIdx.x - MK_FIRST_CONSUMER * 32; }

// MK_TRACE: event e of this warp in the current instruction: now, or `value` where given (lane 0 records).
__device__ __forceinline__ void trace_event(int e, long long value = -1) {
#if MK_TRACE
    if ((threadIdx.x & 31) == 0 && mk_trace_at)
        mk_trace_at[cwarp() * TRACE_EVENTS + e] = value < 0 ? global_ns() : (u64)value;
#endif
}
// MK_TRACE: the warp starts an instruction (past its first barrier).
__device__ __forceinline__ void trace_start() {
#if MK_TRACE
    if ((threadIdx.x & 31) == 0) mk_trace_batches[cwarp()] = 0;
    trace_event(TRACE_START);
#endif
}
// MK_TRACE: the warp starts a matmul batch; returns the first index of its events (TRACE_FIRST for the
// instruction's first batch, TRACE_LAST after).
__device__ __forceinline__ int trace_batch() {
#if MK_TRACE
    int set = TRACE_FIRST;  // lane 0's is the one that counts: only lane 0 records
    if ((threadIdx.x & 31) == 0) set = mk_trace_batches[cwarp()]++ ? TRACE_LAST : TRACE_FIRST;
    trace_event(set + TRACE_ENTER);
    return set;
#else
    return 0;
#endif
}

// ---- failure: the first error wins, every spinning SM sees it and the launch winds down ----

__device__ __forceinline__ void mk_fail(const Globals& g, int code, int sm, int index, int a, int b, int c, int d) {
    if (atomicCAS(g.ctl + CTL_ERROR, ERR_NONE, code) == ERR_NONE) {
        const int info[6] = {sm, index, a, b, c, d};
        for (int i = 0; i < 6; ++i) g.ctl[CTL_ERROR_INFO + i] = info[i];
        __threadfence();
    }
}

__device__ __forceinline__ bool mk_failed(const Globals& g) { return ctl_get(g, CTL_ERROR) != ERR_NONE; }

// One turn of a wait: whether the counter has reached `expected` (have: its value; failed: another SM failed).
__device__ __forceinline__ bool counter_reached(const Globals& g, const u32* counter, u32 expected, u32& have,
                                                bool& failed) {
#if MK_SYNC_ACQREL
    have = ld_relaxed(counter);
    failed = mk_failed(g);  // asked for with the counter: one round trip a turn
    return have >= expected;
#else
    have = ld_acquire(counter);
    if (have >= expected) return true;
    failed = mk_failed(g);
    return false;
#endif
}

// Spin until counter (stage, op) reaches `expected`; false on timeout or when another SM failed.
__device__ bool wait_counter(const Globals& g, int stage, int op, u32 expected, int sm, int index) {
    const u32* counter = g.counters + stage * NUM_OPCODES + op;
    const u64 t0 = global_ns();
    u32 have;
    bool failed = false;
    while (!counter_reached(g, counter, expected, have, failed)) {
        if (failed) return false;
        if (global_ns() - t0 > MK_WAIT_TIMEOUT_NS) {
            mk_fail(g, ERR_WAIT_TIMEOUT, sm, index, stage, op, (int)have, (int)expected);
            return false;
        }
        __nanosleep(64);
    }
    if (MK_SYNC_ACQREL) fence_acquire();
    return true;
}

// After a consumer barrier: make this instruction's stores visible at GPU scope, then count it.
__device__ __forceinline__ void signal_counter(const Globals& g, int stage, int op) {
    add_release(g.counters + stage * NUM_OPCODES + op);
}

// ---- the act layout (kernels/mmvq.cu): position k of token n ----

__device__ __forceinline__ i64 act_offset(int k, int n) {
    const int sb = k >> 8, kl = k & 255;
    const int c = kl >> 6, h = (kl >> 5) & 1, i = (kl >> 2) & 7, r = kl & 3;
    return ((i64)(sb * SB_STEPS + 2 * i + h) * 8 + n) * 16 + 4 * c + r;
}

// MK_ACT8_FILL=0 (a benchmark knob): act_ffn and act_mix without their int8 copy (f16 FFN_DOWN and MIX_OUT).
#ifndef MK_ACT8_FILL
#define MK_ACT8_FILL 1
#endif
// MK_MV_I8ROWS (mv_int8.cuh; 0: a benchmark knob): the Q4_K matmuls of 2 to MK_ACT8_ROWS_MAX rows on the act's
// int8 levels.
#ifndef MK_MV_I8ROWS
#define MK_MV_I8ROWS 1
#endif
#define MK_ACT8_ROWS_MAX 5
// MK_ACT8_FILL_ROWS=1 (a benchmark knob, off: it lost): act8_fill forms act_ffn's and act_mix's int8 copy at 2 to
// MK_ACT8_ROWS_MAX rows too, so FFN_DOWN's and MIX_OUT's Q4_K matmuls of the verify rows take the int8 rows path
// as MIX_IN's and FFN_UP's do. Round 12 (H100, d = 4): 19.57 ms against 18.77 without it (FFN_DOWN 51.5 against
// 41.0 us a group, MIX_OUT 20.5 / 20.0): their 68 and 24 superblocks go through the rows' shared levels in chunks
// of MK_ACT8_ROWS_SB, each chunk a batch of a few units a warp that pays the ring's start and the levels' copy
// again (bench/MEGAKERNEL.md round 12).
#ifndef MK_ACT8_FILL_ROWS
#define MK_ACT8_FILL_ROWS 0
#endif
// Whether an act whose writers form its int8 copy (ActRef::fill) has it at `rows` rows: its writers (act_store)
// and its readers (matvec.cuh mv_act_i8) ask the same question. VM mirror: solvers.act8_fill_written.
__device__ __forceinline__ bool act8_fill_at(int rows) {
    return MK_ACT8_FILL && (rows == 1 || (MK_ACT8_FILL_ROWS && rows <= MK_ACT8_ROWS_MAX));
}
__device__ void act8_fill(const ActRef& a, int p0, int len, int rows);

// Store values vals[n * ld + j] (shared memory) of positions p0 + j, j < len, rows n < rows, into an act buffer:
// f16 hi and lo parts, and per 32-position sub-block the hi + lo f16 pair of the sum of exactly what the matmul
// will multiply. p0 is a multiple of 32; positions at or past the act's width are left alone (they stay zero).
// An act whose writers form its int8 copy (ActRef::fill) gets it where act8_fill_at says: act8_fill. Called by
// every consumer warp; a warp handles whole sub-blocks.
__device__ __noinline__ void act_store(const ActRef& a, int p0, int len, int rows, const float* vals, int ld) {
    const int lane = threadIdx.x & 31, num_sub = (len + 31) / 32;
    for (int item = cwarp(); item < rows * num_sub; item += MK_CONSUMER_WARPS) {
        const int n = item / num_sub, j = 32 * (item % num_sub) + lane, k = p0 + j;
        const bool inside = j < len && k < a.width;
        const float v = inside ? vals[n * ld + j] : 0.f;
        const f16 hi = f32_to_f16(v);
        const f16 lo = f32_to_f16(v - f16_to_f32(hi));
        if (inside) {
            const i64 o = act_offset(k, n);
            a.x16[o] = hi;
            a.x16_lo[o] = lo;
        }
        const float sub = warp_sum(inside ? f16_to_f32(hi) + f16_to_f32(lo) : 0.f);
        if (lane == 0 && p0 + 32 * (item % num_sub) < a.width) {
            const int kb = p0 + 32 * (item % num_sub);
            const i64 si = ((i64)(kb >> 8) * 8 + n) * 8 + ((kb & 255) >> 5);
            const f16 sh = f32_to_f16(sub);
            a.sums[si] = sh;
            a.sums_lo[si] = f32_to_f16(sub - f16_to_f32(sh));
        }
    }
    if (a.fill && act8_fill_at(rows)) act8_fill(a, p0, len, rows);
}

// The int8 copy (ActRef::q8) of superblock sb of rows [0, rows) from vals[n * ld + j], j < 256 (shared memory),
// as kernels/act.cu's act_i8 forms it: Act8Levels over the superblock's largest |v| of each row, and each
// sub-block's sum of what the int8 mma sees as an f16 pair, positions in the act8 order (kernels/mmvq_i8.cu).
// One row: a warp a sub-block, each finding the row's largest itself (FFN_NORM 7.0 us against 7.4 a warp a row);
// more rows: a warp a row, lane l taking positions 8l .. 8l + 7 (at 5 rows the items' repeated maxima cost 14.0
// against 12.2 us; bench/MEGAKERNEL.md round 6).
// One row's int8 copy of sub-block j of superblock sb from its values get(p), p < 256: the warp finds the row's
// largest itself; every value is asked for before any is used (one round trip where get loads).
template <class Get> __device__ __forceinline__ void act8_sub_block(const ActRef& a, int sb, int j, Get&& get) {
    const int lane = threadIdx.x & 31, p = 32 * j + lane;
    float v[8], mx = 0.f, mine = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = get(lane + 32 * k);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        mx = fmaxf(mx, fabsf(v[k]));
        mine = k == j ? v[k] : mine;  // position p (a run-time index into v would put it in local memory)
    }
    const Act8Levels lv(warp_max(mx));
    float qh, ql;
    const float seen = lv.quantize(mine, qh, ql);
    i8* q = a.q8 + (i64)sb * 4096 + 64 * (p >> 6) + 16 * ((p & 31) >> 3) + 8 * ((p >> 5) & 1) + (p & 7);
    q[0] = (i8)(int)qh;
    q[2048] = (i8)(int)ql;  // level 1: 8 rows of 256 on
    const float sub = warp_sum(seen);
    if (lane == 0) {
        store_f16_pair(a.sums8, a.sums8_lo, (i64)sb * 64 + j, sub);
        if (j == 0) {
            a.scale8[(i64)sb * 16] = lv.s;
            a.scale8[(i64)sb * 16 + 8] = lv.s_lo;
        }
    }
}
// One row's int8 copy of superblock sb: a warp a sub-block.
template <class Get> __device__ __forceinline__ void act8_one_row(const ActRef& a, int sb, Get&& get) {
    for (int j = cwarp(); j < 8; j += MK_CONSUMER_WARPS) act8_sub_block(a, sb, j, get);
}

// What an act's f16 hi + lo pair holds of v (act_store's parts): act8_store quantises that, as act8_fill does, so
// every int8 copy is the encoding of its act as the GPU holds it (diff.py act8_mismatch checks it exactly).
__device__ __forceinline__ float act_held(float v) {
    const float hi = f16_to_f32(f32_to_f16(v));
    return hi + f16_to_f32(f32_to_f16(v - hi));
}

// Lane l's positions 8l .. 8l + 7 of one row's superblock as the two int8 levels of the superblock's largest |v|
// (the warp's max of the lanes' mx): the levels packed 4 a word (byte e % 4 of word e / 4), and each sub-block's
// sum of what the int8 mma sees (its 4 lanes' shares, on all 4).
struct Act8Lane {
    Act8Levels lv;
    u32 hi[2] = {0u, 0u}, lo[2] = {0u, 0u};
    float sub = 0.f;
    __device__ __forceinline__ Act8Lane(const float (&v)[8], float mx) : lv(warp_max(mx)) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float qh, ql;
            sub += lv.quantize(v[e], qh, ql);
            hi[e >> 2] |= ((u32)(int)qh & 0xFFu) << (8 * (e & 3));
            lo[e >> 2] |= ((u32)(int)ql & 0xFFu) << (8 * (e & 3));
        }
        sub += __shfl_xor_sync(FULL_MASK, sub, 1);
        sub += __shfl_xor_sync(FULL_MASK, sub, 2);
    }
    // Into row n of superblock sb of act a's int8 copy.
    __device__ __forceinline__ void store(const ActRef& a, int sb, int n, int lane) const {
        i8* q = a.q8 + (i64)sb * 4096 + n * 256 + 64 * (lane >> 3) + 16 * (lane & 3) + 8 * ((lane >> 2) & 1);
        *reinterpret_cast<uint2*>(q) = make_uint2(hi[0], hi[1]);
        *reinterpret_cast<uint2*>(q + 2048) = make_uint2(lo[0], lo[1]);
        if ((lane & 3) == 0) store_f16_pair(a.sums8, a.sums8_lo, ((i64)sb * 8 + n) * 8 + (lane >> 2), sub);
        if (lane == 0) {
            a.scale8[(i64)sb * 16 + n] = lv.s;
            a.scale8[(i64)sb * 16 + 8 + n] = lv.s_lo;
        }
    }
};

// Every row's int8 copy of superblock sb from get(p, n), position p < 256 of row n: a warp a row, lane l taking
// positions 8l .. 8l + 7, all its values asked for before any is used (one round trip where get loads).
template <class Get> __device__ __forceinline__ void act8_rows(const ActRef& a, int sb, int rows, Get&& get) {
    const int lane = threadIdx.x & 31;
    for (int n = cwarp(); n < rows; n += MK_CONSUMER_WARPS) {
        float v[8], mx = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = get(8 * lane + e, n);
#pragma unroll
        for (int e = 0; e < 8; ++e) mx = fmaxf(mx, fabsf(v[e]));
        Act8Lane(v, mx).store(a, sb, n, lane);
    }
}

__device__ __noinline__ void act8_store(const ActRef& a, int sb, int rows, const float* vals, int ld) {
    if (rows == 1)
        act8_one_row(a, sb, [&](int p) { return act_held(vals[p]); });
    else
        act8_rows(a, sb, rows, [&](int p, int n) { return act_held(vals[n * ld + p]); });
}

// The int8 copy of an act whose superblocks are written in parts by several instructions (act_ffn: FFN_UP's
// 128-160-position runs; act_mix: DN_RULE's 128-wide heads), at the rows act8_fill_at names: each act_store of
// positions [p0, p0 + len) of all rows counts them into their superblocks' fill (after a fence, as signal_counter
// does), and the instruction whose count completes a superblock forms every row's levels from the f16 hi + lo of
// all its writers (read back from L2, so the copy is the same whichever instruction closes it) and zeroes the
// count for the next layer. The matmuls then take these acts as int8 levels too (FFN_DOWN, MIX_OUT; one row:
// bench/MEGAKERNEL.md round 7). Every consumer thread calls it, after its act stores.
__device__ void act8_fill(const ActRef& a, int p0, int len, int rows) {
    __shared__ int closed;  // the superblocks (bits from p0's) this call completed
    consumers_sync();       // every warp's stores issued
    const int sb0 = p0 >> 8, end = min(p0 + len, a.width);
    if (ctid() == 0) {
        fence_release();
        int bits = 0;
        for (int sb = sb0; 256 * sb < end; ++sb) {
            const int lo = max(p0, 256 * sb), hi = min(end, 256 * sb + 256);
            const u32 want = (u32)min(256, a.width - 256 * sb);
            if (atomicAdd(a.fill + sb, (u32)(hi - lo)) + (u32)(hi - lo) == want) bits |= 1 << (sb - sb0);
        }
        closed = bits;
        fence_acquire();  // the other writers' stores are visible to the loads below
    }
    consumers_sync();
    const int bits = closed;
    const auto held = [&](int k, int n) {  // position k of row n as the act's f16 pair holds it
        const i64 o = act_offset(k, n);
        return f16_to_f32(ld_cg_f16(a.x16 + o)) + f16_to_f32(ld_cg_f16(a.x16_lo + o));
    };
    for (int sb = sb0; bits >> (sb - sb0); ++sb) {
        if (!((bits >> (sb - sb0)) & 1)) continue;
        if (rows == 1)
            act8_one_row(a, sb, [&](int p) { return held(256 * sb + p, 0); });
        else
            act8_rows(a, sb, rows, [&](int p, int n) { return held(256 * sb + p, n); });
        if (ctid() == 0) a.fill[sb] = 0u;
    }
    consumers_sync();  // `closed` is read before the next call writes it
}

// ---- shared memory: the instruction ring (static) and one scratch area (dynamic) ----

struct Smem {
    i32 inst[2][INST_WORDS];  // the controller's ring of two instruction slots
    volatile int progress;    // instruction index the controller has reached (the loader stays ahead of it)
    int flag;                 // a consumer-wide answer one thread gives the others (pieces.cuh piece_arrive)
    float* scratch;           // MK_SMEM_BYTES of dynamic shared memory
};

// Four floats of x from L2, or (SMEM) from shared memory.
template <bool SMEM>
__device__ __forceinline__ void ld_x4(const float* p, float (&v)[4]) {
    if (SMEM) {
        const float4 q = *reinterpret_cast<const float4*>(p);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        ld_cg_f4(p, v);
    }
}

// Row-wise 1/rms of `rows` rows of x [rows, width] (row stride ld), into inv[rows] (shared); every consumer thread
// sums a slice of every row with independent (16-byte where aligned) loads, all rows' at once (a warp a row took
// width / 32 dependent turns: ~9.7 us an ATTN_NORM at T = 1 on the H200, bench/MEGAKERNEL.md round 4; a row after
// another, 11.2 us at 5 rows against 10.3, round 5). From L2 the compiler keeps only ~3 of a thread's loads in
// flight here (a called function's few registers), so each 4,096 positions of every row cost a round trip: SMEM,
// x already in shared memory (norm_act.cuh's staged rows), avoids that. Each row's sums run in the same order
// either way, and the warps' sums then add up in warp order. red: [MK_MAX_ROWS][MK_CONSUMER_WARPS] floats of
// scratch.
template <bool SMEM = false>
__device__ __noinline__ void rows_inv_rms(const float* x, int rows, int width, int ld, float eps, float* inv,
                                          float* red) {
    const bool vec = (width & 3) == 0 && (ld & 3) == 0 && (reinterpret_cast<u64>(x) & 15) == 0;
    float ss[MK_MAX_ROWS];
#pragma unroll
    for (int n = 0; n < MK_MAX_ROWS; ++n) ss[n] = 0.f;
    if (vec && rows == 1) {  // one row: its loads unrolled across k (the loop below issues a turn's rows at once)
#pragma unroll 4
        for (int k = 4 * ctid(); k < width; k += 4 * MK_CONSUMER_THREADS) {
            float v[4];
            ld_x4<SMEM>(x + k, v);
            ss[0] += v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
        }
    } else if (vec) {
        for (int k = 4 * ctid(); k < width; k += 4 * MK_CONSUMER_THREADS) {
#pragma unroll
            for (int n = 0; n < MK_MAX_ROWS; ++n)
                if (n < rows) {
                    float v[4];
                    ld_x4<SMEM>(x + (i64)n * ld + k, v);
                    ss[n] += v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
                }
        }
    } else {
        for (int k = ctid(); k < width; k += MK_CONSUMER_THREADS) {
#pragma unroll
            for (int n = 0; n < MK_MAX_ROWS; ++n)
                if (n < rows) {
                    const float v = SMEM ? x[(i64)n * ld + k] : ld_cg(x + (i64)n * ld + k);
                    ss[n] += v * v;
                }
        }
    }
#pragma unroll
    for (int n = 0; n < MK_MAX_ROWS; ++n)
        if (n < rows) {
            const float t = warp_sum(ss[n]);
            if ((threadIdx.x & 31) == 0) red[n * MK_CONSUMER_WARPS + cwarp()] = t;
        }
    consumers_sync();
    if (ctid() < rows) {
        float t = 0.f;
        for (int w = 0; w < MK_CONSUMER_WARPS; ++w) t += red[ctid() * MK_CONSUMER_WARPS + w];
        inv[ctid()] = rsqrtf(t / width + eps);
    }
    consumers_sync();
}

// ---- the reference's activations with accurate exponentials (engine/reference/ops.py) ----

__device__ __forceinline__ float sigmoid_ref(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float silu_ref(float x) { return x * sigmoid_ref(x); }
__device__ __forceinline__ float softplus_ref(float x) { return x > 20.f ? x : log1pf(expf(x)); }
