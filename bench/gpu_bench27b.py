"""The full-size Qwen3.8-27B-shaped Q4_K_M file, generated on the GPU machine: load it, decode greedily, check its
verify passes of 2, 5 and 8 tokens against the one-token passes of the same tokens, and time the forward pass for
T = 1, 2, 3, 5 (graph replay), the DeltaNet commit after a verify, and prefill at 512 / 2048 / 8192 tokens, against
the copy bandwidth measured in the same process."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import Report, Timing, copy_bandwidth, median_time, record, rel_err
from bench.gpu_compare import PREFILL_TOKENS
from engine.cuda import env_flag, env_switch
from engine.cuda.device import PDL_MIN_ARCH, CudaError
from engine.cuda.i8b import DEFAULT_VERIFY_WARPS_AT
from engine.cuda.instances import (I8B_SHAPES, I8V_HALVES_TOKENS, I8V_WIDE_TOKENS, PERSIST_QTYPES, Q6_I8_TOKENS,
                                   STAGED_QTYPES)

PASS_TOKENS = (1, 2, 3, 4, 5)
CONTEXT = 16384
# Kernel generations compared in one run: (types that may run the cp.async-pipelined mmvq, whether at every T
# and mode rather than where it measured faster, fewest keys per attention split). v7 is the default; v7cp the
# pipelined kernel everywhere (what the first v7 run measured as "v7"); v6 the state of commit ddd02e1.
# v8 the persistent stream-K mmvq everywhere (bench/NOTES.md v8), last so that a fault of the new kernel loses
# nothing but the prefill timings, and left out when its checks failed. The last field: the pipelined kernel.
# The field after the kernel: which passes launch with programmatic dependent launch (engine/cuda/device.py
# PDL_POLICIES: each kernel's launch overlaps the previous kernel's tail): "auto" (v7, the default) the passes of
# 1-4 tokens and the verify passes of 5+ (3 since Z5); v7pdl every pass; v7off none; the others none, as measured.
# v7's kernel table with the int8 matmuls, each with one setting of its own (the tables below say which)
V7_SETTINGS = ("group", "split2", "i8v3", "pdl3", "i8v3pdl", "nopdl1", "q6persist", "q6p5", "q6c5",
               "serialauto", "i8v5w4", "i8v5w5", "noq6i8", "q6i8t1", "q6i8t4", "q6i8all", "gdn4",
               "gdn8", "i8v5w10", "i8v5w12", "i8vw12", "notrim", "i8vw8old", "i8v3off", "convapart",
               "conv1", "fast24", "fastall", "copyall", "acceptapart",
               "accept4", "attnpre", "attnplain", "dw5", "dw6", "dw7", "dw8", "dw8q6", "dw8q7",
               "dw6all", "s3n2full", "s3n2spare2", "s5n2full", "s5n2spare2", "i8bfull", "halves", "halvesi8b", "halves5",
               "wide", "wide5", "widehalves", "outhalves", "fill", "fillhalves", "allhalves", "q6b", "q6bhalves",
               "q6bdown", "q6bw8", "q6bh8", "noq6b", "q6bwhole",
               "i8bdown8", "i8bdownh8", "i8bdown4", "i8vdown", "i8vdown5", "down5", "q6v", "q6v5", "q6bon", "q6bs3", "i8bdown8s5", "i8bdown8s2n3", "combact", "combapart", "qkfused")
VARIANTS = {"v7": (STAGED_QTYPES, False, 32, "cp", "auto"), "v7cp": (STAGED_QTYPES, True, 32, "cp", "off"),
            "v6": ((), False, 128, "cp", "off"), "v7pdl": (STAGED_QTYPES, False, 32, "cp", "on"),
            "v7off": (STAGED_QTYPES, False, 32, "cp", "off"), "g1rms": (STAGED_QTYPES, False, 32, "cp", "auto"),
            "w4t1": (STAGED_QTYPES, False, 32, "cp", "auto"), "i8b": (STAGED_QTYPES, False, 32, "cp", "auto"),
            "i8bs": (STAGED_QTYPES, False, 32, "cp", "auto"), "i8": (STAGED_QTYPES, False, 32, "cp", "auto"),
            "v8": (PERSIST_QTYPES, True, 32, "persist", "off"), "v10": (STAGED_QTYPES, True, 32, "cpa", "off"),
            "v11": (STAGED_QTYPES, True, 32, "cpa2", "off"), "f16": (STAGED_QTYPES, False, 32, "cp", "off"),
            "r2": (STAGED_QTYPES, False, 32, "cp", "off"), "r4": (STAGED_QTYPES, False, 32, "cp", "off"),
            "serial": (STAGED_QTYPES, False, 32, "cp", "off"), "k64": (STAGED_QTYPES, False, 64, "cp", "off"),
            "apart": (STAGED_QTYPES, False, 32, "cp", "auto"), "spare": (STAGED_QTYPES, False, 32, "cp", "auto"),
            "full": (STAGED_QTYPES, False, 32, "cp", "auto"), "serial8": (STAGED_QTYPES, False, 32, "cp", "auto"),
            "i8t5": (STAGED_QTYPES, False, 32, "cp", "auto"), "spare2": (STAGED_QTYPES, False, 32, "cp", "auto"),
            "i8v": (STAGED_QTYPES, False, 32, "cp", "auto"), "noi8v": (STAGED_QTYPES, False, 32, "cp", "auto"),
            "i8vs1": (STAGED_QTYPES, False, 32, "cp", "auto"), "i8vw8": (STAGED_QTYPES, False, 32, "cp", "auto"),
            "i8vcopy": (STAGED_QTYPES, False, 32, "cp", "auto"), "i8voff": (STAGED_QTYPES, False, 32, "cp", "off"),
            "i8vall": (STAGED_QTYPES, False, 32, "cp", "auto"), "serialpdl": (STAGED_QTYPES, False, 32, "cp", "on"),
            **{v: (STAGED_QTYPES, False, 32, "cp", "auto") for v in V7_SETTINGS},
            **{f"s{s}n{n}": (STAGED_QTYPES, False, 32, "cp", "auto") for s, n in I8B_SHAPES}}
# attnpre: decode attention's first keys of earlier passes copied before its PDL wait (mixers.ATTN_PRE, v7's since
# Z19); attnplain: without
ATTN_PRE_VARIANTS = frozenset({"attnpre"})
ATTN_PLAIN_VARIANTS = frozenset({"attnplain"})
# decode attention's key splits merged by the output projection's producer (mixers.COMBINE_ACT, v7's since Z31):
# combact on, combapart off (attn_combine, then act_plain)
COMBINE_VARIANTS = {"combact": True, "combapart": False}
# qkfused: decode attention forming its own queries and this pass's keys (mixers.ATTN_PREP: no qk_prep launch)
ATTN_PREP_VARIANTS = frozenset({"qkfused"})
# v7 (the default) runs Q4_K launches of up to ops.I8_TOKENS tokens through the int8-activation matmul (v12 in
# bench/NOTES.md) unless OPENJET_CUDA_I8=0; "f16" is v7 without it, and the older generations never had it.
# k64: v7 with attention splits of 64+ keys
I8_VARIANTS = frozenset({"v7", "v7pdl", "v7off", "g1rms", "w4t1", "i8b", "i8bs", "i8", "r2", "r4", "serial", "k64",
                         "apart", "spare", "full", "serial8", "i8t5", "spare2", "i8v", "noi8v", "i8vs1", "i8vw8",
                         "i8vcopy", "i8voff", "i8vall", "serialpdl", *V7_SETTINGS} |
                        {f"s{s}n{n}" for s, n in I8B_SHAPES})
# v7 with the int8 matmul up to 5 tokens (ops.I8_TOKENS; v7: 4, the 5-token passes on the persistent f16 kernel)
I8_TOKEN_VARIANTS = {"i8t5": 5, "halves5": 5}
# v7 with the int8 matmuls' warps a block by token count (ops.I8_WARPS_AT; v7: 4 at one token since v19): w4t1 that
# default, named as it was measured; apart mmvq_i8's own choice (5 at K = 5,120)
I8_WARPS_VARIANTS = {"w4t1": {1: 4}, "apart": {}}
# v7 with the int8 matmuls of the widest rows (ffn_down, K = 17,408) in blocks of n warps at one token (dw<n>: Q4_K
# and Q6_K; dw<n>q<m>: Q6_K's m) or at 1-4 tokens (dw6all) (ops.I8_WIDE_WARPS_AT, Q6_I8_WIDE_WARPS_AT; v7: 4)
I8_WIDE_WARPS_VARIANTS = {**{f"dw{n}": ({1: n}, {1: n}) for n in (5, 6, 7, 8)}, "dw8q6": ({1: 8}, {1: 6}),
                          "dw8q7": ({1: 8}, {1: 7}), "dw6all": (dict.fromkeys(range(1, 5), 6),) * 2}
# v7 with only RMSNorm's one-group launches on its act_<mode>_g1 instance (ops.ACT_ONE_GROUP_MODES; v7: every
# mode's since v16, 0.03-0.05 ms a pass faster), the others on their ACT_MIN_BLOCKS instance as in v15
ONE_GROUP_VARIANTS = {"g1rms": frozenset({"rmsnorm"})}
# v7 with the producers of one token group on the group's blocks (group: as before v19) or of 2-8 tokens only on
# a block per token (split2; v7: 1-8, ops.ACT_SPLIT_TOKENS)
SPLIT_VARIANTS = {"group": frozenset(), "split2": frozenset(range(2, 9))}
I8_TILE_VARIANTS = {"r2": 2, "r4": 4}  # v7 with the int8 matmul's blocks walking 2 or 4 row tiles (ops.I8_TILES)
# v7 with every launch in one stream (ops.BESIDE off: a projection's small parts follow its large one); every
# other variant runs them beside it (engine/cuda/weights.py Projection.run) unless OPENJET_CUDA_BESIDE=0.
# serialpdl: one stream, PDL on every pass; serialauto: one stream, PDL where v7 has it
SERIAL_VARIANTS = frozenset({"serial", "serial8", "serialpdl", "serialauto"})
# The one-token Q4_K matmuls on the tensor-copy form (engine/cuda/i8b.py), v7's default since v16 for rows up to
# 24 superblocks (K <= 6,144): i8b at every width (i8bfull: with no block an SM spared, as ffn_down's 38 KB of staged
# activations leave (3, 2) two blocks an SM), i8bs that default; i8 (v7 with OPENJET_CUDA_I8B=0) none
BULK_I8_VARIANTS = {"i8b": None, "i8bs": 24, "i8bfull": None, "halvesi8b": None, "i8bdown8": None,
                    "i8bdownh8": None, "i8bdown4": None}
# v7 with mmvq_i8b's walking grid filling every SM (v7 leaves a block an SM free for what runs beside it since
# v17: i8b.SPARE_PER_SM); serial8: serial on mmvq_i8 (no mmvq_i8b), to tell the beside stream's share from the grid's
SPARE_VARIANTS = {"full": 0, "spare": 1, "spare2": 2, "i8bfull": 0}
# ... and in another instance shape at the same time (s<S>n<NS>full: no block spared, s<S>n<NS>spare2: two)
SHAPE_SPARE_VARIANTS = {f"s{s}n{n}{label}": ((s, n), spare) for s, n in ((3, 2), (5, 2))
                        for label, spare in (("full", 0), ("spare2", 2))}
NO_BULK_VARIANTS = frozenset({"i8", "serial8"})
# v7 with mmvq_i8b in another instance shape (S superblocks a stage, NS stages a warp; v7: i8b.SHAPE)
SHAPE_VARIANTS = {f"s{s}n{n}": (s, n) for s, n in I8B_SHAPES}
# v7 with the tensor-copy int8 matmul of 2-8 tokens on (i8v) or off (noi8v): engine/cuda/i8b.py verify_runs
# (OPENJET_CUDA_I8V; v7 follows it)
VERIFY_VARIANTS = {"i8v": True, "noi8v": False, "i8vs1": True, "i8vw8": True, "i8vcopy": True, "i8voff": True,
                   "i8vall": True}
# ... with a block an SM spared (i8vs1) or 8-warp blocks (i8vw8); i8vcopy: the producers write the int8 copy of
# 5-8 tokens but no matmul takes it (what that copy costs the pass); i8voff: without PDL on 5-token passes
VERIFY_SPARE_VARIANTS = {"i8vs1": 1}
VERIFY_WARPS_VARIANTS = {"i8vw8": 8, "i8vw12": 12}
# ... or the 5-token pass's in blocks of 4 or 5 warps (i8b.VERIFY_WARPS_AT; 8 until Z5, measured in v18 before the
# producers' block per token and PDL at 2-4 tokens), or of 10 and 12 (the kernel's most: one block an SM with more
# warps to hide its chains; 10 keeps K = 5,120's 20 superblocks in shares of 2, 12 K = 6,144's 24 too)
VERIFY_WARPS_AT_VARIANTS = {**{f"i8v5w{w}": {**DEFAULT_VERIFY_WARPS_AT, 5: w} for w in (4, 5, 10, 12)},
                            "i8vw8old": {5: 8, 6: 8, 7: 8, 8: 8}}  # the table before Z5 (12 at every count)
# v7 with the verify launches' idle warps kept (i8b.VERIFY_TRIM; before 3c4f2eb 20 superblocks ran in 8 warps, 7 busy)
NO_TRIM_VARIANTS = frozenset({"notrim"})
VERIFY_WIDTH_VARIANTS = {"i8vcopy": 0}
EVERY_VERIFY_COUNT = frozenset(range(2, 9))
VERIFY_TOKEN_VARIANTS = {"i8vall": EVERY_VERIFY_COUNT}  # i8vall: 3 tokens on it too
# The precise 3-token pass as measured before Z5 made i8v3pdl v7's (engine/cuda/device.py PDL_TOKEN_COUNTS,
# i8b.VERIFY_TOKENS): on mmvq_i8v without PDL (i8v3), on mmvq_i8 with PDL (pdl3) or without (i8v3off)
VERIFY_PRECISE_VARIANTS = dict.fromkeys(("i8v3", "i8v3pdl"), EVERY_VERIFY_COUNT) | dict.fromkeys(
    ("pdl3", "i8v3off"), EVERY_VERIFY_COUNT - {3})
# nopdl1: without PDL at one token (v7 until v20)
PDL_COUNT_VARIANTS = dict.fromkeys(("pdl3", "i8v3pdl"), frozenset({1, 2, 3, 4})) | dict.fromkeys(
    ("i8v3", "i8v3off"), frozenset({1, 2, 4})) | {"nopdl1": frozenset({2, 3, 4})}
# v7 with the precise Q6_K matmuls (ffn_down on 24 layers, attn_v, the output head) on other pipelined kernels
# (ops.PIPELINE_TABLE; v7: one token on mmvq_cpa, 2-4 on mmvq_cp, 5+ on the plain two-pass kernel): q6persist the
# persistent stream-K kernel at every count (ffn_down's 320 tiles fill half a wave on cpa), q6p5 / q6c5 it / mmvq_cp
# from 5 tokens
PIPELINE_TABLE_VARIANTS = {"q6persist": {(Q.Q6_K, True): ((8, "persist"),)},
                           "q6p5": {(Q.Q6_K, True): ((1, "cpa"), (4, "cp"), (8, "persist"))},
                           "q6c5": {(Q.Q6_K, True): ((1, "cpa"), (8, "cp"))}}
# v7 with the Q6_K matmuls off the int8 kernel (noq6i8: on the f16 ones, as before v21) or on it at 1 (q6i8t1),
# 1-4 (q6i8t4, v7's since v21) or 1-8 tokens (q6i8all) (ops.Q6_I8_COUNTS)
Q6_I8_COUNT_VARIANTS = {"noq6i8": frozenset(), "q6i8t1": frozenset({1}), "q6i8t4": frozenset(range(1, 5)),
                        "q6i8all": frozenset(Q6_I8_TOKENS), "halves5": frozenset(range(1, 6)),
                        "down5": frozenset(Q6_I8_TOKENS)}
# ffn_down at one token in two blocks a tile (ops.DOWN_HALVES: the second half's sums added by the next input norm);
# halvesi8b: with the Q4_K ffn_downs on mmvq_i8b as in i8b (there only the Q6_K ones go in halves); halves5: with
# both ffn_downs on the int8 kernels at 5 tokens too (i8t5's and q6i8all's settings), in halves there as well
HALVES_VARIANTS = frozenset({"halves", "halvesi8b", "halves5", "widehalves", "fillhalves", "allhalves", "q6bhalves", "q6bw8"})
# v7 with the mixers' output projections on mmvq_i8b in halves (ops.OUT_HALVES) where that evens the blocks' work;
# allhalves and fillhalves with ffn_down's halves too
# i8bdown8: the Q4_K ffn_downs on mmvq_i8b in 8-warp blocks, one an SM (as q6b does the Q6_K ones; v7's since Z24);
# i8bdownh8 the same walking half-tiles (OUT_HALVES, whose halves_pay takes them there: 5 half-tiles a block against
# 3 tiles); i8bdown4 in mmvq_i8's 4-warp blocks (i8b.WIDE_WARPS None: what variant i8b measured before Z24); i8bs
# the Q4_K ffn_downs on mmvq_i8 (v7 before Z24)
I8B_WIDE_WARPS_VARIANTS = {"i8bdown4": None}
# ... and those 8-warp blocks in another instance shape (i8b.WIDE_SHAPE): 40 (s5: 5 superblocks a stage, 2 stages)
# or 32 (s2n3) superblocks in flight an SM against (3, 2)'s 24
I8B_WIDE_SHAPE_VARIANTS = {"i8bdown8s5": (5, 2), "i8bdown8s2n3": (2, 3)}
OUT_HALVES_VARIANTS = frozenset({"outhalves", "fillhalves", "allhalves", "i8bdownh8"})
# v7 with the Q4_K ffn_downs of these verify counts on mmvq_i8v in halves (ops.VERIFY_HALVES_AT): i8vdown at every
# count it is built for (2-4 from mmvq_i8, 5-8 from the f16 persist kernel), i8vdown5 from 5 tokens; down5 the same
# with the Q6_K matmuls on mmvq_q6_i8 at every count (q6i8all's): no ffn_down on an f16 kernel from 5 tokens
VERIFY_HALVES_VARIANTS = {"i8vdown": frozenset(I8V_HALVES_TOKENS), "i8vdown5": frozenset(range(5, 9)),
                          "down5": frozenset(range(5, 9))}
# v7 with mmvq_i8b's walking grid on every resident block (i8b.FILL: some blocks a tile more)
FILL_VARIANTS = frozenset({"fill", "fillhalves"})
# v7 with the verify launches of these token counts in mmvq_i8v's wide form (i8b.VERIFY_WIDE_TOKENS: blocks of up
# to 24 warps, one superblock a stage): wide from 3 tokens, wide5 from 5, widehalves from 3 with halves' ffn_down
WIDE_VARIANTS = {"wide": frozenset(I8V_WIDE_TOKENS), "wide5": frozenset(t for t in I8V_WIDE_TOKENS if t >= 5),
                 "widehalves": frozenset(I8V_WIDE_TOKENS)}
# The one-token Q6_K matmul on tensor copies (engine/cuda/q6b.py; v7's since Z24: ffn_down's launches alone, in
# halves on 8-warp blocks). Its first forms (Z24, 4-warp blocks): q6b every Q6_K one-token launch (ffn_down, attn_v,
# the output head) whole; q6bhalves with ops.DOWN_HALVES (both ffn_downs in halves); q6bdown ffn_down's width only,
# whole; q6bw8 q6bhalves in 8-warp blocks; q6bh8 v7's settings (as measured before they were the default);
# q6bwhole ffn_down whole on 8-warp blocks; noq6b off (mmvq_q6_i8, v7 before Z24). Since Z28 it is off by default on
# the H200 (q6b.SLOWER_ON): these variants, and q6bon (v7's settings), turn it on there too (q6b.FORCED).
Q6B_MIN_COLS_VARIANTS = {"q6b": 0, "q6bhalves": 0, "q6bdown": 17408, "q6bw8": 0}
Q6B_WARPS_VARIANTS = {"q6b": 4, "q6bhalves": 4, "q6bdown": 4}
Q6B_WHOLE_VARIANTS = frozenset({"q6b", "q6bdown", "q6bwhole"})
Q6B_FORCED_VARIANTS = frozenset({"q6b", "q6bhalves", "q6bdown", "q6bw8", "q6bh8", "q6bwhole", "q6bon", "q6bs3"})
# q6bs3: q6bon in the (3, 2) instance shape: 3 superblocks a stage, so each 8-warp block keeps 24 in flight (81 KB)
# against (2, 2)'s 16 (54 KB). The reading it tests: one block an SM, the H200 needs more bytes in flight than the
# H100 to reach its bandwidth (~2 us loaded latency at ~32 GB/s an SM), which (2, 2) holds it under.
Q6B_SHAPE_VARIANTS = {"q6bs3": (3, 2)}
# The verify passes' Q6_K ffn_downs on mmvq_q6_i8v in halves (q6b.VERIFY_AT; off by default): q6v at every count it
# is built for (2-4 from mmvq_q6_i8, 5-8 from the f16 two-pass kernels), q6v5 from 5 tokens
Q6V_VARIANTS = {"q6v": frozenset(range(2, 9)), "q6v5": frozenset(range(5, 9))}
# The recurrent delta rule's state columns a warp (mixers.GDN_COLS, 4 by default since Z4; gdn8 the old form)
GDN_COLS_VARIANTS = {"gdn4": 4, "gdn8": 8}
# The causal conv launched apart from the delta rule on verify passes (mixers.GDN_CONV off; inside it by default),
# or inside it at one token only (mixers.GDN_CONV_TOKENS)
CONV_APART_VARIANTS = frozenset({"convapart"})
CONV_TOKEN_VARIANTS = {"conv1": frozenset({1})}
# The producers' int8 copy at every count, read or not (ops.I8_COPY_BY_WIDTH off: SwiGLU's from 5 tokens goes unread)
COPY_ALL_VARIANTS = frozenset({"copyall"})
# The accept's conv_commit and delta rule launched in each DeltaNet layer apart (mixers.GDN_ACCEPT_LAYERS off: all
# layers in one launch by default)
ACCEPT_APART_VARIANTS = frozenset({"acceptapart"})
# Its state columns a warp (mixers.GDN_ACCEPT_COLS, 8 by default)
ACCEPT_COLS_VARIANTS = {"accept4": 4}
# Fast mode's token counts on mmvq_i8v (i8b.VERIFY_FAST_TOKENS): fast24 those before 3 joined them (3 then ran
# mmvq_i8 under PDL); fastall every verify count (5-8 had stayed on the f16 kernels since b689f66; the default since
# c077727's run)
FAST_TOKEN_VARIANTS = {"fast24": frozenset({2, 4}), "fastall": EVERY_VERIFY_COUNT}
# Variants whose verify passes of 2, 4 and 5 tokens are profiled (the kernels they launch) in passes-only runs
PROFILED_VARIANTS = frozenset({"v7"})
# OPENJET_BENCH_PASSES_ONLY=1: the variants' decode and pass timings only (no profile, ablation or prefill)
PASSES_ONLY_ENV = "OPENJET_BENCH_PASSES_ONLY"
# OPENJET_BENCH_ABLATION=1 with it: the ablation of v7's T = 1 and T = 5 passes too
ABLATION_ENV = "OPENJET_BENCH_ABLATION"
# OPENJET_BENCH_PREFILL_CHUNK: the backend's workspace in tokens, so the prefill's chunk (unset: the engine's own
# default, gemm.prefill_tokens: 4,096 on sm_90 since bench/NOTES.md Z17; runs before 2026-12-06 timed 512)
PREFILL_CHUNK_ENV = "OPENJET_BENCH_PREFILL_CHUNK"
# OPENJET_BENCH_PREFILL_SWEEP="512:0,2048:0,2048:4": the prefill alone, in one process (the workspace sized for
# the largest chunk), at each chunk : OPENJET_CUDA_GEMM_WG mode pair in turn: tok/s at PREFILL_TOKENS and the
# greedy tokens after a 2,048-token prompt, checked equal to the first pair's
PREFILL_SWEEP_ENV = "OPENJET_BENCH_PREFILL_SWEEP"


def _model_file(report: Report) -> Path:
    """The generated file (written once per machine)."""
    from engine.gguf.testmodel import write_preset

    path = Path(os.environ.get("OPENJET_27B", "/tmp/openjet-qwen38-27b.gguf"))
    if not path.exists():
        t0 = time.perf_counter()
        write_preset(path, "qwen3.8-27b", workers=os.cpu_count())
        report.info["model27b_generate_s"] = round(time.perf_counter() - t0, 1)
    report.info["model27b_bytes"] = path.stat().st_size
    print(f"27B file: {path.stat().st_size / 1e9:.2f} GB", flush=True)
    return path


def _time_passes(backend, report: Report, copy_gbps: float, pass_bytes: int, tag: str) -> None:
    """Graph-replayed forward passes of T tokens at the current length (the pass does not commit, so every
    replay is the same pass), and the commit of an accepted prefix."""
    dev = backend.dev
    rng = np.random.default_rng(1)
    base = None
    for t in PASS_TOKENS:
        tokens = [int(x) for x in rng.integers(0, backend.vocab_size, size=t)]
        backend.verify(tokens)  # eager run + capture
        backend.verify(tokens)
        graph = backend._graphs[(t, False, t)]
        med, spread = median_time(dev, graph.launch, reps=20, warmup=3)
        base = base or med
        roofline_ms = pass_bytes / (copy_gbps * 1e9) * 1e3
        timing = Timing("forward", f"27b{tag}.T{t}", f"ctx{backend.num_tokens}", med, spread, pass_bytes,
                        {"vs_T1": round(med / base, 3), "roofline_frac": round(roofline_ms / med, 3)})
        report.timings.append(timing)
        print(f"  forward{tag} T={t}: {med:.3f} ms ({timing.gbps:.0f} GB/s, {roofline_ms / med:.0%} of the copy-bandwidth"
              f" roofline, {med / base:.2f}x T=1)", flush=True)
        # the commit as the backend runs it (its graph, CudaBackend.accept) and launched eagerly, as before 2026-12-06
        commit = {"graph": lambda t=t: backend._replay(("accept", t), lambda: backend.model.accept(t, t)),
                  "eager": lambda t=t: backend.model.accept(t, t)}
        times = {}
        for form, fn in commit.items():
            times[form], spread_acc = median_time(dev, fn, reps=10, warmup=2)
            report.timings.append(Timing("commit", f"27b{tag}.T{t}" + ("" if form == "graph" else ".eager"),
                                         "deltanet", times[form], spread_acc))
        print(f"  commit of {t} verified tokens (DeltaNet re-run): {times['graph']:.3f} ms from its graph, "
              f"{times['eager']:.3f} eager", flush=True)
        backend._pending = None


def _time_alone(backend, report: Report, tag: str) -> None:
    """Layer 0's one-token matmuls (a DeltaNet layer) and the first attention layer's output, each alone: with its
    weights in L2 (the launch replayed: the second finds what the first read, where it fits) and from DRAM (each
    launch after a copy of 4 x L2 that evicts it), what the kernel costs apart from DRAM."""
    from engine.cuda import ops

    dev, model = backend.dev, backend.model
    lw, ws = model.weights.layers[0], model.ws
    backend.verify([0])  # the activations' int8 copies as a one-token pass leaves them
    backend._pending = None
    # A replayed graph runs no Python, so each act still says what the last eager pass wrote (5 tokens: none of
    # SwiGLU's int8 copy, which sent ffn_down to the f16 kernel here until 2026-12-07): say what the replay wrote.
    for act in (ws.act_inner, ws.act_q, ws.act_h, ws.act_ffn):
        act.i8_tokens = ops._i8_written(dev, act, 1)
    flush = 4 * dev.info.l2_bytes
    src, dst = dev.alloc(flush, "l2.flush.src"), dev.alloc(flush, "l2.flush.dst")
    try:
        copy = median_time(dev, lambda: dev.copy(dst, src, flush), reps=20, warmup=3, inner=10)[0]
        gate_up = max((part.weight for part in lw.ffn_in.parts), key=lambda w: w.buf.nbytes)
        attn = model.weights.layers[model.cfg.layer_kinds.index("attention")]
        cases = (("ssm_out", lw.mix_out, ws.act_inner), ("attn_output", attn.mix_out, ws.act_q),
                 ("ffn_in", gate_up, ws.act_h), ("ffn_down", lw.ffn_down, ws.act_ffn))
        for label, w, act in cases:
            def run(w=w, act=act):
                ops.matmul(dev, w, act, ws.proj, 1, w.rows)

            def cold(run=run):
                dev.copy(dst, src, flush)
                run()

            hot, hot_spread = median_time(dev, run, reps=20, warmup=3, inner=20)
            both, spread = median_time(dev, cold, reps=20, warmup=3, inner=10)
            for where, ms, sp in (("l2", hot, hot_spread), ("dram", both - copy, spread)):
                report.timings.append(Timing("alone", f"27b{tag}.{label}.{where}", f"{w.rows}x{w.cols}", ms, sp,
                                             w.buf.nbytes))
            print(f"  {label}{tag} ({w.buf.nbytes / 1e6:.1f} MB) alone: from L2 {hot * 1e3:.1f} us, from DRAM "
                  f"{(both - copy) * 1e3:.1f} us", flush=True)
    finally:
        dev.memory.free(src)
        dev.memory.free(dst)


def _sweep_pairs(text: str) -> list[tuple[int, int]]:
    """PREFILL_SWEEP_ENV's "chunk:mode,..." as pairs (an error names the variable)."""
    try:
        return [(int(c), int(m)) for c, m in (item.split(":") for item in text.split(",") if item)]
    except ValueError:
        raise ValueError(f"{PREFILL_SWEEP_ENV}={text!r}: expected chunk:mode pairs, e.g. 512:0,2048:4") from None


