// The megakernel's numbers, in one place: opcodes, instruction words, control words, stages, warp roles, named
// barriers, timing slots and error codes. engine/cuda/megakernel/instructions.py and layout.py mirror every
// #define here (tests/kernels/test_megakernel_compile.py checks that they agree).
#pragma once

// ---- opcodes (0 = no-op); each has one file <name>.cuh with its roles ----
#define OP_NOOP 0
#define OP_EMBED 1         // x[t] = token_embd[ids[t]]
#define OP_ATTN_NORM 2     // act_h = RMSNorm(x) * attn_norm
#define OP_MIX_IN 3        // one matrix of the mixer's input projection (attention q/k/v; DeltaNet qkv+conv/gate/alpha/beta)
#define OP_DN_RULE 4       // gated delta rule per value head (commits the last pass's accepted prefix first)
#define OP_ATTN_CORE 5     // q/k norm, rope, KV store, one key split of attention -> partials
#define OP_ATTN_COMBINE 6  // merge the key splits, sigmoid gate -> act_mix
#define OP_MIX_OUT 7       // x += attn_output / ssm_out (act_mix)
#define OP_FFN_NORM 8      // act_h = RMSNorm(x) * post_attention_norm
#define OP_FFN_UP 9        // act_ffn = silu(ffn_gate act_h) * ffn_up act_h
#define OP_FFN_DOWN 10     // x += ffn_down act_ffn
#define OP_HEAD_NORM 11    // act_h = hidden = RMSNorm(x) * output_norm (shared_head_norm in the MTP block)
#define OP_LM_HEAD 12      // logits = output act_h, per-instruction (max, argmax) of the penalised logits
#define OP_VERIFY 13       // greedy or exact speculative acceptance of the drafts -> emitted tokens, commit count
#define OP_MTP_IN 14       // act_eh = [RMSNorm(embed(token)) * enorm | RMSNorm(hidden) * hnorm]
#define OP_MTP_EH 15       // mtp_x = eh_proj act_eh
#define OP_DRAFT_HEAD 16   // draft logits of the MTP pass's last row over the draft vocabulary
#define OP_DRAFT_PICK 17   // draft token = argmax of the draft logits
#define OP_FINISH 18       // last hidden, penalty counts, next cycle's ids
#define OP_DN_COMMIT 19    // commit the last pass's accepted prefix into the DeltaNet state (materialise)
#define NUM_OPCODES 20

// ---- instruction words: a header, then the op's fields in the order of its Python dataclass ----
#define INST_WORDS 16
#define INST_OPCODE 0
#define INST_STAGE 1       // counter row this instruction increments: (stage, opcode)
#define INST_WAIT_STAGE 2  // the counter it waits on ...
#define INST_WAIT_OP 3
#define INST_WAIT_COUNT 4  // ... until it reaches this value (0: no wait)
#define INST_WAIT1_STAGE 5  // at one row, where the matmuls norm x themselves (norm_own.cuh), this counter ...
#define INST_WAIT1_OP 6
#define INST_WAIT1_COUNT 7  // ... instead (0: the wait above): the no-op norm group's own wait
#define INST_ARGS 8

// ---- stages (rows of the counter table); the MTP stages follow the trunk's layers ----
// stage s < num_layers: trunk layer s; num_layers: the head (norm, lm_head, verify); num_layers + 1: the MTP pass
// over the committed rows plus the first draft row; num_layers + 1 + s (s = 1 .. MK_MAX_DRAFT - 1): draft step s;
// num_layers + 1 + MK_MAX_DRAFT: finish.
#define STAGE_HEAD_OFFSET 0
#define STAGE_MTP_OFFSET 1
#define STAGE_FINISH_OFFSET (1 + MK_MAX_DRAFT)
#define NUM_EXTRA_STAGES (2 + MK_MAX_DRAFT)

