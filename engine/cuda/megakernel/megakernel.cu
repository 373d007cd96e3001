// The megakernel: one persistent launch runs a whole program (engine/cuda/megakernel/schedule.py) - for a cycle,
// 1 + d rows through every layer, the head, acceptance, the MTP pass and the drafts for the next cycle.
//
// One block per SM; this file only sends each warp to its role's loop and holds the switch from opcode to
// instruction. By default (MK_CONTROLLER=0) the block is the 8 consumer warps alone: SoloConsumer, whose thread 0
// fetches each instruction and waits for its counter (measured 0.6 ms a d = 0 cycle faster than the roles below,
// bench/MEGAKERNEL.md round 4). With MK_CONTROLLER=1, MK_THREADS threads in warp roles:
//   controller (warp 0)  fetches the SM's instructions into a two-slot ring in shared memory and, for each, waits
//                        until the counter its header names reaches the value it names, then hands it over;
//   loader (warp 1)      runs MK_PREFETCH_AHEAD instructions ahead of the controller, requesting their weights
//                        into L2 (off by default: the requests competed with the matmuls' own reads);
//   consumers (8 warps)  run the instruction (compute, then store: each op's Consumer / Storer), then count it in
//                        the global counter (stage, opcode) that later instructions wait on.
// The controller and the consumers meet through named barriers (ready / free per ring slot), so no role waits on
// another for longer than the slot it needs.
// The rings' weight copies mark their L2 lines first to go (kernels/common.cuh WEIGHT_EVICT_FIRST, default 1), so
// that the kernel's code, activations and counters stay in L2 from one layer to the next instead of being pushed
// out by the weights' stream, which each pass reads once (bench/MEGAKERNEL.md rounds 10-11: the 27B d = 0 cycle
// 12.10 -> 10.74 ms, every phase faster). MK_W_EVICT_FIRST=0 builds the normal-priority copies for an A/B.
#ifdef MK_W_EVICT_FIRST
#define WEIGHT_EVICT_FIRST MK_W_EVICT_FIRST
#endif
#include "mk_common.cuh"
#include "matvec.cuh"
#include "prefetch.cuh"
#include "dequant.cuh"
#include "noop.cuh"
#include "embed.cuh"
#include "attn_norm.cuh"
#include "mix_in.cuh"
#include "dn_rule.cuh"
#include "attn_core.cuh"
#include "attn_combine.cuh"
#include "mix_out.cuh"
#include "ffn_norm.cuh"
#include "ffn_up.cuh"
#include "ffn_down.cuh"
#include "head_norm.cuh"
#include "lm_head.cuh"
#include "verify.cuh"
#include "mtp_in.cuh"
#include "mtp_eh.cuh"
#include "draft_head.cuh"
#include "draft_pick.cuh"
#include "finish.cuh"
#include "dn_commit.cuh"

#define MK_DISPATCH(X)               \
    X(OP_NOOP, NoopOp)               \
    X(OP_EMBED, EmbedOp)             \
    X(OP_ATTN_NORM, AttnNormOp)      \
    X(OP_MIX_IN, MixInOp)            \
    X(OP_DN_RULE, DnRuleOp)          \
    X(OP_ATTN_CORE, AttnCoreOp)      \
    X(OP_ATTN_COMBINE, AttnCombineOp) \
    X(OP_MIX_OUT, MixOutOp)          \
    X(OP_FFN_NORM, FfnNormOp)        \
    X(OP_FFN_UP, FfnUpOp)            \
    X(OP_FFN_DOWN, FfnDownOp)        \
    X(OP_HEAD_NORM, HeadNormOp)      \
    X(OP_LM_HEAD, LmHeadOp)          \
    X(OP_VERIFY, VerifyOp)           \
    X(OP_MTP_IN, MtpInOp)            \
    X(OP_MTP_EH, MtpEhOp)            \
    X(OP_DRAFT_HEAD, DraftHeadOp)    \
    X(OP_DRAFT_PICK, DraftPickOp)    \
    X(OP_FINISH, FinishOp)           \
    X(OP_DN_COMMIT, DnCommitOp)