def _prefill_sweep(backend, report: Report, pairs: list[tuple[int, int]]) -> None:
    """The prefill at each (chunk, gemm_wg mode): greedy tokens after a 2,048-token prompt (equal to the first
    pair's: a check) and tok/s at PREFILL_TOKENS; the first pair's chunk profiled (4,096 tokens, or 512)."""
    from bench.gpu_common import patched
    from engine.cuda import gemm

    first = None
    for chunk, mode in pairs:
        tag = f".c{chunk}.wg{mode}"
        backend.prefill_chunk = chunk
        backend.drop_graphs()
        try:
            with patched(gemm, WG=mode):
                if first is None:  # the tokens every run since v7 printed after a 512-token prompt (the notes)
                    _decode_sanity(backend, report, tag)
                    _profile(backend, report, tag, full=False, labels=(f"prefill{4096 if chunk >= 4096 else 512}",))
                tokens = _decode_sanity(backend, report, tag, prompt=2048)
                first = first or tokens
                same = sum(a == b for a, b in zip(tokens, first, strict=True))
                record(report, "model27b.prefill_sweep", f"{tag}.greedy", "16 tokens", float(len(tokens) - same), 0.5)
                print(f"  {tag}: greedy tokens {same} of {len(tokens)} equal to the first pair's", flush=True)
                _time_prefill(backend, report, tag)
        finally:
            backend.drop_graphs()