// ---- control words (ctl, int32; floats stored as their bits) ----
// written by the host before a launch
#define CTL_MODE 0            // MODE_*
#define CTL_NUM_ROWS 1        // rows of the trunk pass (1 + drafts)
#define CTL_START 2           // position of row 0
#define CTL_DRAFT_NEXT 3      // drafts to make for the next cycle (0 .. MK_MAX_DRAFT)
#define CTL_GREEDY 4          // 1: greedy; 0: sampling with the parameters below
#define CTL_TEMPERATURE 5
#define CTL_TOP_K 6
#define CTL_TOP_P 7
#define CTL_MIN_P 8
#define CTL_REP_PENALTY 9
#define CTL_FREQ_PENALTY 10
#define CTL_PRES_PENALTY 11
#define CTL_SEED_LO 12
#define CTL_SEED_HI 13
#define CTL_PENALTIES 14      // 1 when any penalty is active (counts / seen are read)
// device state that persists between launches (the host sets it only when it resets or restores)
#define CTL_COMMIT_N 16       // rows of the last pass committed (DeltaNet commit pending); 0: none pending
#define CTL_DRAFTS_READY 17   // drafts in CTL_IDS[1..] for the pending token CTL_IDS[0]
#define CTL_MTP_ROWS 18       // rows of the MTP pass (committed rows + the first draft row)
#define CTL_MTP_POS 19        // position of the MTP pass's row 0
// outputs of a cycle
#define CTL_NUM_EMITTED 20
#define CTL_ERROR 21          // ERR_* (0: none)
#define CTL_ERROR_INFO 22     // 6 words: sm, instruction index, wait stage, wait op, counter value, expected
#define CTL_SAMPLE_CLIPPED 28 // rows whose candidate set reached MK_CAND_MAX (the sampler's documented limit)
#define CTL_IDS 32            // MK_MAX_ROWS: the trunk pass's tokens (pending token, then drafts)
#define CTL_MTP_IDS 40        // MK_MAX_ROWS: tokens of the MTP pass rows
#define CTL_EMITTED 48        // MK_MAX_ROWS: tokens this cycle emitted
#define CTL_DRAFTS 56         // MK_MAX_DRAFT: drafts made for the next cycle
#define CTL_WORDS 64

// modes
#define MODE_CYCLE 1    // verify, accept on the device, MTP catch-up + drafts, finish
#define MODE_PREFILL 2  // feed and commit every row, MTP catch-up, no drafts
#define MODE_HOST 3     // verify only: the host accepts (then MODE_CATCHUP)
#define MODE_CATCHUP 4  // MTP catch-up of CTL_MTP_ROWS committed rows after a host accept
#define MODE_DRAFT 5    // draft only: the MTP pass is the pending token alone

// ---- limits ----
#define MK_MAX_ROWS 8
#define MK_MAX_DRAFT 4
#define MK_CAND_MAX 4096          // candidates per row of the sampler (tokens within MK_SAMPLE_CUTOFF of the max)
#define MK_SAMPLE_CUTOFF 30.0f    // logits (after temperature) this far below the max are left out: e^-30 each
// A key split takes at least 2^MK_ATTN_MIN_KEYS_LOG2 keys (32). At a short context that leaves one split a KV
// head with all the keys: ATTN_CORE's slowest instruction ~2 x its median at 33 keys (24 against 11 us, round 9).
// A benchmark knob (solvers.split_range mirrors OPENJET_MK_DEFINES's value for the diff harness).
#ifndef MK_ATTN_MIN_KEYS_LOG2
#define MK_ATTN_MIN_KEYS_LOG2 5
#endif
#define MK_TILE_ROWS 16           // weight rows of one mma block
#define MK_PIECE_WIDTH 64         // outputs of a piece of a split unit (layout.PIECE_WIDTH): FFN_UP's 32 gate + 32 up

// ---- per-layer weight, vector and state slots (layout.py: LW, LV, LS) ----
#define LW_ATTN_Q 0
#define LW_ATTN_K 1
#define LW_ATTN_V 2
#define LW_ATTN_OUTPUT 3
#define LW_ATTN_QKV 4
#define LW_ATTN_GATE 5
#define LW_SSM_ALPHA 6
#define LW_SSM_BETA 7
#define LW_SSM_OUT 8
#define LW_FFN_GATE 9
#define LW_FFN_UP 10
#define LW_FFN_DOWN 11
#define LW_EH_PROJ 12
#define LW_COUNT 13
#define LV_ATTN_NORM 0
#define LV_POST_NORM 1
#define LV_Q_NORM 2
#define LV_K_NORM 3
#define LV_SSM_CONV1D 4
#define LV_SSM_A 5
#define LV_SSM_DT 6
#define LV_SSM_NORM 7
#define LV_ENORM 8
#define LV_HNORM 9
#define LV_HEAD_NORM 10
#define LV_COUNT 11
#define LS_K 0       // f16 [Hkv, capacity, D]
#define LS_V 1
#define LS_WINDOW 2  // f32 [K - 1 + MK_MAX_ROWS, C]: committed conv rows, then the last pass's inputs
#define LS_SSM 3     // f32 [Hv, Dk, Dv]: the state before the last pass
#define LS_RK 4      // f32 [MK_MAX_ROWS, Hv, Dk]: the last pass's normalised keys (per value head)
#define LS_RV 5      // f32 [MK_MAX_ROWS, Hv, Dv]
#define LS_RG 6      // f32 [MK_MAX_ROWS, Hv]
#define LS_RB 7      // f32 [MK_MAX_ROWS, Hv]
#define LS_COUNT 8