// Each instruction's consumer as a function of its own: registers are allocated per instruction, not across the
// whole switch, and the compile time stays linear in the number of instructions.
template <class T>
__device__ __noinline__ void consume_op(const Globals& g, const i32* w, Smem& s) {
    T::Consumer::run(g, typename T::Parsed(w), w[INST_STAGE], s);
}

// The one switch from opcode to instruction, for the consumers ...
__device__ __noinline__ void consume(const Globals& g, const i32* w, Smem& s) {
    switch (w[INST_OPCODE]) {
#define MK_CONSUME(OPC, T) \
    case OPC: static_assert(T::OPCODE == OPC, #T); consume_op<T>(g, w, s); break;
        MK_DISPATCH(MK_CONSUME)
#undef MK_CONSUME
        default:
            if (ctid() == 0) mk_fail(g, ERR_BAD_OPCODE, blockIdx.x, -1, w[INST_OPCODE], 0, 0, 0);
    }
}

// ... and for the loader.
__device__ __noinline__ void prefetch(const Globals& g, const i32* w) {
    switch (w[INST_OPCODE]) {
#define MK_PREFETCH(OPC, T) \
    case OPC: T::Loader::run(g, T::Parsed(w)); break;
        MK_DISPATCH(MK_PREFETCH)
#undef MK_PREFETCH
        default: break;
    }
}

// Instruction w's first matmul (its weight, rows and act: the ops' Primer), for the opcodes that have one.
__device__ __forceinline__ bool first_matmul(const Globals& g, const i32* w, MvFirst& f) {
    const int stage = w[INST_STAGE];
    switch (w[INST_OPCODE]) {
#define MK_FIRST(OPC, T) \
    case OPC: return T::Primer::first(g, T::Parsed(w), stage, f);
        MK_FIRST(OP_MIX_IN, MixInOp)
        MK_FIRST(OP_MIX_OUT, MixOutOp)
        MK_FIRST(OP_FFN_UP, FfnUpOp)
        MK_FIRST(OP_FFN_DOWN, FfnDownOp)
        MK_FIRST(OP_LM_HEAD, LmHeadOp)
#undef MK_FIRST
        default: return false;
    }
}

// MK_MV_PRIME_NEXT: the first batch of instruction w's first matmul into the rings, before its wait (matvec.cuh
// mv_prime_first). Every consumer thread calls it, with w in global memory (the queue).
__device__ __noinline__ void prime_instruction(const Globals& g, const i32* w, Smem& s) {
    const int op = w[INST_OPCODE], stage = w[INST_STAGE];
    if (op < 0 || !stage_active(g, stage)) return;
    MvFirst f;
    if (first_matmul(g, w, f))
        mv_prime_first(f, stage_rows(g, stage), reinterpret_cast<u8*>(s.scratch) + MK_RING_OFFSET);
}

__device__ __forceinline__ void record(const Globals& g, int index, int slot) {
    if (g.timings) g.timings[((i64)blockIdx.x * g.max_len + index) * TIME_SLOTS + slot] = global_ns();
}

// Instruction i's words w (shared memory) fetched: wait until the counter its header names reaches its value. On a
// timeout or another SM's failure it is marked (opcode -1) so the consumers stop there. One thread calls it.
__device__ bool await_instruction(const Globals& g, i32* w, int i) {
    record(g, i, TIME_FETCHED);
    bool ok = true;
    // at one row a matmul that norms x itself waits on what the norm group it skips waits on (norm_own.cuh)
    const bool one_row = w[INST_WAIT1_COUNT] > 0 && norm_in_matmul(g, w[INST_STAGE]);
    const int count = w[one_row ? INST_WAIT1_COUNT : INST_WAIT_COUNT];
    if (count > 0)
        ok = wait_counter(g, w[one_row ? INST_WAIT1_STAGE : INST_WAIT_STAGE], w[one_row ? INST_WAIT1_OP : INST_WAIT_OP],
                          (u32)count, blockIdx.x, i);
    ok = ok && !mk_failed(g);
    if (!ok) w[INST_OPCODE] = -1;
    record(g, i, TIME_READY);
    return ok;
}

// Instruction i run: once every consumer's stores are out, count it in counter (stage, op). Every consumer calls it.
// Only the counting thread fences, after the barrier (cooperative groups' grid sync does the same: a fence is
// cumulative over the stores the barrier ordered before it); every thread's fence (MK_COUNT_FENCE_ALL=1) took
// 0.9 us an instruction against 0.5, 0.23 ms a d = 0 cycle (bench/MEGAKERNEL.md round 5).
#ifndef MK_COUNT_FENCE_ALL
#define MK_COUNT_FENCE_ALL 0
#endif
__device__ void count_instruction(const Globals& g, int stage, int op, int i) {
    if (MK_COUNT_FENCE_ALL) __threadfence();
    consumers_sync();
    if (ctid() == 0) {
        signal_counter(g, stage, op);
        record(g, i, TIME_DONE);
    }
}

struct Controller {
    static __device__ void run(const Globals& g, Smem& s) {
        const int lane = threadIdx.x & 31, n = g.queue_len[blockIdx.x], both = 32 + MK_CONSUMER_THREADS;
        const i32* queue = g.instructions + (i64)blockIdx.x * g.max_len * INST_WORDS;
        int i = 0;
        for (; i < n; ++i) {
            const int slot = i & 1;
            if (i >= 2) bar_sync(slot ? BAR_FREE1 : BAR_FREE0, both);  // the consumers are done with instruction i - 2
            if (lane < INST_WORDS) s.inst[slot][lane] = queue[(i64)i * INST_WORDS + lane];
            __syncwarp();
            bool ok = true;
            if (lane == 0) {
                ok = await_instruction(g, s.inst[slot], i);
                s.progress = i;
            }
            ok = __shfl_sync(FULL_MASK, ok, 0);
            __threadfence_block();
            bar_arrive(slot ? BAR_READY1 : BAR_READY0, both);
            if (!ok) break;
        }
        // consume the consumers' arrivals still pending on the free barriers: the last two instructions, or after a
        // stop at instruction i the one before it (the consumers do not arrive for the instruction they stop at)
        if (i == n) {
            for (int j = max(n - 2, 0); j < n; ++j) bar_sync((j & 1) ? BAR_FREE1 : BAR_FREE0, both);
        } else if (i >= 1) {
            bar_sync(((i - 1) & 1) ? BAR_FREE1 : BAR_FREE0, both);
        }
        s.progress = n;  // lets the loader finish
    }
};

struct Loader {
    static __device__ void run(const Globals& g, Smem& s) {
        const int n = MK_PREFETCH_AHEAD < 0 ? 0 : g.queue_len[blockIdx.x];  // negative: no prefetch (a benchmark knob)
        const i32* queue = g.instructions + (i64)blockIdx.x * g.max_len * INST_WORDS;
        for (int j = 0; j < n; ++j) {
            while (s.progress < j - MK_PREFETCH_AHEAD) {
                if (mk_failed(g)) return;
                __nanosleep(256);
            }
            const i32* w = queue + (i64)j * INST_WORDS;
            if (stage_active(g, w[INST_STAGE])) prefetch(g, w);
        }
    }
};

struct Consumer {
    static __device__ void run(const Globals& g, Smem& s) {
        const int n = g.queue_len[blockIdx.x], both = 32 + MK_CONSUMER_THREADS;
        for (int i = 0; i < n; ++i) {
            const int slot = i & 1;
            bar_sync(slot ? BAR_READY1 : BAR_READY0, both);
            const i32* w = s.inst[slot];
            const int op = w[INST_OPCODE], stage = w[INST_STAGE];
            if (op < 0) return;  // the controller stopped: a wait timed out or another SM failed
            if (ctid() == 0) mk_inst_index = i, mk_first_pending = 1, set_trace_slot(g);
            trace_start();
            if (stage_active(g, stage)) consume(g, w, s);
            trace_event(TRACE_BODY);
            record_time(g, TIME_BODY);
            count_instruction(g, stage, op, i);
            bar_arrive(slot ? BAR_FREE1 : BAR_FREE0, both);
        }
    }
};

// MK_WAIT_PREFETCH=1 (a benchmark knob, off): while consumer thread 0 waits for an instruction's dependencies,
// warp 1 asks L2 for its weights (MK_PREFETCH_CAP_ROWS of them, if set): the wait is mostly the group's stragglers,
// when DRAM has bandwidth to spare. (The loader warp's prefetch ran during the instructions before and competed with
// their rings: 2 ms a cycle, round 3.) It lost in round 8 (12.93 / 13.56 ms at 32 / 128 rows against 12.73): the
// prefetches went out as each SM finished, into the tail of the group before, whose last SMs were still streaming.
// MK_WAIT_PREFETCH=2 (not yet run on a GPU): only where DRAM is idle: an instruction after a norm group (MIX_IN,
// FFN_UP: the one-row wait words name what the norms wait on) asks for its first batch's rows once the group
// before the norms is complete, so they load during the norms' ~8 us (20 SMs normalising one row) and the batch
// then reads them from L2; not at all if the norms are done first.
#ifndef MK_WAIT_PREFETCH
#define MK_WAIT_PREFETCH 0
#endif

// MK_WAIT_PREFETCH=2's prefetch by one warp: wait (relaxed reads: a hint needs no ordering) for the group before
// the norms, then ask L2 for the first batch's rows.
__device__ __noinline__ void prefetch_during_norms(const Globals& g, const i32* w) {
    const u32 want_before = (u32)w[INST_WAIT1_COUNT], want_norms = (u32)w[INST_WAIT_COUNT];
    if ((int)want_before <= 0) return;
    const u32* before = g.counters + w[INST_WAIT1_STAGE] * NUM_OPCODES + w[INST_WAIT1_OP];
    const u32* norms = g.counters + w[INST_WAIT_STAGE] * NUM_OPCODES + w[INST_WAIT_OP];
    int go = 0;
    if ((threadIdx.x & 31) == 0) {
        for (;;) {
            const u32 done = ld_relaxed(before), normed = ld_relaxed(norms);
            if (normed >= want_norms || mk_failed(g)) break;  // too late: the instruction is ready
            if (done >= want_before) {
                go = 1;
                break;
            }
            __nanosleep(64);
        }
    }
    MvFirst f;
    if (!__shfl_sync(FULL_MASK, go, 0) || !first_matmul(g, w, f)) return;
    const MvNext nx = mv_first_batch(*f.w, f.row_begin, f.row_end, *f.a, stage_rows(g, w[INST_STAGE]));
    prefetch_rows(*nx.w, nx.row_begin, min(f.row_end, nx.row_begin + MK_TILE_ROWS * nx.nt));
}

// MK_DN_PREFETCH=1 (a benchmark knob, off; not yet run on a GPU): while consumer thread 0 waits for a DN_RULE
// instruction (on MIX_IN's group), warp 1 asks L2 for its heads' recurrent state (64 KB a 27B head), which the rule
// reads before its first row: from L2 then instead of DRAM. The per-op rule gained from loading its state before
// its wait (bench/NOTES.md Z6). A hint: the rule's own loads and stores go through L2 as before.
#ifndef MK_DN_PREFETCH
#define MK_DN_PREFETCH 0
#endif

__device__ __noinline__ void prefetch_dn_state(const Globals& g, const i32* w) {
    const DnRuleOp::Parsed p(w);
    const LayerRefs& L = layer_refs(g, p.layer);
    const u64 head = (u64)g.ssm_dk * g.ssm_dv * sizeof(float);
    prefetch_bytes(static_cast<const u8*>(L.s[LS_SSM]) + p.head_begin * head, (u64)(p.head_end - p.head_begin) * head);
}

// MK_CONTROLLER=0: the consumers alone. Consumer thread 0 fetches and waits for each instruction in turn (what
// the controller does), the others wait for it at the consumer barrier.
struct SoloConsumer {
    static __device__ void run(const Globals& g, Smem& s) {
        const int n = g.queue_len[blockIdx.x];
        const i32* queue = g.instructions + (i64)blockIdx.x * g.max_len * INST_WORDS;
        for (int i = 0; i < n; ++i) {
            if (ctid() < INST_WORDS) s.inst[0][ctid()] = queue[(i64)i * INST_WORDS + ctid()];
            __syncwarp();
            if (MK_WAIT_PREFETCH && cwarp() == 1) {
                const i32* w = queue + (i64)i * INST_WORDS;
                if (stage_active(g, w[INST_STAGE])) {
                    if (MK_WAIT_PREFETCH == 2)
                        prefetch_during_norms(g, w);
                    else
                        prefetch(g, w);
                }
            }
            if (MK_DN_PREFETCH && cwarp() == 1) {
                const i32* w = queue + (i64)i * INST_WORDS;
                if (w[INST_OPCODE] == OP_DN_RULE && stage_active(g, w[INST_STAGE])) prefetch_dn_state(g, w);
            }
            if (MK_MV_PRIME_NEXT) prime_instruction(g, queue + (i64)i * INST_WORDS, s);
            if (ctid() == 0) {
                mk_inst_index = i;
                mk_first_pending = 1;
                set_trace_slot(g);
                await_instruction(g, s.inst[0], i);
            }
            consumers_sync();
            const i32* w = s.inst[0];
            const int op = w[INST_OPCODE], stage = w[INST_STAGE];
            if (op < 0) return;  // everyone stops here
            trace_start();
            if (stage_active(g, stage)) consume(g, w, s);
            trace_event(TRACE_BODY);
            record_time(g, TIME_BODY);
            count_instruction(g, stage, op, i);  // its barrier: nobody reads s.inst[0] any more
        }
    }
};

// The dynamic shared memory starts after the static variables, on MK_SMEM_ALIGN bytes. At 16 (as before round 9)
// two more static ints put it 16 bytes off a 32-byte sector, and every ring stage with it: the d = 0 cycle took
// 13.30 against 12.70 ms, every matmul's loops 4-12 % slower, the SASS otherwise the same (the cp.async copies of a
// 16-byte chunk then land in the other half of a sector than they come from: the likeliest reason). At 128 a static
// variable more or less moves nothing: 12.67 ms, and MK_CACHE_ROWS=1 12.73 instead of 13.30
// (bench/MEGAKERNEL.md round 9).
#ifndef MK_SMEM_ALIGN
#define MK_SMEM_ALIGN 128
#endif
__global__ void __launch_bounds__(MK_THREADS, 1) megakernel(const __grid_constant__ Globals g) {
    extern __shared__ __align__(MK_SMEM_ALIGN) float dynamic_smem[];
    __shared__ Smem s;
    if (threadIdx.x == 0) {
        s.progress = -1;
        s.scratch = dynamic_smem;
        cache_rows(g);
        if (MK_MV_PRIME_NEXT) mk_primed_w = nullptr;
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5;
    if (!MK_CONTROLLER)
        SoloConsumer::run(g, s);
    else if (warp == MK_WARP_CONTROLLER)
        Controller::run(g, s);
    else if (warp == MK_WARP_LOADER)
        Loader::run(g, s);
    else
        Consumer::run(g, s);
}