def _time_prefill(backend, report: Report, tag: str = "", counts: tuple[int, ...] = PREFILL_TOKENS) -> None:
    """Wall time of reset + prefill(n) (the final logits download waits for the device), best of two."""
    rng = np.random.default_rng(2)
    for n in counts:
        tokens = [int(x) for x in rng.integers(0, backend.vocab_size, size=n)]
        best = float("inf")
        for _ in range(2):
            backend.reset()
            t0 = time.perf_counter()
            backend.prefill(tokens)
            best = min(best, time.perf_counter() - t0)
        report.timings.append(Timing("prefill", f"27b{tag}.{n}", f"{n} tokens", best * 1e3, 0.0, 0,
                                     {"tok_per_s": round(n / best, 1)}))
        print(f"  prefill{tag} {n}: {best * 1e3:.1f} ms = {n / best:.0f} tok/s", flush=True)


def _profile(backend, report: Report, tag: str = "", full: bool = True, labels: tuple[str, ...] = ()) -> None:
    """Per-kernel device time of one eager pass (events around every launch): where a pass goes. full: every pass
    below, else verify1 (or the passes `labels` names)."""
    dev, rng = backend.dev, np.random.default_rng(4)
    # prefill512at1536: the fourth 512-token chunk of a 2,048-token prefill (attention over 2,048 keys);
    # prefill4096: a chunk of gemm_ws's default prefill (a workspace of 4,096 tokens)
    passes = (("verify1", 1, False, 1, None), ("verify5", 5, False, 5, None), ("prefill512", 512, True, 0, None),
              ("prefill512at1536", 512, True, 0, 1536), ("verify2", 2, False, 2, None), ("verify4", 4, False, 4, None),
              ("prefill4096", 4096, True, 0, None))
    chosen = passes[:4] if full else [p for p in passes if p[0] in labels] if labels else passes[:1]
    for label, n, commit, rows, start in chosen:
        label += tag
        backend.model.set_tokens([int(x) for x in rng.integers(0, backend.vocab_size, size=n)],
                                 backend.num_tokens if start is None else start)
        dev.profile = []
        backend.model.forward(n, commit, rows)
        summary = sorted(dev.profile_summary().items(), key=lambda kv: -kv[1][1])
        total = sum(ms for _, (_, ms) in summary)
        report.info[f"profile_{label}"] = {name: [count, round(ms, 4)] for name, (count, ms) in summary}
        top = ", ".join(f"{name} {ms:.2f} ms/{count}" for name, (count, ms) in summary[:12])
        print(f"  profile {label}: {total:.2f} ms in kernels: {top}", flush=True)
        report.notes.append(f"profile {label} ({total:.2f} ms of kernels): {top}")


