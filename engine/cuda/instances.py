"""Every kernel instance the engine launches, generated from one table: name -> (.cu file, NVRTC name expression).

Instance names follow <op>_<qtype>[_<variant>] (mmvq_q4_K, gemm_q6_K, rope_neox) so logs and profiles read
plainly; the expression is what NVRTC instantiates and mangles ("mmvq<12, 2>").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

# Weight types with a device path, in the order every file lists them.
MATMUL_QTYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16)


@dataclass(frozen=True, slots=True)
class Instance:
    """One launchable kernel: its instance name, the .cu file it lives in and the NVRTC name expression."""

    name: str
    file: str
    expr: str


def qtype_tag(qtype: Q) -> str:
    """The ggml spelling used in instance names: q4_K, q8_0, f16."""
    return qtype.name.lower().replace("_k", "_K")


# Weight types with the pipelined matmul (kernels/stage.cuh: weights staged through shared memory by cp.async).
STAGED_QTYPES = (Q.Q4_K, Q.Q6_K)
# Weight types with the persistent stream-K matmul (kernels/mmvq_persist.cu; the same stages).
PERSIST_QTYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
# The pipelined kernels' column modes, in template-argument order (LO, TWO): fast, precise packed (T <= 4),
# precise two-pass.
PIPELINE_MODES = (("", "false, false"), ("_hl", "true, false"), ("_x2", "true, true"))
# Tokens of the int8-activation Q4_K matmul (kernels/mmvq_i8.cu: 2T packed columns up to 4, a second mma for the
# fifth), an instance each; its ring has ACT_STAGES stages (3 measured no faster: bench/NOTES.md v12).
I8_MAX_TOKENS = 5
# Row tiles a block of it walks in sequence, one ring for all (1: the measured default; 2 and 4, up to 4 tokens,
# not yet timed: the 5-token form would spill with them).
I8_TILE_COUNTS = (1, 2, 4)
# (superblocks a stage, stages a warp) of the bulk-copy int8 Q4_K matmul of one token (kernels/mmvq_i8b.cu,
# sm_90+), an instance each: mmvq_q4_K_i8b_s{S}n{NS}.
I8B_SHAPES = ((1, 4), (2, 2), (2, 3), (3, 2), (5, 2))
# ... and the shapes built to walk half-tiles (ops.OUT_HALVES: the mixers' output projections in halves):
# mmvq_q4_K_i8b_s{S}n{N}_halves
I8B_HALVES_SHAPES = ((3, 2),)
# Tokens of its form for the verify passes (kernels/mmvq_i8v.cu: whole tokens in the mma columns, a second mma past
# 4), an instance each in mmvq_i8b's default shape: mmvq_q4_K_i8v_t{T}.
I8V_TOKENS = tuple(range(2, 9))
I8V_SHAPE = (2, 2)
I8V_MAX_WARPS = 12  # mirror of kernels/mmvq_i8v.cu I8V_MAX_WARPS
# ... and its wide form (blocks of up to I8V_WIDE_WARPS warps, one superblock a stage: engine/cuda/i8b.py
# VERIFY_WIDE_TOKENS), from 3 tokens, where one block fills an SM: mmvq_q4_K_i8v_t{T}_wide.
I8V_WIDE_TOKENS = tuple(range(3, 9))
I8V_WIDE_WARPS = 24
I8V_WIDE_SHAPE = (1, 3)
# ... and in halves (each block a half-tile and half the row staged: ffn_down's 68 superblocks; engine/cuda/ops.py
# VERIFY_HALVES_AT): mmvq_q4_K_i8v_t{T}_halves.
I8V_HALVES_TOKENS = I8V_TOKENS
# Tokens of the int8-activation Q6_K matmul (kernels/mmvq_i8q6.cu: a sub-block's 2T columns in one mma up to 4
# tokens, a pass a level past that), an instance each: mmvq_q6_K_i8_t{T}.
Q6_I8_TOKENS = tuple(range(1, 9))
# (superblocks a stage, stages a warp) of its one-token form on tensor copies (kernels/mmvq_i8q6b.cu, sm_90+),
# whole and walking half-tiles: mmvq_q6_K_i8b_s{S}n{NS}[_halves].
Q6B_SHAPES = ((2, 2), (3, 2))
# ... and its form of 2-8 tokens (the verify passes' Q6_K ffn_downs, engine/cuda/q6b.py VERIFY_AT), walking
# half-tiles in the first shape: mmvq_q6_K_i8v_t{T}_halves.
Q6V_TOKENS = tuple(range(2, 9))
Q6V_SHAPE = Q6B_SHAPES[0]
# Tokens of both in halves (two blocks a tile: ops.DOWN_HALVES), an instance each: mmvq_q{4,6}_K_i8_t{T}_halves.
HALVES_TOKENS = tuple(range(1, I8_MAX_TOKENS + 1))
# Mirror of kernels/stage.cuh: (stages per warp, bytes per stage) of each type it stages.
STAGE_SHAPE: dict[Q, tuple[int, int]] = {Q.Q4_K: (4, 2560), Q.Q5_K: (4, 3072), Q.Q6_K: (3, 3648)}
# Stages per warp of mmvq_cp with staged activations (its stages are larger: up to 8 KB more at 4 precise tokens).
ACT_STAGES = 2
# Weight types with a prefill GEMM instance (everything a Q4_K_M file holds); F16 runs prefill through mmvq, 8 tokens
# at a time.
GEMM_QTYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_0)
# ... of which these also have the GEMM with cp.async-staged operands (their weights have a kernels/stage.cuh Stage).
GEMM_CP_QTYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
# Weight types of the prefill matmul on warpgroup MMA (kernels/gemm_wg.cu and gemm_ws.cu, sm_90a), each drained
# (gemm_wg_<qt>), overlapped (gemm_wg_<qt>_o) and warp-specialised (gemm_wg_<qt>_ws): gemm.py takes the last by
# default from gemm.WS_AUTO_TOKENS tokens a matmul; OPENJET_CUDA_GEMM_WG picks one.
GEMM_WG_QTYPES = (Q.Q4_K, Q.Q6_K)
# Files built with an architecture's own feature set (-arch=sm_<arch>a: wgmma) where the GPU is that architecture;
# for every other target they compile to kernels that trap.
ARCH_FEATURE_FILES = {"gemm_wg": 90, "gemm_ws": 90}
# Weight types the embedding lookup reads (the matmul types plus F32).
EMBED_QTYPES = (Q.F32,) + MATMUL_QTYPES
# How the matmul input is produced (kernels/act.cu ACT_*), in template-argument order.
ACT_MODES = ("plain", "rmsnorm", "swiglu", "gatednorm")
# Blocks per SM the producers' registers must allow (prefill grids have thousands of blocks); the one-group
# instances (act_<mode>_g1: decode and verify passes, 20-68 blocks; ops.ACT_ONE_GROUP_MODES) allow 1, so RMSNorm's
# row loads all fly at once; so do the one-token instances (act_<mode>_t1: a decode or verify pass's tokens on
# blocks of their own, ops.ACT_SPLIT_TOKENS, the default for 1-8 tokens since v19).
ACT_MIN_BLOCKS = 4
# Attention head sizes with an instance, and the queries each warp keeps in registers for them.
ATTN_HEAD_DIMS = {32: 16, 64: 16, 128: 16, 256: 12}
# The narrower instances (queries per warp) of decode and verify, attn_d{D}_q{n} (engine/cuda/mixers.py attn_qpw).
ATTN_DECODE_QPW = (1, 2, 4)
# Keys of earlier passes those instances' _pre forms copy into shared memory before their PDL wait
# (kernels/attention.cu PRE; engine/cuda/mixers.py ATTN_PRE): a split's first 32, one pass of its key loop
ATTN_PRE_KEYS = 32
# Head sizes with the tensor-core prefill attention (kernels/attention_prefill.cu attn_mma).
ATTN_MMA_DIMS = (64, 128, 256)
# DeltaNet key-head sizes with an instance (multiples of 32: rows per lane = size / 32).
GDN_KEY_DIMS = (32, 64, 128, 256)
GDN_CONV_TAPS = 4  # the conv kernel size the delta rule's conv instances take (qwen35's)
# DeltaNet head sizes (key = value) with the chunked prefill rule (kernels/deltanet_chunked.cu).
GDN_CHUNK_DIMS = (32, 64, 128)


def _build() -> dict[str, Instance]:
    """The whole table."""
    out: list[Instance] = []
    for qt in MATMUL_QTYPES:
        out.append(Instance(f"mmvq_{qtype_tag(qt)}", "mmvq", f"mmvq<{int(qt)}, false>"))
        out.append(Instance(f"mmvq_{qtype_tag(qt)}_x2", "mmvq", f"mmvq<{int(qt)}, true>"))  # precise: hi + lo
    for qt in STAGED_QTYPES:  # the cp.async pipeline: fast, precise packed (T <= 4), precise two-pass
        for suffix, flags in PIPELINE_MODES:
            out.append(Instance(f"mmvq_{qtype_tag(qt)}_cp{suffix}", "mmvq", f"mmvq_cp<{int(qt)}, {flags}>"))
        # activations staged too: fast and precise packed, one or two row tiles a block
        for (suffix, lo), tiles in itertools.product((("", "false"), ("_hl", "true")), (1, 2)):
            out.append(Instance(f"mmvq_{qtype_tag(qt)}_cpa{'2' if tiles == 2 else ''}{suffix}", "mmvq",
                                f"mmvq_cpa<{int(qt)}, {lo}, {tiles}, {ACT_STAGES}>"))
    out += [Instance(f"mmvq_q4_K_i8_t{t}" + (f"_r{tiles}" if tiles > 1 else ""), "mmvq_i8",
                     f"mmvq_i8<{t}, {ACT_STAGES}, {tiles}>")  # int8 activations, 1..TILES row tiles a block
            for t in range(1, I8_MAX_TOKENS + 1) for tiles in I8_TILE_COUNTS if tiles == 1 or t <= 4]
    out += [Instance(f"mmvq_q4_K_i8b_s{s}n{n}", "mmvq_i8b", f"mmvq_i8b<{s}, {n}>") for s, n in I8B_SHAPES]
    out += [Instance(f"mmvq_q4_K_i8v_t{t}", "mmvq_i8v", f"mmvq_i8v<{t}, {I8V_SHAPE[0]}, {I8V_SHAPE[1]}>")
            for t in I8V_TOKENS]
    out += [Instance(f"mmvq_q4_K_i8v_t{t}_wide", "mmvq_i8v",
                     f"mmvq_i8v<{t}, {I8V_WIDE_SHAPE[0]}, {I8V_WIDE_SHAPE[1]}, {I8V_WIDE_WARPS}>")
            for t in I8V_WIDE_TOKENS]
    out += [Instance(f"mmvq_q4_K_i8v_t{t}_halves", "mmvq_i8v",
                     f"mmvq_i8v<{t}, {I8V_SHAPE[0]}, {I8V_SHAPE[1]}, {I8V_MAX_WARPS}, true>")
            for t in I8V_HALVES_TOKENS]
    out += [Instance(f"mmvq_q6_K_i8_t{t}", "mmvq_i8q6", f"mmvq_q6_i8<{t}, {ACT_STAGES}>") for t in Q6_I8_TOKENS]
    # ... and both in two blocks a tile, each half of its superblocks (ops.DOWN_HALVES: ffn_down)
    out += [Instance(f"mmvq_q4_K_i8_t{t}_halves", "mmvq_i8", f"mmvq_i8<{t}, {ACT_STAGES}, 1, true>")
            for t in HALVES_TOKENS]
    out += [Instance(f"mmvq_q4_K_i8b_s{s}n{n}_halves", "mmvq_i8b", f"mmvq_i8b<{s}, {n}, true>")
            for s, n in I8B_HALVES_SHAPES]
    out += [Instance(f"mmvq_q6_K_i8_t{t}_halves", "mmvq_i8q6", f"mmvq_q6_i8<{t}, {ACT_STAGES}, true>")
            for t in HALVES_TOKENS]
    out += [Instance(f"mmvq_q6_K_i8b_s{s}n{n}" + ("_halves" if halves else ""), "mmvq_i8q6b",
                     f"mmvq_q6_i8b<{s}, {n}, {'true' if halves else 'false'}>")
            for s, n in Q6B_SHAPES for halves in (False, True)]
    out += [Instance(f"mmvq_q6_K_i8v_t{t}_halves", "mmvq_i8q6b",
                     f"mmvq_q6_i8v<{t}, {Q6V_SHAPE[0]}, {Q6V_SHAPE[1]}, true>") for t in Q6V_TOKENS]
    for qt in PERSIST_QTYPES:  # the persistent stream-K grid, the same three modes
        for suffix, flags in PIPELINE_MODES:
            out.append(Instance(f"mmvq_{qtype_tag(qt)}_persist{suffix}", "mmvq_persist",
                                f"mmvq_persist<{int(qt)}, {flags}>"))
    out += [Instance(f"gemm_{qtype_tag(qt)}", "gemm", f"gemm<{int(qt)}>") for qt in GEMM_QTYPES]
    out += [Instance(f"gemm_{qtype_tag(qt)}_cp", "gemm", f"gemm_cp<{int(qt)}>") for qt in GEMM_CP_QTYPES]
    out += [Instance(f"gemm_wg_{qtype_tag(qt)}{suffix}", "gemm_wg", f"gemm_wg<{int(qt)}, {overlap}>")
            for qt in GEMM_WG_QTYPES for suffix, overlap in (("", "false"), ("_o", "true"))]
    out += [Instance(f"gemm_wg_{qtype_tag(qt)}_ws{suffix}", "gemm_ws", f"gemm_ws<{int(qt)}, {epi}>")
            for qt in GEMM_WG_QTYPES for suffix, epi in (("", 0), ("_swiglu", 1))]  # gemm_ws.cu WS_EPI_*
    out += [Instance("mmv_f32", "mmvq", "mmv_f32")]
    out += [Instance(f"act_{mode}", "act", f"act_from<{i}, {ACT_MIN_BLOCKS}, 8>") for i, mode in enumerate(ACT_MODES)]
    out += [Instance(f"act_{mode}_g1", "act", f"act_from<{i}, 1, 8>") for i, mode in enumerate(ACT_MODES)]  # one group
    out += [Instance(f"act_{mode}_t1", "act", f"act_from<{i}, 1, 1>") for i, mode in enumerate(ACT_MODES)]  # a token
    out += [Instance("act_combine_t1", "act", f"act_from<{len(ACT_MODES)}, 1, 1>")]  # ACT_COMBINE: a token a block
    out += [Instance("act_row_inv", "act", "act_row_inv")]  # RMSNorm's 1 / rms a token, ahead of act_rmsnorm
    out += [Instance(n, "norm", n) for n in ("rms_norm", "head_norm", "gated_rms_norm")]
    out += [Instance("rope_neox", "rope", "rope<true>"), Instance("rope_norm", "rope", "rope<false>")]
    out += [Instance(n, "elementwise", n) for n in ("swiglu", "sigmoid_mul")]
    out += [Instance(f"get_rows_{qtype_tag(qt)}", "elementwise", f"get_rows<{int(qt)}>") for qt in EMBED_QTYPES]
    out += [Instance(n, "attention", n) for n in ("kv_store", "qk_prep")]
    out += [Instance("attn_combine", "attention", "attn_combine")]
    out += [Instance(f"attn_d{d}", "attention", f"attn<{d}, {qpw}, 0>") for d, qpw in ATTN_HEAD_DIMS.items()]
    out += [Instance(f"attn_d{d}_q{n}{suffix}", "attention", f"attn<{d}, {n}, {pre}>") for d in ATTN_HEAD_DIMS
            for n in ATTN_DECODE_QPW for suffix, pre in (("", 0), ("_pre", ATTN_PRE_KEYS))]
    out += [Instance(f"attn_d{d}_q{n}{suffix}_prep", "attention", f"attn_prep<{d}, {n}, {pre}>") for d in ATTN_HEAD_DIMS
            for n in ATTN_DECODE_QPW for suffix, pre in (("", 0), ("_pre", ATTN_PRE_KEYS))]  # qk_prep's work inside
    out += [Instance(f"attn_mma_d{d}", "attention_prefill", f"attn_mma<{d}>") for d in ATTN_MMA_DIMS]
    out += [Instance(n, "deltanet", n) for n in ("conv1d_silu", "conv_commit", "gdn_gates")]
    out += [Instance(f"gdn_k{d}", "deltanet", f"gdn_recurrent<{d // 32}, 8, 0>") for d in GDN_KEY_DIMS]
    out += [Instance(f"gdn_k{d}_c4", "deltanet", f"gdn_recurrent<{d // 32}, 4, 0>") for d in GDN_KEY_DIMS]
    out += [Instance(f"gdn_k{d}_c4_conv", "deltanet", f"gdn_recurrent<{d // 32}, 4, {GDN_CONV_TAPS}>")
            for d in GDN_KEY_DIMS]  # the causal conv inside the rule
    out += [Instance(f"gdn_k{d}{'' if cols == 8 else f'_c{cols}'}_layers", "deltanet",
                     f"gdn_recurrent<{d // 32}, {cols}, 0, 1>")
            for d in GDN_KEY_DIMS for cols in (8, 4)]  # the accept of every DeltaNet layer in one launch
    out += [Instance(f"gdn_chunk_{step}_k{d}", "deltanet_chunked", f"gdn_chunk_{step}<{d}>")
            for step in ("prep", "scan") for d in GDN_CHUNK_DIMS]
    out += [Instance(n, "sample", n) for n in ("argmax_partial", "argmax_final", "choose_rows", "choose_top",
                                               "choose_weigh")]
    out += [Instance(n, "penalties", n) for n in ("penalty_count", "penalize_rows")]
    return {inst.name: inst for inst in out}


INSTANCES: dict[str, Instance] = _build()


def arch_options(file: str, arch: int) -> tuple[str, ...]:
    """NVRTC options a file needs on sm_<arch> beyond the plain target: its feature set where it has one there."""
    return (f"-arch=sm_{arch}a",) if ARCH_FEATURE_FILES.get(file) == arch else ()


def files() -> dict[str, tuple[Instance, ...]]:
    """Instances grouped by .cu file (one NVRTC program per file)."""
    grouped: dict[str, list[Instance]] = {}
    for inst in INSTANCES.values():
        grouped.setdefault(inst.file, []).append(inst)
    return {name: tuple(items) for name, items in grouped.items()}
