// What every instruction can reach: the kernel's one argument (Globals), with the per-layer tables, and what a
// stage implies (rows, positions, residual stream, whether it runs). Mirrored field by field by the ctypes
// structures of engine/cuda/megakernel/structs.py (tests/kernels/test_megakernel_compile.py compares them).
#pragma once
#include "common.cuh"
#include "opcodes.cuh"

// Rows [row_offset, row_offset + rows) of a weight in the device layout (engine/cuda/repack.py: planes of
// rows_total rows), `cols` wide.
struct WeightRef {
    const u8* ptr;
    i32 qtype;
    i32 rows_total;
    i32 cols;
    i32 row_offset;
    i32 rows;
    i32 pad;
};

// A matmul input in the act layout of kernels/mmvq.cu (one group of 8 rows), hi and lo halves and their sums.
struct ActRef {
    f16* x16;
    f16* sums;
    f16* x16_lo;
    f16* sums_lo;
    // The int8 copy (kernels/mmvq_i8.cu's act8 layout, one group of 8 rows), null where the act has none: act_h's
    // (its one writer, norm_into_act, keeps it), act_ffn's and act_mix's (runner.py INT8_ACTS) at one row
    // (mk_common.cuh act8_fill): q8 [nsb][2 levels][8][256], scale8 [nsb][2][8], sums8 / sums8_lo [nsb][8][8]
    // (the f16 pair of each sub-block's sum of what the int8 mma sees).
    i8* q8;
    float* scale8;
    f16* sums8;
    f16* sums8_lo;
    // act8_fill's count of positions written a superblock [nsb], where the act's writers form its int8 copy
    // (act_ffn, act_mix: their instructions write parts of superblocks); null elsewhere
    u32* fill;
    i32 width;
    i32 nsb;      // superblocks per row
    i32 in_smem;  // row 0's int8 levels are already in the batch's shared area (norm_own.cuh; never from the host)
};

struct LayerRefs {
    WeightRef w[LW_COUNT];
    const float* v[LV_COUNT];
    void* s[LS_COUNT];
};

struct Globals {
    // the program
    const i32* instructions;  // [num_sms][max_len][INST_WORDS]
    const i32* queue_len;     // [num_sms]
    i32* ctl;
    u32* counters;            // [num_stages][NUM_OPCODES]
    u64* timings;             // [num_sms][max_len][TIME_SLOTS] or null
    const LayerRefs* layers;  // [num_layers (+ 1: the MTP block)]
    // top-level weights
    WeightRef token_embd;
    WeightRef output;
    WeightRef mtp_output;     // rows 0 .. draft_vocab - 1 of the MTP head
    WeightRef mtp_embd;
    const float* output_norm;
    const double* rope_inv_freq;  // [rope_dim / 2]: theta^(-2i / rope_dim), as the reference forms it (float64)
    // buffers (layout.py: buffer_specs)
    float* x;
    float* mtp_x;
    float* proj;
    float* conv_out;
    float* attn_part;
    float* hidden;
    float* mtp_hidden;
    float* last_hidden;
    float* logits;
    float* lm_part_v;
    i32* lm_part_i;
    float* draft_logits;
    float* draft_part_v;
    i32* draft_part_i;
    i32* counts;
    u8* seen;
    float* mv_part;   // [pieces][MK_MAX_ROWS][16]: split tiles' partial products (schedule.py split_tiles)
    u32* mv_count;    // [pieces]: pieces of split tile `slot` done; the last resets it
    ActRef act_h;
    ActRef act_mix;
    ActRef act_ffn;
    ActRef act_eh;
    // Each SM's own act of act_h's width ([num_sms] of them, row 0 used): at one row MIX_IN and FFN_UP norm x into
    // it themselves (norm_own.cuh norm_into_own), and the norm groups do nothing
    ActRef act_own;
    // sizes
    i32 max_len;
    i32 num_layers;
    i32 hidden_size;
    i32 ffn_size;
    i32 vocab;
    i32 draft_vocab;
    i32 num_heads;
    i32 num_kv_heads;
    i32 head_dim;
    i32 rope_dim;
    i32 q_size;
    i32 kv_size;
    i32 ssm_k_heads;
    i32 ssm_v_heads;
    i32 ssm_dk;
    i32 ssm_dv;
    i32 conv_kernel;
    i32 conv_dim;
    i32 inner;
    i32 capacity;
    i32 proj_width;
    i32 attn_splits;
    i32 num_lm_parts;
    i32 num_draft_parts;
    i32 has_mtp;
    i32 off_q;      // proj column offsets (layout.proj_offsets)
    i32 off_k;
    i32 off_v;
    i32 off_gate;
    i32 off_alpha;
    i32 off_beta;
    float eps;
    float rope_theta;
};