def bench_27b(report: Report, args) -> None:
    """Load, sanity-decode and time the 27B-shaped model."""
    from engine.cuda.backend import CudaBackend

    path = _model_file(report)
    t0 = time.perf_counter()
    # the trunk alone, as every earlier run timed it (the MTP head's cost has its own part: bench/gpu_mtp27b.py)
    sweep = _sweep_pairs(os.environ.get(PREFILL_SWEEP_ENV, ""))
    asked = os.environ.get(PREFILL_CHUNK_ENV)
    chunk = max(c for c, _ in sweep) if sweep else int(asked) if asked else None  # None: the engine's default
    backend = CudaBackend.from_gguf(path, context_size=CONTEXT, max_tokens=chunk, mtp=False)
    report.info["model27b_prefill_chunk"] = backend.prefill_chunk
    report.info["model27b_load_s"] = round(time.perf_counter() - t0, 1)
    try:
        weights = backend.model.weights
        embd = weights.token_embd.buf.nbytes if weights.token_embd is not weights.output else 0
        pass_bytes = weights.nbytes - embd
        report.info["model27b_weight_bytes"] = weights.nbytes
        report.info["model27b_pass_bytes"] = pass_bytes
        print(f"27B loaded in {report.info['model27b_load_s']} s: {weights.nbytes / 1e9:.2f} GB on the GPU, "
              f"{pass_bytes / 1e9:.2f} GB read per pass", flush=True)
        bw = copy_bandwidth(backend.dev)
        report.timings.append(bw)
        report.info["copy_gbps_27b_run"] = round(bw.gbps, 1)
        if sweep:
            _prefill_sweep(backend, report, sweep)
            return
        report.info["model27b_variants"] = {k: [[q.name for q in types], everywhere, keys, kernel, pdl]
                                             for k, (types, everywhere, keys, kernel, pdl) in VARIANTS.items()}
        tokens, passes_only = {}, env_flag(PASSES_ONLY_ENV, False)
        chosen = [v for v in os.environ.get("OPENJET_BENCH_VARIANTS", "").split(",") if v] or list(VARIANTS)
        for name in chosen:
            if name == "v7pdl" and backend.dev.info.arch < PDL_MIN_ARCH:
                continue
            if name == "v8" and getattr(args, "skip_persist", False):
                report.notes.append("27B v8 (persistent mmvq) not run: its checks failed")
                continue
            _use_variant(backend, name)
            tag = "" if name == "v7" else f".{name}"
            try:
                _check_verify(backend, report, tag)  # first: it leaves the backend reset
                tokens[name] = _decode_sanity(backend, report, tag)  # the context every pass below is timed at
                backend.set_precise(True)
                _time_passes(backend, report, bw.gbps, pass_bytes, tag)
                _time_alone(backend, report, tag)
                backend.set_precise(False)
                _time_passes(backend, report, bw.gbps, pass_bytes, f"{tag}.fast")
                backend.set_precise(True)
                if not passes_only:
                    _profile(backend, report, tag, full=name == "v7")
                elif name in PROFILED_VARIANTS:  # which kernels its verify passes launch, and their device time
                    _profile(backend, report, tag, full=False, labels=("verify1", "verify2", "verify4", "verify5"))
            except CudaError:  # a newer variant's failure must not cost the others (a lost context still does)
                if name == "v7":
                    raise
                record(report, "model27b.variant", name, "decode and timings", 1.0, 0.5)
                report.notes.append(f"27B variant {name} raised: {traceback.format_exc(limit=4)}")
                tokens.pop(name, None)
                backend.set_precise(True)
        same = sum(1 for column in zip(*tokens.values(), strict=True) if len(set(column)) == 1)
        count = len(next(iter(tokens.values()), []))  # (v7 need not be among the variants asked for)
        report.notes.append(f"27B greedy tokens, {', '.join(tokens)} kernels: {same} of {count} equal")
        _use_variant(backend, "v7")
        if passes_only:
            if env_flag(ABLATION_ENV, False):
                _ablation(backend, report, bw.gbps, pass_bytes)
            return
        _ablation(backend, report, bw.gbps, pass_bytes)
        backend.reset()
        _time_prefill(backend, report)
        _prefill_before(backend, report, tokens["v7"])
        if "v7pdl" in tokens:  # prefill launched with PDL too
            _use_variant(backend, "v7pdl")
            backend.reset()
            _time_prefill(backend, report, ".pdl")
    finally:
        _use_variant(backend, "v7")
        backend.close()