// ---- warp roles and named barriers ----
// MK_CONTROLLER=0 (the default): no controller or loader warp, the consumers fetch and wait themselves (SoloConsumer).
// A block of 10 warps puts 3 on one of the SM's four register-file partitions, which caps a thread at 168
// registers; 8 warps allow 255. Measured on the H200 (bench/MEGAKERNEL.md round 4): d = 0 cycle 17.52 ms without
// the controller against 18.13 with it (whole tiles); the loader had nothing left to do since its prefetch went.
#ifndef MK_CONTROLLER
#define MK_CONTROLLER 0
#endif
#define MK_WARP_CONTROLLER 0  // fetches instructions, waits on counters, records timings
#define MK_WARP_LOADER 1      // prefetches the weights of the instructions ahead into L2
#define MK_ROLE_WARPS 2       // the controller and the loader
#define MK_FIRST_CONSUMER (MK_CONTROLLER ? MK_ROLE_WARPS : 0)  // it and the MK_CONSUMER_WARPS - 1 after it compute
#ifndef MK_CONSUMER_WARPS
#define MK_CONSUMER_WARPS 8   // 16: an experiment (build.threads reads it from the options; needs 132 KB of smem)
#endif
#define MK_THREADS ((MK_FIRST_CONSUMER + MK_CONSUMER_WARPS) * 32)
#define MK_CONSUMER_THREADS (MK_CONSUMER_WARPS * 32)
// Instructions whose weights the loader requests into L2 ahead of the controller; negative: none. Off since round
// 3 (bench/MEGAKERNEL.md): the requests competed with the rings' own reads, 21.3 -> 19.3 ms a d = 0 cycle without.
#ifndef MK_PREFETCH_AHEAD
#define MK_PREFETCH_AHEAD -1
#endif
#define BAR_CONSUMERS 1       // the consumer warps among themselves
#define BAR_READY0 2          // slot 0 / 1 of the instruction ring filled (controller -> consumers)
#define BAR_READY1 3
#define BAR_FREE0 4           // slot 0 / 1 of the instruction ring done (consumers -> controller)
#define BAR_FREE1 5

// ---- timing slots (per instruction, globaltimer ns) ----
#define TIME_FETCHED 0
#define TIME_READY 1    // dependencies met
#define TIME_DONE 2     // outputs stored and signalled
// The instruction's last matmul batch (mv_batch): begun, its warps' unit loops done, its sums folded; then the
// op's body done (before the count). bench/mk_profile.py splits an instruction's time with them.
#define TIME_BATCH 3
#define TIME_LOOPS 4
#define TIME_FOLDED 5
#define TIME_BODY 6
#define TIME_FIRST 7  // the instruction's first matmul batch: its warps' unit loops done
#define TIME_SLOTS 8

// ---- the warp trace (MK_TRACE, a benchmark knob: mk_common.cuh trace_event) ----
// With MK_TRACE=1 the timings buffer holds, after its [num_sms][max_len][TIME_SLOTS] slots, [num_sms][max_len]
// [TRACE_WARPS][TRACE_EVENTS] per consumer warp (runner.py allocates both; bench/mk_profile.py warp_trace reads
// them): globaltimer ns but for the unit counts.
#define TRACE_WARPS 8
#define TRACE_EVENTS 16
#define TRACE_START 0   // the warp past the instruction's first barrier (its dependencies met)
// a matmul batch's events: set 0 from TRACE_FIRST (the instruction's first batch), set 1 from TRACE_LAST (its last
// batch, if it has more than one): entered mv_batch_cp, its ring primed (and a one-row levels area copied), its
// first unit's stage landed, that unit multiplied, the warp's last unit multiplied, and the warp's unit count
#define TRACE_FIRST 1
#define TRACE_LAST 7
#define TRACE_ENTER 0
#define TRACE_PRIMED 1
#define TRACE_UNIT0_READY 2
#define TRACE_UNIT0_DONE 3
#define TRACE_LOOP_DONE 4
#define TRACE_UNITS 5
#define TRACE_FOLDED 13  // the warp's share of the last batch's fold done (before the barrier after it)
#define TRACE_BODY 14    // the warp done with the instruction's body (before the count's barrier)

// ---- errors ----
#define ERR_NONE 0
#define ERR_WAIT_TIMEOUT 1   // a counter did not reach its value in MK_WAIT_TIMEOUT_NS
#define ERR_BAD_OPCODE 2
#define ERR_BAD_QTYPE 3
#define ERR_BAD_SHAPE 4
#define MK_WAIT_TIMEOUT_NS 2000000000ull