// ---- what a stage implies (engine/cuda/megakernel/vm.py: mtp_step, rows, pos0, x_name, is_active, drafts) ----

__device__ __forceinline__ int mtp_step(const Globals& g, int stage) {
    const int first = g.num_layers + STAGE_MTP_OFFSET;
    return stage >= first && stage < first + MK_MAX_DRAFT ? stage - first : -1;
}

// Control words are read through L2: the host and this launch's VERIFY write them.
__device__ __forceinline__ int ctl_get(const Globals& g, int word) {
    int v;
    asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(g.ctl + word));
    return v;
}

__device__ __forceinline__ float ctl_getf(const Globals& g, int word) { return __int_as_float(ctl_get(g, word)); }

// The trunk's rows and first position: the host's words, which no instruction writes, so a launch may read them
// once into shared memory at its start (MK_CACHE_ROWS=1, a knob) rather than from L2 after each wait. Off: it
// gains nothing measurable (12.73 against 12.67 ms with the dynamic shared memory on 128 bytes; its 13.30 against
// 12.70 at 16 bytes was the alignment's, megakernel.cu MK_SMEM_ALIGN; bench/MEGAKERNEL.md round 9).
#ifndef MK_CACHE_ROWS
#define MK_CACHE_ROWS 0
#endif
__shared__ int mk_num_rows, mk_start;

__device__ __forceinline__ void cache_rows(const Globals& g) {  // one thread, before the launch's first barrier
    mk_num_rows = ctl_get(g, CTL_NUM_ROWS);
    mk_start = ctl_get(g, CTL_START);
}

__device__ __forceinline__ int stage_rows(const Globals& g, int stage) {
    const int step = mtp_step(g, stage);
    if (step < 0) return MK_CACHE_ROWS ? mk_num_rows : ctl_get(g, CTL_NUM_ROWS);
    return step == 0 ? ctl_get(g, CTL_MTP_ROWS) : 1;
}

__device__ __forceinline__ int stage_pos0(const Globals& g, int stage) {
    const int step = mtp_step(g, stage);
    if (step < 0) return MK_CACHE_ROWS ? mk_start : ctl_get(g, CTL_START);
    return ctl_get(g, CTL_MTP_POS) + (step == 0 ? 0 : ctl_get(g, CTL_MTP_ROWS) - 1 + step);
}

__device__ __forceinline__ bool stage_is_mtp(const Globals& g, int stage) { return stage > g.num_layers; }

__device__ __forceinline__ float* stage_x(const Globals& g, int stage) { return stage_is_mtp(g, stage) ? g.mtp_x : g.x; }

__device__ __forceinline__ bool stage_active(const Globals& g, int stage) {
    const int step = mtp_step(g, stage);
    return step < 1 || step < ctl_get(g, CTL_DRAFT_NEXT);
}

__device__ __forceinline__ bool stage_drafts(const Globals& g, int stage) {
    const int step = mtp_step(g, stage);
    return step >= 0 && step < ctl_get(g, CTL_DRAFT_NEXT);
}

__device__ __forceinline__ const LayerRefs& layer_refs(const Globals& g, int layer) { return g.layers[layer]; }