# Kernel classes left out of a graph-replayed pass in turn (bench-only: Device.skip drops their launches, so the
# results are garbage but every other kernel streams what it streams): what each class costs inside the graph,
# where the eager profile's events add ~8 us a launch. Classes by instance-name prefix.
ABLATION = (("matmuls", ("mmvq", "mmv_")), ("q4k_matmuls", ("mmvq_q4_K",)), ("q6k_matmuls", ("mmvq_q6_K",)),
            ("q8_0_matmuls", ("mmvq_q8_0",)), ("producers", ("act_",)), ("rmsnorm", ("act_rmsnorm",)),
            ("swiglu", ("act_swiglu",)), ("gatednorm", ("act_gatednorm",)),
            ("mixers", ("attn", "qk_prep", "kv_store", "gdn", "conv")), ("attention", ("attn", "qk_prep", "kv_store")),
            ("deltanet", ("gdn", "conv")), ("everything_else", None))


def _ablation(backend, report: Report, copy_gbps: float, pass_bytes: int, token_counts=(1, 5)) -> None:
    """The T = 1 and T = 5 passes without each ABLATION class: its share of the graph time (leaves no graphs
    behind)."""
    dev, rng = backend.dev, np.random.default_rng(5)
    named = tuple(p for _, prefixes in ABLATION if prefixes for p in prefixes)
    for t in token_counts:
        tokens = [int(x) for x in rng.integers(0, backend.vocab_size, size=t)]
        full = None
        for label, prefixes in (("full", ()),) + ABLATION:
            if prefixes is None:  # what no class above names (norms, rope, embedding, argmax, copies)
                dev.skip = lambda name: not name.startswith(named)
            else:
                dev.skip = (lambda name, p=prefixes: name.startswith(p)) if prefixes else None
            backend.drop_graphs()
            try:
                backend.verify(tokens)  # eager run + capture, without the class
                (graph,) = backend._graphs.values()
                med, spread = median_time(dev, graph.launch, reps=20, warmup=3)
            finally:
                dev.skip = None
                backend.drop_graphs()
                backend._pending = None
            full = full or med
            name = f"27b.T{t}.without_{label}" if prefixes != () else f"27b.T{t}.ablation_full"
            report.timings.append(Timing("forward", name, "graph", med, spread, pass_bytes,
                                         {"class_ms": round(full - med, 3)}))
            print(f"  T={t} pass without {label}: {med:.3f} ms (the class: {full - med:.3f} ms)", flush=True)


# Prefill kernels compared against what they replaced, one switch at a time: (tag, module, attribute, value).
PREFILL_BEFORE = (("recurrent_rule", "mixers", "GDN_CHUNKED_MIN_TOKENS", 1 << 30),  # the delta rule unchunked
                  ("gemm_plain", "gemm", "STAGED", False),  # the GEMM reading its operands from global memory
                  ("attn_f32", "mixers", "ATTN_MMA_MIN_TOKENS", 1 << 30))  # attention on the float32 kernel


def _prefill_before(backend, report: Report, v7_tokens: list[int]) -> None:
    """The greedy decode after a 512-token prompt and the 2,048-token prefill with each PREFILL_BEFORE switch in
    turn: equal tokens (a check), and the prefill time each new kernel saves."""
    import importlib

    for tag, module_name, attr, value in PREFILL_BEFORE:
        module = importlib.import_module(f"engine.cuda.{module_name}")
        saved = getattr(module, attr)
        setattr(module, attr, value)
        backend.drop_graphs()
        try:
            tokens = _decode_sanity(backend, report, f".{tag}")
            same = sum(a == b for a, b in zip(tokens, v7_tokens, strict=True))
            record(report, "model27b.prefill_before", f"{tag}.greedy", "16 tokens", float(len(tokens) - same), 0.5)
            _time_prefill(backend, report, f".{tag}", counts=(2048,))
        finally:
            setattr(module, attr, saved)
            backend.drop_graphs()
            backend.reset()


def _use_variant(backend, name: str) -> None:
    """Switch the matmul and attention kernels to a generation of VARIANTS (captured passes are dropped)."""
    from engine.cuda import device, i8b, mixers, ops, q6b

    types, everywhere, min_keys, kernel, pdl = VARIANTS[name]
    ops.PIPELINE_TABLE = ops.DEFAULT_PIPELINE_TABLE | PIPELINE_TABLE_VARIANTS.get(name, {})
    ops.set_pipelined(frozenset(types), everywhere=everywhere, kernel=kernel)
    ops.set_i8(name in I8_VARIANTS and ops._i8_default(), I8_TOKEN_VARIANTS.get(name, ops.DEFAULT_I8_TOKENS))
    ops.I8_TILES = I8_TILE_VARIANTS.get(name, 1)
    ops.Q6_I8_COUNTS = Q6_I8_COUNT_VARIANTS.get(name, ops.DEFAULT_Q6_I8_COUNTS)
    ops.ACT_ONE_GROUP_MODES = ONE_GROUP_VARIANTS.get(name, ops.ACT_ONE_GROUP_DEFAULT)
    ops.ACT_SPLIT_TOKENS = SPLIT_VARIANTS.get(name, ops.ACT_SPLIT_DEFAULT)
    ops.I8_WARPS_AT = I8_WARPS_VARIANTS.get(name, ops.DEFAULT_I8_WARPS_AT)
    ops.I8_WIDE_WARPS_AT, ops.Q6_I8_WIDE_WARPS_AT = I8_WIDE_WARPS_VARIANTS.get(
        name, (ops.DEFAULT_I8_WIDE_WARPS_AT, ops.DEFAULT_Q6_I8_WIDE_WARPS_AT))
    ops.BESIDE = name not in SERIAL_VARIANTS and env_flag(ops.BESIDE_ENV, True)
    i8b.ON = name in BULK_I8_VARIANTS or (name in I8_VARIANTS and name not in NO_BULK_VARIANTS and i8b._default())
    i8b.MAX_SUPERBLOCKS = BULK_I8_VARIANTS.get(name, i8b.DEFAULT_MAX_SUPERBLOCKS)
    ops.DOWN_HALVES = name in HALVES_VARIANTS or ops._down_halves_default()
    ops.OUT_HALVES = name in OUT_HALVES_VARIANTS or ops._out_halves_default()
    ops.VERIFY_HALVES_AT = VERIFY_HALVES_VARIANTS.get(name, ops.DEFAULT_VERIFY_HALVES_AT)
    i8b.FILL = name in FILL_VARIANTS
    i8b.WIDE_WARPS = I8B_WIDE_WARPS_VARIANTS.get(name, i8b.DEFAULT_WIDE_WARPS)
    i8b.WIDE_SHAPE = I8B_WIDE_SHAPE_VARIANTS.get(name)
    q6b.ON = name != "noq6b" and q6b._default()
    q6b.FORCED = name in Q6B_FORCED_VARIANTS or q6b._forced()
    q6b.MIN_COLS = Q6B_MIN_COLS_VARIANTS.get(name, q6b.DEFAULT_MIN_COLS)
    q6b.WARPS = Q6B_WARPS_VARIANTS.get(name, q6b.DEFAULT_WARPS)
    q6b.SHAPE = Q6B_SHAPE_VARIANTS.get(name, q6b.DEFAULT_SHAPE)
    q6b.HALVES = name not in Q6B_WHOLE_VARIANTS and q6b.DEFAULT_HALVES
    q6b.VERIFY_AT = Q6V_VARIANTS.get(name, q6b.DEFAULT_VERIFY_AT)
    mixers.GDN_COLS = GDN_COLS_VARIANTS.get(name, mixers._gdn_cols_default())
    mixers.GDN_CONV = name not in CONV_APART_VARIANTS and env_switch(mixers.GDN_CONV_ENV, True)
    mixers.GDN_CONV_TOKENS = CONV_TOKEN_VARIANTS.get(name, mixers.DEFAULT_GDN_CONV_TOKENS)
    ops.I8_COPY_BY_WIDTH = name not in COPY_ALL_VARIANTS
    mixers.GDN_ACCEPT_LAYERS = name not in ACCEPT_APART_VARIANTS and env_switch(mixers.GDN_ACCEPT_ENV, True)
    mixers.GDN_ACCEPT_COLS = ACCEPT_COLS_VARIANTS.get(name, mixers.DEFAULT_GDN_ACCEPT_COLS)
    shape, spare = SHAPE_SPARE_VARIANTS.get(name, (SHAPE_VARIANTS.get(name, i8b.DEFAULT_SHAPE),
                                                   SPARE_VARIANTS.get(name, i8b.DEFAULT_SPARE_PER_SM)))
    i8b.SHAPE, i8b.SPARE_PER_SM = shape, spare
    i8b.VERIFY_ON = VERIFY_VARIANTS.get(name, name in I8_VARIANTS and i8b._verify_default())
    i8b.VERIFY_SPARE_PER_SM = VERIFY_SPARE_VARIANTS.get(name, i8b.DEFAULT_VERIFY_SPARE_PER_SM)
    i8b.VERIFY_WARPS = VERIFY_WARPS_VARIANTS.get(name)
    i8b.VERIFY_TRIM = name not in NO_TRIM_VARIANTS
    i8b.VERIFY_WIDE_TOKENS = WIDE_VARIANTS.get(name, i8b.DEFAULT_VERIFY_WIDE_TOKENS)
    i8b.VERIFY_WARPS_AT = VERIFY_WARPS_AT_VARIANTS.get(name, dict(i8b.DEFAULT_VERIFY_WARPS_AT))
    i8b.VERIFY_TOKENS = VERIFY_TOKEN_VARIANTS.get(name, VERIFY_PRECISE_VARIANTS.get(name, i8b.DEFAULT_VERIFY_TOKENS))
    device.PDL_TOKEN_COUNTS = PDL_COUNT_VARIANTS.get(name, device.DEFAULT_PDL_TOKEN_COUNTS)
    i8b.VERIFY_FAST_TOKENS = VERIFY_TOKEN_VARIANTS.get(name, FAST_TOKEN_VARIANTS.get(name,
                                                                                    i8b.DEFAULT_VERIFY_FAST_TOKENS))
    i8b.VERIFY_MAX_SUPERBLOCKS = VERIFY_WIDTH_VARIANTS.get(name, i8b.DEFAULT_VERIFY_MAX_SUPERBLOCKS)
    mixers.ATTN_MIN_KEYS = min_keys
    mixers.COMBINE_ACT = COMBINE_VARIANTS.get(name, mixers._combine_default())
    mixers.ATTN_PREP = name in ATTN_PREP_VARIANTS or mixers._attn_prep_default()
    mixers.ATTN_PRE = name in ATTN_PRE_VARIANTS or (name not in ATTN_PLAIN_VARIANTS and mixers._attn_pre_default())
    backend.dev.pdl_policy = pdl if backend.dev.info.arch >= PDL_MIN_ARCH else "off"
    backend.dev.pdl = pdl == "on"
    backend.drop_graphs()


# Verify passes checked against the one-token passes of the same tokens (verify_agreement), by token count
AGREE_TOKENS = (2, 5, 8)
AGREE_TOL = 1e-2  # a row's relative error: the two run other kernels on int8 operands (issue 4's bound for them)


def verify_agreement(backend, prompt: list[int],
                     counts: tuple[int, ...] = AGREE_TOKENS) -> dict[int, tuple[float, int]]:
    """Each count T's verify pass, fed the prompt's greedy continuation as drafts, against the T one-token passes
    that chose those tokens: {T: (the largest relative error of a row, the rows whose argmax differs)}. Every
    kernel of the verify path (its int8 matmuls, their halves and the norms that add them, attention and the
    delta rule over T tokens) at the model's real shapes; leaves the backend reset."""
    backend.reset()
    pending = int(np.argmax(backend.prefill(prompt)))
    fed, rows = [], []
    for _ in range(max(counts)):
        row = np.asarray(backend.verify([pending])[0], dtype=np.float64)
        backend.accept(1)
        fed.append(pending)
        rows.append(row)
        pending = int(np.argmax(row))
    out = {}
    for t in counts:
        backend.reset()
        backend.prefill(prompt)
        got = np.asarray(backend.verify(fed[:t]), dtype=np.float64)
        errors = [rel_err(got[i], rows[i]) for i in range(t)]
        out[t] = (max(errors), sum(int(np.argmax(got[i]) != np.argmax(rows[i])) for i in range(t)))
    backend.reset()
    return out


def _check_verify(backend, report: Report, tag: str = "", prompt: int = 512) -> None:
    """verify_agreement after the decode sanity's prompt, recorded as checks (argmax flips as a note: near-ties
    of random weights may flip without a fault)."""
    rng = np.random.default_rng(3)
    agree = verify_agreement(backend, [int(x) for x in rng.integers(0, backend.vocab_size, size=prompt)])
    for t, (error, flips) in agree.items():
        record(report, "model27b.verify", f"T{t}{tag}", f"{t} tokens vs {t} one-token passes", error, AGREE_TOL)
    report.notes.append(f"27B verify passes{tag} against one-token passes (T: largest row error, argmax flips): "
                        + ", ".join(f"{t}: {e:.1e}, {f}" for t, (e, f) in agree.items()))


def _decode_sanity(backend, report: Report, tag: str = "", prompt: int = 512) -> list[int]:
    """Prefill `prompt` random tokens and decode 16 greedily: finite logits, tokens in range; returns the tokens."""
    rng = np.random.default_rng(3)
    backend.reset()
    logits = backend.prefill([int(x) for x in rng.integers(0, backend.vocab_size, size=prompt)])
    tokens, finite = [], bool(np.isfinite(logits).all())
    pending = int(np.argmax(logits))
    for _ in range(16):
        row = backend.verify([pending])[0]
        backend.accept(1)
        finite &= bool(np.isfinite(row).all())
        pending = int(np.argmax(row))
        tokens.append(pending)
    record(report, "model27b.decode", f"finite{tag}", "16 tokens", 0.0 if finite else 1.0, 0.5)
    report.notes.append(f"27B greedy tokens{tag} after a {prompt}-token random prompt: {tokens}")
    print(f"  27B decoded{tag}: {tokens}", flush=True)
    return tokens
