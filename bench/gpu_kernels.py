"""Kernel checks against the numpy reference at the real Qwen3.8-27B shapes, and their timings.

Every check draws fresh random inputs, poisons the output with NaN, runs the kernel and compares with the
float64/float32 numpy result by ||out - ref|| / ||ref||.
"""

from __future__ import annotations

import os
import traceback
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import TOL_F16, TOL_F32, Report, Timing, compare, median_time, patched, poison
from engine.cuda import gemm, i8b, instances, ops, q6b
from engine.cuda.device import PDL_MIN_ARCH, Buffer, CudaError, Device
from engine.cuda.repack import device_nbytes, random_blocks
from engine.gguf.quants import dequantize

H, FFN, VOCAB = 5120, 17408, 248320
# (name, rows, cols) of the 27B model's matrices
SHAPES_27B = {
    "attn_q": (12288, H), "attn_kv": (1024, H), "attn_output": (H, 6144), "attn_qkv": (10240, H),
    "attn_gate": (6144, H), "ssm_ab": (48, H), "ssm_out": (H, 6144), "ffn_up": (FFN, H), "ffn_down": (H, FFN),
    "output": (VOCAB, H), "ffn_gate_up": (2 * FFN, H),
    "odd_rows": (999, 768),  # not a 27B shape: a partial row tile, an odd number of blocks (Q6_K's last d word)
}
# which types each matrix is checked in (all types on one shape; the Q4_K_M mix on the others)
CHECKS = [("attn_q", qt) for qt in (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16)] + [
    ("attn_kv", Q.Q6_K), ("ssm_ab", Q.Q4_K), ("ffn_down", Q.Q6_K), ("ffn_up", Q.Q4_K), ("attn_output", Q.Q4_K),
    ("output", Q.Q6_K), ("ssm_ab", Q.F32), ("ffn_down", Q.Q4_K), ("odd_rows", Q.Q4_K), ("odd_rows", Q.Q6_K),
]
# the pipelined mmvq's column modes: packed (T <= 4, fast and precise) and two-pass (T > 4, precise); ffn_down's
# 17 superblocks per warp go round the stage ring several times
PIPELINE_CHECKS = [(name, qt, t, precise) for qt in instances.STAGED_QTYPES for name in ("attn_q", "odd_rows")
                   for t, precise in ((1, True), (3, False), (4, True), (5, True), (8, True))] + [
    ("ffn_down", qt, t, True) for qt in instances.STAGED_QTYPES for t in (1, 5)]
# mmvq_cp with staged activations: every token count and mode it runs (1-4 tokens, fast and precise), around the
# ring on ffn_down, a partial tile, the output matrix
STAGED_ACT_CHECKS = [(name, qt, t, precise) for qt in instances.STAGED_QTYPES for name in ("attn_q", "odd_rows")
                     for t in (1, 2, 3, 4) for precise in (False, True)] + [
    ("ffn_down", qt, t, precise) for qt in instances.STAGED_QTYPES for t in (1, 4) for precise in (False, True)] + [
    ("ffn_up", Q.Q4_K, 1, True), ("output", Q.Q6_K, 1, False)]
# prefill-sized checks: the GEMM types through the tensor-core GEMM, the others through mmvq 8 tokens at a time
GEMM_CHECKS = [("attn_q", Q.Q4_K, 40), ("ffn_down", Q.Q6_K, 70), ("attn_q", Q.Q8_0, 33), ("attn_q", Q.Q5_K, 16),
               ("attn_q", Q.Q4_0, 20), ("attn_kv", Q.Q6_K, 129), ("odd_rows", Q.Q4_K, 45), ("odd_rows", Q.Q6_K, 100)]
REF_ROWS = 4096  # the reference recomputes at most this many (random) rows of a large matrix


def _reference_rows(data: np.ndarray, qtype: Q, shape: tuple[int, int], rows: np.ndarray) -> np.ndarray:
    """Dequantized rows of a tensor in float64."""
    sub = data[rows]
    return dequantize(sub, qtype, (len(rows), shape[1])).astype(np.float64)


# The int8-activation Q4_K matmul (kernels/mmvq_i8.cu) at every token count it runs: around the ring on ffn_down,
# a partial tile and three superblocks on odd_rows, 48 rows on ssm_ab. Its activations keep 1.5e-5 of each
# superblock's largest value, so it is held to TOL_I8 against the float64 reference (a dropped sub-block, scale
# or level costs 1e-3 or more) and to the precise f16 kernel's result at the same tolerance.
I8_CHECKS = [(name, t) for name in ("attn_q", "odd_rows", "ffn_down") for t in (1, 2, 3, 4, 5)] + [
    ("ffn_up", 1), ("ssm_ab", 1), ("attn_output", 2), ("ssm_ab", 5)]
TOL_I8 = 1e-4
# The f16 Q6_K kernels form each weight's (q - 32) * scale in f16, which rounds products above 2,048 (random scales
# reach 127): 1.4-1.5e-4 against the float64 reference where the int8 Q6_K kernel keeps 2.7e-5 (run 0ff4387). So
# the int8 Q6_K kernel is held to the f16 one at this tolerance, and to the reference at TOL_I8.
TOL_I8_VS_F16_Q6K = 4e-4
# The tensor-copy form at one token (kernels/mmvq_i8b.cu): every instance shape on a partial tile (odd_rows), a
# warp's share round the ring several times (ffn_down: 17 superblocks a warp), more warps than a row's superblocks
# would fill (odd_rows' 3), and the other 27B widths with the launcher's shape.
I8B_CHECKS = [(name, shape, True) for shape in instances.I8B_SHAPES for name in ("odd_rows", "ffn_down")] + [
    (name, None, persist) for name in ("attn_q", "ffn_up", "attn_output", "ssm_ab", "odd_rows")
    for persist in (False, True)]  # persistent: several tiles a block (a partial last one on odd_rows) or one
TOL_I8B_SAME = 1e-5
# The tensor-copy form of 2-8 tokens (kernels/mmvq_i8v.cu): every token count on a partial tile and three
# superblocks a row (odd_rows) and at K = 5,120 (attn_q), 48 rows (ssm_ab), the widest rows it takes (attn_output's
# 24 superblocks); precise and fast mode alike (it replaces both). Held to TOL_I8 against the float64 reference,
# to mmvq_i8 (up to its 5 tokens) at TOL_I8B_SAME and, precise, to the f16 kernels at TOL_I8.
I8V_CHECKS = [(name, t, precise) for name in ("odd_rows", "attn_q") for t in instances.I8V_TOKENS
              for precise in (False, True)] + [("ssm_ab", 5, True), ("attn_output", 8, True), ("attn_output", 3, False),
                                               ("ffn_up", 5, True)]
# ... and in blocks of the kernel's most warps (i8b.VERIFY_MAX_WARPS, 12; 10 busy at K = 5,120): a partial tile,
# and K = 6,144 at 12 warps
I8V_W12_CHECKS = [("odd_rows", 5, True), ("attn_q", 5, True), ("attn_q", 8, False), ("attn_output", 5, True)]
# ... and its wide form (i8b.VERIFY_WIDE_TOKENS: up to 24 warps, one superblock a stage) at every count it is built
# for: 3 superblocks a row in 3 warps (odd_rows), K = 5,120 in 20 warps of one superblock (attn_q), 48 rows
# (ssm_ab), and K = 6,144, which leaves 12 warps of two at 5 tokens (attn_output)
I8V_WIDE_CHECKS = [(name, t, precise) for name in ("odd_rows", "attn_q") for t in instances.I8V_WIDE_TOKENS
                   for precise in (False, True)] + [("ssm_ab", 5, True), ("attn_output", 5, True),
                                                    ("attn_output", 8, False)]
# ... and in halves on ffn_down (the half-row staged: 34 superblocks), in 12, 12 and 7 warps
I8V_HALVES_CHECKS = (2, 5, 8)
# ... and with several row tiles a block: 63 tiles of odd_rows leave a partial last block (and tile), ssm_ab's 3
# tiles a block of fewer than 4, ffn_down's ring runs across its tiles
I8_TILE_CHECKS = [("odd_rows", 1), ("odd_rows", 4), ("ssm_ab", 1), ("ffn_down", 2), ("attn_q", 3)]
# The int8 Q6_K matmul (kernels/mmvq_i8q6.cu): every token count it is built for on a partial tile with three
# superblocks a row (odd_rows) and round its ring (ffn_down: 68 superblocks), the 1,024 rows of attn_v and the
# output head at one token. Held to TOL_I8 against the float64 reference and, precise, to the f16 kernels.
Q6_I8_CHECKS = [(name, t) for name in ("odd_rows", "ffn_down") for t in instances.Q6_I8_TOKENS] + [
    ("attn_kv", 1), ("attn_kv", 5), ("output", 1)]
# ... and its one-token form on tensor copies (kernels/mmvq_i8q6b.cu): every instance shape on a partial tile with
# an odd number of blocks (odd_rows: the last d word) and round a warp's ring on ffn_down (17 superblocks a warp),
# the launcher's shape on attn_v's 64 tiles and on the output head (~59 tiles a block). Held to TOL_I8 against the
# float64 reference and to mmvq_q6_i8 (the same int32 products, summed in another order) at TOL_I8B_SAME.
Q6B_CHECKS = [(name, shape) for shape in instances.Q6B_SHAPES for name in ("odd_rows", "ffn_down")] + [
    ("attn_kv", None), ("output", None)]
# ... and its form of 2-8 tokens in halves (q6b.VERIFY_AT), on ffn_down: y + y2 against the whole launch on
# mmvq_q6_i8 (2-4 tokens) or the f16 kernels (5-8) at TOL_I8, and the norm that adds them. 2: one mma a half, full;
# 3 and 5: padding columns; 8: every column, and the fewest warps (the staged rows leave the least for rings).
Q6V_CHECK_TOKENS = (2, 3, 5, 8)


def check_matmul(dev: Device, report: Report, rng: np.random.Generator, name: str, qtype: Q, num_tokens: int,
                 with_residual: bool = True, precise: bool = False, tag: str = "") -> None:
    """mmvq (or the f32 path) against x @ W^T on fresh random weights and activations."""
    rows, cols = SHAPES_27B[name]
    data = random_blocks(qtype, (rows, cols), rng)
    w = ops.upload_weight(dev, data, qtype, (rows, cols), name)
    act = ops.alloc_act(dev, num_tokens, cols, "x", precise=precise)
    x = rng.standard_normal((num_tokens, cols), dtype=np.float32)
    dev.upload(act.f32, x)
    ops.act_f16(dev, act.f32, act, num_tokens, act.ld)
    y = dev.alloc(4 * num_tokens * rows, "y")
    res = dev.to_device(rng.standard_normal((num_tokens, rows), dtype=np.float32), "res") if with_residual else None
    poison(dev, y)
    ops.matmul(dev, w, act, y, num_tokens, rows, residual=res)
    out = dev.download(y, np.float32, (num_tokens, rows))
    pick = np.sort(rng.choice(rows, size=min(rows, REF_ROWS), replace=False))
    ref = x.astype(np.float64) @ _reference_rows(data, qtype, (rows, cols), pick).T
    if res is not None:
        ref += dev.download(res, np.float32, (num_tokens, rows))[:, pick]
    tol = TOL_F32 if qtype == Q.F32 or precise else TOL_F16
    variant = f"{qtype.name}.T{num_tokens}" + (".precise" if precise else "") + tag
    verify = i8b.verify_runs(dev, w, num_tokens, act)
    q6 = ops.q6_i8_runs(dev, w, num_tokens, act)
    q6_bulk = q6 and q6b.runs(dev, w, num_tokens)
    i8 = verify or q6 or ops.i8_runs(qtype, num_tokens, act, dev.info.max_smem_per_block)
    bulk = i8 and not verify and not q6 and i8b.runs(dev, w, num_tokens, act)
    pipelined = ("i8v" if verify else ("i8q6b" if q6_bulk else "i8q6") if q6 else "i8b" if bulk else "i8") if i8 \
        else _runs_pipeline(qtype, precise, num_tokens)
    variant += f".{pipelined}" if pipelined else ""
    compare(report, "matmul", variant, out[:, pick], ref, TOL_I8 if i8 else tol)
    unwritten = int(np.count_nonzero(np.isnan(out)))
    if unwritten:
        report.checks[-1].unwritten = unwritten
    if bulk or (verify and num_tokens <= instances.I8_MAX_TOKENS):  # mmvq_i8's arithmetic in another order
        _check_against_i8(dev, report, w, act, y, res, out, num_tokens, variant)
    if q6_bulk:  # mmvq_q6_i8's
        with q6_i8_bulk(False):
            plain = _rerun(dev, w, act, y, res, num_tokens)
        compare(report, "matmul.same", variant + ".vs_i8q6", out, plain, TOL_I8B_SAME)
    if i8 and precise:  # against the fast f16 kernel the difference is that kernel's own error (~2e-4)
        _check_against_f16(dev, report, w, act, y, res, out, num_tokens, variant)
    elif pipelined and not i8:
        _check_against_plain(dev, report, w, act, y, res, out, num_tokens, variant)
    if _runs_gemm_cp(dev, qtype, num_tokens):
        _check_against_plain_gemm(dev, report, w, act, y, res, out, num_tokens, variant)
    for buf in [w.buf, y, *act.buffers()] + ([res] if res is not None else []):
        dev.memory.free(buf)


def _rerun(dev: Device, w, act, y, res, num_tokens: int) -> np.ndarray:
    """The same matmul again (under whatever switch the caller set), its output poisoned first."""
    poison(dev, y)
    ops.matmul(dev, w, act, y, num_tokens, w.rows, residual=res)
    return dev.download(y, np.float32, (num_tokens, w.rows))


@contextmanager
def i8_matmul(on: bool, tokens: int | None = None):
    """The int8 matmul switched (ops.set_i8) for the block, its setting restored after it."""
    saved = ops.I8_MATMUL, ops.I8_TOKENS
    try:
        ops.set_i8(on, tokens)
        yield
    finally:
        ops.set_i8(*saved)


def _check_against_f16(dev: Device, report: Report, w, act, y, res, out: np.ndarray, num_tokens: int,
                       variant: str) -> None:
    """The int8 matmul against the f16 kernels on the same inputs (the precise ones where the residue is
    there): a whole-matrix comparison, where the reference check samples rows."""
    with i8_matmul(False):
        f16 = _rerun(dev, w, act, y, res, num_tokens)
    compare(report, "matmul.same", variant + ".vs_f16", out, f16, TOL_I8_VS_F16_Q6K if w.qtype == Q.Q6_K else TOL_I8)


@contextmanager
def bulk_i8(on: bool, shape: tuple[int, int] | None = None, warps: int | None = None, persist: bool | None = None):
    """The tensor-copy int8 matmul (engine/cuda/i8b.py) switched for the block at every row width, its settings
    restored after it."""
    saved = i8b.ON, i8b.SHAPE, i8b.WARPS, i8b.PERSIST, i8b.MAX_SUPERBLOCKS
    try:
        i8b.ON, i8b.SHAPE, i8b.WARPS, i8b.MAX_SUPERBLOCKS = on, shape or saved[1], warps, None
        i8b.PERSIST = saved[3] if persist is None else persist
        yield
    finally:
        i8b.ON, i8b.SHAPE, i8b.WARPS, i8b.PERSIST, i8b.MAX_SUPERBLOCKS = saved


def _check_against_i8(dev: Device, report: Report, w, act, y, res, out: np.ndarray, num_tokens: int,
                      variant: str) -> None:
    """mmvq_i8b (or mmvq_i8v) against mmvq_i8 on the same inputs: both sum the same exact int32 products, so only
    the order of their float sums differs (~1e-7); a dropped superblock, row, token or min term is 1e-3 or more."""
    with bulk_i8(False), verify_i8(False), i8_matmul(True, max(num_tokens, ops.I8_TOKENS)):
        plain = _rerun(dev, w, act, y, res, num_tokens)
    compare(report, "matmul.same", variant + ".vs_i8", out, plain, TOL_I8B_SAME)


@contextmanager
def verify_i8(on: bool, warps: int | None = None, spare: int | None = None, wide: bool = False):
    """The tensor-copy int8 matmul of 2-8 tokens (engine/cuda/i8b.py verify_runs) switched for the block at every
    token count it is built for, with optionally its warps a block and blocks an SM left free, in its wide form
    (every count that has one) or not; the settings restored after it."""
    saved = (i8b.VERIFY_ON, i8b.VERIFY_WARPS, i8b.VERIFY_SPARE_PER_SM, i8b.VERIFY_TOKENS, i8b.VERIFY_FAST_TOKENS,
             i8b.VERIFY_WIDE_TOKENS)
    try:
        i8b.VERIFY_ON = on
        i8b.VERIFY_WARPS = warps if warps is not None else saved[1]
        i8b.VERIFY_SPARE_PER_SM = spare if spare is not None else saved[2]
        i8b.VERIFY_TOKENS = i8b.VERIFY_FAST_TOKENS = frozenset(instances.I8V_TOKENS)  # every count it is built for
        i8b.VERIFY_WIDE_TOKENS = frozenset(instances.I8V_WIDE_TOKENS if wide else ())
        yield
    finally:
        (i8b.VERIFY_ON, i8b.VERIFY_WARPS, i8b.VERIFY_SPARE_PER_SM, i8b.VERIFY_TOKENS, i8b.VERIFY_FAST_TOKENS,
         i8b.VERIFY_WIDE_TOKENS) = saved


def gemm_staged(on: bool):
    """gemm.STAGED set to `on` for the block, restored after it."""
    return patched(gemm, STAGED=on)


def _runs_gemm_cp(dev: Device, qtype: Q, num_tokens: int) -> bool:
    """Whether ops.matmul runs the GEMM with staged operands (gemm_cp) for this call."""
    return num_tokens >= gemm.MIN_TOKENS and gemm.runs_cp(qtype, dev.info.max_smem_per_block)


def _check_against_plain_gemm(dev: Device, report: Report, w, act, y, res, out: np.ndarray, num_tokens: int,
                              variant: str) -> None:
    """gemm_cp against gemm on the same inputs: the same fragments and mma in the same order, so they agree to
    f32 rounding; a stage slot read before its copy landed, or a token group staged from the wrong place, shows."""
    with gemm_staged(False):
        plain = _rerun(dev, w, act, y, res, num_tokens)
    compare(report, "matmul.same", variant + ".gemm_cp", out, plain, TOL_SAME_MATH)


def _runs_pipeline(qtype: Q, precise: bool, num_tokens: int) -> str:
    """The pipelined mmvqs ops.matmul runs for the 8-token launches of this call ("cp", "persist", "cp+persist";
    empty for none)."""
    if num_tokens >= gemm.MIN_TOKENS and qtype in gemm.INSTANCES:
        return ""
    kernels = {ops.pipeline_kernel(qtype, precise, min(ops.ACT_GROUP, num_tokens - t0))
               for t0 in range(0, num_tokens, ops.ACT_GROUP)} - {None}
    return "+".join(sorted(kernels))


TOL_SAME_MATH = 1e-5  # two kernels with the same fragments and mma, summed in another order


def _check_against_plain(dev: Device, report: Report, w, act, y, res, out: np.ndarray, num_tokens: int,
                         variant: str) -> None:
    """The pipelined kernel against the register-pipelined one on the same inputs: the same products in another
    order, so they agree to f32 rounding; a dropped residue column or sub-block sum (~1e-4 against the float64
    reference, inside its f16 tolerance) shows here."""
    saved = ops.pipeline_state()
    try:
        ops.set_pipelined(frozenset())
        plain = _rerun(dev, w, act, y, res, num_tokens)
    finally:
        ops.set_pipelined(*saved)
    compare(report, "matmul.same", variant, out, plain, TOL_SAME_MATH)


def run_matmul_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """All matmul checks: every type at attn_q, the Q4_K_M mix at the other shapes, several T; the K-quants
    through the pipelined kernel in every mode (also where the default picks the plain one), each case also
    against the plain kernel (the persistent kernel has its own part: bench/gpu_persist.py); then the int8
    Q4_K kernel (I8_CHECKS)."""
    saved = ops.pipeline_state()
    types = saved[0] if saved[2] == "cp" else frozenset(instances.STAGED_QTYPES)  # OPENJET_CUDA_MMVQ=plain: none
    try:
        ops.set_pipelined(types, everywhere=True)
        with i8_matmul(False):  # the f16 kernels first (they still run wherever the int8 one does not)
            _run_matmul_checks(dev, report, rng)
    finally:
        ops.set_pipelined(*saved)
    run_i8_checks(dev, report, rng)


def _run_matmul_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """The checks of run_matmul_checks, in the pipeline setting in force."""
    print("matmul checks (27B shapes)", flush=True)
    for name, qtype in CHECKS:
        for num_tokens in (1, 5) if name != "output" else (1, 3):
            check_matmul(dev, report, rng, name, qtype, num_tokens)
    check_matmul(dev, report, rng, "attn_q", Q.Q4_K, 8)
    check_matmul(dev, report, rng, "attn_q", Q.Q4_K, 11)  # two launches: 8 + 3 rows
    for name, qtype, num_tokens in GEMM_CHECKS:
        check_matmul(dev, report, rng, name, qtype, num_tokens)
    with gemm_staged(False):  # the plain GEMM for the staged types too
        for name, qtype, num_tokens in GEMM_CHECKS:
            if qtype in instances.GEMM_CP_QTYPES:
                check_matmul(dev, report, rng, name, qtype, num_tokens, tag=".gemm")
    for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # precise mode: exact K-quant weights, f32-level activations
        check_matmul(dev, report, rng, "attn_q", qtype, 3, precise=True)
    for name, qtype, num_tokens, precise in PIPELINE_CHECKS:
        check_matmul(dev, report, rng, name, qtype, num_tokens, precise=precise)
    saved = ops.pipeline_state()
    try:  # the register-pipelined kernel runs the other modes: check it in the same run
        ops.set_pipelined(frozenset())
        for qtype in instances.STAGED_QTYPES:
            for num_tokens, precise in ((1, False), (5, True)):
                check_matmul(dev, report, rng, "attn_q", qtype, num_tokens, precise=precise, tag=".plain")
    finally:
        ops.set_pipelined(*saved)
    try:  # the activations staged beside the weights (cpa, cpa2: packed columns up to 4 tokens)
        for kernel in ops.STAGED_TILES:
            ops.set_pipelined(frozenset(instances.STAGED_QTYPES), everywhere=True, kernel=kernel)
            for name, qtype, num_tokens, precise in STAGED_ACT_CHECKS:
                check_matmul(dev, report, rng, name, qtype, num_tokens, precise=precise)
    finally:
        ops.set_pipelined(*saved)
    failing = {c.variant.split(".")[0] for c in report.checks if c.op.startswith("matmul") and not c.ok}
    for name in sorted(failing):
        diagnose_matmul(dev, report, rng, Q[name])


def run_i8_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """The int8-activation Q4_K matmul (I8_CHECKS) at every token count it is built for, in fast and precise
    mode (it replaces both)."""
    with i8_matmul(True, instances.I8_MAX_TOKENS):
        with bulk_i8(False):  # mmvq_i8 itself at one token too (the default takes mmvq_i8b there on sm_90+)
            for name, num_tokens in I8_CHECKS:
                for precise in (False, True):
                    check_matmul(dev, report, rng, name, Q.Q4_K, num_tokens, precise=precise)
        if dev.info.arch >= i8b.MIN_ARCH:
            for name, shape, persist in I8B_CHECKS:
                for precise in (False, True):
                    with bulk_i8(True, shape, persist=persist):
                        tag = f".s{i8b.SHAPE[0]}n{i8b.SHAPE[1]}" + (".p" if persist else "")
                        check_matmul(dev, report, rng, name, Q.Q4_K, 1, precise=precise, tag=tag)
            with verify_i8(True):
                for name, num_tokens, precise in I8V_CHECKS:
                    check_matmul(dev, report, rng, name, Q.Q4_K, num_tokens, precise=precise)
            with verify_i8(True, warps=i8b.VERIFY_MAX_WARPS):
                for name, num_tokens, precise in I8V_W12_CHECKS:
                    check_matmul(dev, report, rng, name, Q.Q4_K, num_tokens, precise=precise, tag=".w12")
            with verify_i8(True, wide=True):
                for name, num_tokens, precise in I8V_WIDE_CHECKS:
                    check_matmul(dev, report, rng, name, Q.Q4_K, num_tokens, precise=precise, tag=".wide")
            with verify_i8(True):  # ffn_down on it in halves (ops.VERIFY_HALVES_AT): whole, mmvq_i8 up to 4 tokens
                for num_tokens in I8V_HALVES_CHECKS:  # and the f16 persist kernel past them
                    check_halves(dev, report, rng, Q.Q4_K, num_tokens, switch="VERIFY_HALVES_AT", tag=".i8v",
                                 on=frozenset(instances.I8V_HALVES_TOKENS), off=frozenset(),
                                 tol=TOL_HALVES if num_tokens <= ops.I8_TOKENS else TOL_I8)
        with bulk_i8(False):
            for num_tokens in (1, 5):
                check_halves(dev, report, rng, Q.Q4_K, num_tokens)
        if dev.info.arch >= i8b.MIN_ARCH:  # the mixers' outputs on mmvq_i8b, walking half-tiles (every grid rule)
            for fill in (False, True):
                with bulk_i8(True), patched(i8b, FILL=fill):
                    for name in ("ssm_out", "attn_output"):
                        check_halves(dev, report, rng, Q.Q4_K, 1, name, "OUT_HALVES", ".fill" if fill else "")
            with bulk_i8(True), patched(i8b, FILL=True):  # every resident block, some a tile more
                for name in ("ffn_gate_up", "odd_rows"):
                    check_matmul(dev, report, rng, name, Q.Q4_K, 1, precise=True, tag=".fill")
        run_q6_i8_checks(dev, report, rng)
        try:
            for tiles in instances.I8_TILE_COUNTS[1:]:  # blocks of several row tiles (a partial last block too)
                ops.I8_TILES = tiles
                for name, num_tokens in I8_TILE_CHECKS:
                    with bulk_i8(False):
                        check_matmul(dev, report, rng, name, Q.Q4_K, num_tokens, precise=True, tag=f".r{tiles}")
        finally:
            ops.I8_TILES = 1


def run_q6_i8_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """The int8 Q6_K matmul (Q6_I8_CHECKS) at every token count it is built for, fast and precise."""
    with q6_i8(True):
        for name, num_tokens in Q6_I8_CHECKS:
            for precise in (False, True):
                check_matmul(dev, report, rng, name, Q.Q6_K, num_tokens, precise=precise)
        for num_tokens in (1, 5):
            check_halves(dev, report, rng, Q.Q6_K, num_tokens)
        if dev.info.arch >= i8b.MIN_ARCH:
            for name, shape in Q6B_CHECKS:
                for precise in (False, True):
                    with q6_i8_bulk(True, shape):
                        tag = f".s{q6b.SHAPE[0]}n{q6b.SHAPE[1]}"
                        check_matmul(dev, report, rng, name, Q.Q6_K, 1, precise=precise, tag=tag)
            for shape in instances.Q6B_SHAPES:  # walking half-tiles
                with q6_i8_bulk(True, shape):
                    check_halves(dev, report, rng, Q.Q6_K, 1, tag=f".i8q6b.s{shape[0]}n{shape[1]}")
            for t in Q6V_CHECK_TOKENS:  # the verify rows on tensor copies, against mmvq_q6_i8 or the f16 kernels
                check_halves(dev, report, rng, Q.Q6_K, t, module=q6b, switch="VERIFY_AT", tag=".i8q6v",
                             on=frozenset({t}), off=frozenset(), tol=TOL_I8)


# The halves' sum against the whole launch: the same int32 products, the float sums in another order (~1e-7); a
# dropped or doubled superblock, or bias or residual in both halves, is 1e-3 or more.
TOL_HALVES = 1e-5


def check_halves(dev: Device, report: Report, rng: np.random.Generator, qtype: Q, num_tokens: int,
                 name: str = "ffn_down", switch: str = "DOWN_HALVES", tag: str = "", on: object = True,
                 off: object = False, tol: float = TOL_HALVES, module: object = ops) -> None:
    """A launch in halves (ffn_down on mmvq_i8 / mmvq_q6_i8 with DOWN_HALVES, on mmvq_i8v with VERIFY_HALVES_AT,
    on mmvq_q6_i8v with q6b.VERIFY_AT, the mixers' output on mmvq_i8b with OUT_HALVES; ops.matmul y2): y + y2
    against the whole launch on the same inputs (module.<switch> set to `on`, then `off`; tol: TOL_I8 where the
    whole launch is another kernel), then the norm that adds them (rmsnorm_of add=): the sum it stores and the
    normed rows against numpy's RMSNorm of the whole launch's output."""
    rows, cols = SHAPES_27B[name]
    t = num_tokens
    data = random_blocks(qtype, (rows, cols), rng)
    w = ops.upload_weight(dev, data, qtype, (rows, cols), name)
    act = ops.alloc_act(dev, t, cols, "x", precise=True)
    dev.upload(act.f32, rng.standard_normal((t, cols), dtype=np.float32))
    with patched(module, **{switch: on}):  # (the int8 copy as the halves' kernel needs it: at its counts)
        ops.act_f16(dev, act.f32, act, t, act.ld)
    res = dev.to_device(rng.standard_normal((t, rows), dtype=np.float32), "res")
    y, y2, total = (dev.alloc(4 * t * rows, what) for what in ("y", "y2", "sum"))
    variant = f"{name}.{qtype.name}.T{t}.halves{tag}"
    with patched(module, **{switch: off}):
        whole = _rerun(dev, w, act, y, res, t)
    with patched(module, **{switch: on}):
        if not ops.splits_in_halves(dev, w, act, t):
            raise AssertionError(f"{variant}: {name} does not go in halves with {switch} on")
        for buf in (y, y2, total):
            poison(dev, buf)
        ops.matmul(dev, w, act, y, t, rows, residual=res, y2=y2)
    a, b = dev.download(y, np.float32, (t, rows)), dev.download(y2, np.float32, (t, rows))
    compare(report, "matmul.same", variant, a + b, whole, tol)
    norm_w = rng.standard_normal(rows, dtype=np.float32)
    normed, norm_buf = ops.alloc_act(dev, t, rows, "normed", precise=True), dev.to_device(norm_w, "norm_w")
    ops.produce(dev, ops.rmsnorm_of(total, norm_buf, rows, 1e-6, out32=normed.f32, add=(y, y2)), normed, t)
    compare(report, "act.rmsnorm", variant + ".sum", dev.download(total, np.float32, (t, rows)), a + b, 1e-7)
    ref = whole / np.sqrt(np.mean(whole.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6) * norm_w
    compare(report, "act.rmsnorm", variant + ".normed", dev.download(normed.f32, np.float32, (t, rows)), ref, tol)
    for buf in [w.buf, res, y, y2, total, norm_buf, *act.buffers(), *normed.buffers()]:
        dev.memory.free(buf)


# Launch shapes timed beside the launcher's: (label, warps per block or None, row tiles a block walks). 4 warps
# (against its 5 at K = 5120) ran gate|up faster alone but not the pass (v12); 2 and 4 tiles give each warp 2-4 x
# the superblocks through one ring (not yet timed).
I8_SHAPE_TRIALS = (("w4", 4, 1), ("r2", None, 2), ("r4", None, 4))
# The tensor-copy form at one token: (label, warps or None, (instance shape, persistent grid)); the launcher's
# shape (i8b.DEFAULT_SHAPE) second.
I8B_TRIALS = (("i8b.s2n2", None, ((2, 2), False)), ("i8b.s3n2.p", None, ((3, 2), True)),
              ("i8b.s2n2.p", None, ((2, 2), True)), ("i8b.s1n4.p", None, ((1, 4), True)),
              ("i8b.s2n2.w4.p", 4, ((2, 2), True)), ("i8b.s2n2.w8.p", 8, ((2, 2), True)))
# OPENJET_BENCH_I8_SHAPES=1: time_i8 also times the other launch shapes of mmvq_i8 and mmvq_i8b (I8_SHAPE_TRIALS,
# I8B_TRIALS: measured in v12-v16); else each kernel in the launcher's shape.
I8_SHAPES_TIMED = os.environ.get("OPENJET_BENCH_I8_SHAPES") == "1"
# The tensor-copy form of 2-8 tokens: (label, warps or None, blocks an SM left free or None: the launcher's).
I8V_TRIALS = (("i8v", None, None), ("i8v.s1", None, 1), ("i8v.w8", 8, None), ("i8v.w4", 4, None),
              ("i8v.w10", 10, None), ("i8v.w12", 12, None), ("i8v.wide", None, None))
I8_TIMED = ("attn_q", "attn_qkv", "ffn_gate_up", "ffn_up", "ssm_out", "ffn_down", "attn_output")


def time_i8(dev: Device, report: Report, rng: np.random.Generator, token_counts=(1, 2, 3, 4, 5, 8)) -> None:
    """The int8 matmuls against the f16 kernel the table runs (precise) at each Q4_K shape of the 27B pass."""
    print("int8 matmul timings (us, GB/s): the f16 kernel the table picks (precise) | i8 ...", flush=True)
    saved = ops.I8_MATMUL, ops.I8_TOKENS
    try:
        for name in I8_TIMED:
            m = timed_matrix(dev, rng, name, Q.Q4_K, precise=True)
            for t in token_counts:
                cells = [_time_i8_trial(dev, report, m, name, t, *trial) for trial in _i8_trials(dev, t)]
                print(f"  {name:<11} T={t}  " + " | ".join(c for c in cells if c), flush=True)
            m.free(dev)
    finally:
        ops.set_i8(*saved)
        ops.I8_WARPS, ops.I8_TILES = None, 1


def _i8_trials(dev: Device, t: int) -> list[tuple[str, int | None, object]]:
    """What time_i8 runs at t tokens: (kind, warps, extra: row tiles, or the tensor-copy forms' settings)."""
    trials = [("f16", None, 1)]
    if t <= instances.I8_MAX_TOKENS:
        trials += [("i8", None, 1)] + (list(I8_SHAPE_TRIALS) if t <= 4 and I8_SHAPES_TIMED else [])
    if dev.info.arch >= i8b.MIN_ARCH:
        trials += (list(I8B_TRIALS) if I8_SHAPES_TIMED else [I8B_TRIALS[1]]) if t == 1 else list(I8V_TRIALS)
    return trials


def _time_i8_trial(dev: Device, report: Report, m: TimedMatrix, name: str, t: int, kind: str, warps: int | None,
                   extra) -> str:
    """One timed launch shape of time_i8; its table cell ("" where the launch would not take that kernel)."""
    on, is_bulk, is_verify = kind != "f16", kind.startswith("i8b"), kind.startswith("i8v")
    ops.set_i8(on, min(t, instances.I8_MAX_TOKENS) if on else None)
    ops.I8_WARPS, ops.I8_TILES = (None, 1) if is_bulk or is_verify else (warps, extra)
    label = (kind if kind.startswith("i8") else f"i8.{kind}") if on else \
        (ops.pipeline_kernel(Q.Q4_K, True, t) or "plain") + ".precise"
    shape, persist = extra if is_bulk else (None, None)
    with bulk_i8(is_bulk, shape, warps if is_bulk else None, persist), \
            verify_i8(is_verify, warps if is_verify else None, extra if is_verify else None, kind == "i8v.wide"):
        ops.act_f16(dev, m.act.f32, m.act, t, m.act.ld)  # the int8 copy for t tokens while on
        if is_verify and not i8b.verify_runs(dev, m.ws[0], t, m.act) or \
                kind == "i8v.wide" and not i8b.verify_wide(t):
            return ""
        timing = m.record(dev, report, t, "matmul", f"{name}.Q4_K.T{t}.{label}")
    return f"{label} {timing.median_ms * 1e3:6.1f} {timing.gbps:5.0f}"


Q6_I8_TIMED = ("ffn_down", "output", "attn_kv")
# (label, warps a block or None: the launcher's) of each int8 Q6_K launch time_q6_i8 runs. Rings of 3-4 stages,
# blocks of 2 warps (run 1346a1a) and each row split over two blocks (aad30b3; again with instances of their own,
# 2332c36, removed after it lost) were slower: bench/NOTES.md v21, Z21.
Q6_I8_TRIALS = (("i8q6", None), ("i8q6.w4", 4), ("i8q6.w8", 8))


@contextmanager
def q6_i8(on: bool, warps: int | None = None):
    """The int8 Q6_K matmul (mmvq_q6_i8: its tensor-copy form off, q6_i8_bulk turns it on inside) switched for the
    block (at every count it is built for), in blocks of `warps` (None: the launcher's); the int8 copy written up
    to 8 tokens; every setting restored after it."""
    saved = ops.Q6_I8, ops.Q6_I8_COUNTS, ops.I8_WARPS
    try:
        ops.Q6_I8, ops.I8_WARPS = on, warps
        ops.Q6_I8_COUNTS = frozenset(instances.Q6_I8_TOKENS)
        with i8_matmul(True, instances.I8_MAX_TOKENS), verify_i8(True), patched(q6b, ON=False):
            yield
    finally:
        ops.Q6_I8, ops.Q6_I8_COUNTS, ops.I8_WARPS = saved


@contextmanager
def q6_i8_bulk(on: bool, shape: tuple[int, int] | None = None):
    """The tensor-copy int8 Q6_K matmul of one token (engine/cuda/q6b.py) switched for the block at every row
    width, in `shape` (None: the launcher's); its settings restored after it."""
    with patched(q6b, ON=on, FORCED=on, SHAPE=shape or q6b.SHAPE, MIN_COLS=0):  # (on every GPU: SLOWER_ON's too)
        yield


def time_q6_i8(dev: Device, report: Report, rng: np.random.Generator, token_counts=(1, 2, 3, 4, 5)) -> None:
    """The int8 Q6_K matmul (Q6_I8_TRIALS: blocks of the launcher's, 4 and 8 warps; at one token its tensor-copy
    form too) against the f16 kernel the table runs (precise) at each Q6_K shape of the 27B pass."""
    print("int8 Q6_K matmul timings (us, GB/s): the f16 kernel the table picks (precise) | i8q6 ...", flush=True)
    for name in Q6_I8_TIMED:
        m = timed_matrix(dev, rng, name, Q.Q6_K, precise=True)
        for t in token_counts:
            cells = []
            for label, warps in (("f16", None),) + Q6_I8_TRIALS + (("i8q6b", None),):
                with q6_i8(label != "f16", warps=warps), q6_i8_bulk(label == "i8q6b"):
                    ops.act_f16(dev, m.act.f32, m.act, t, m.act.ld)
                    if label == "f16":  # Q6_I8 off: the f16 kernel the table picks
                        label = (ops.pipeline_kernel(Q.Q6_K, True, t) or "plain") + ".precise"
                    elif not ops.q6_i8_runs(dev, m.ws[0], t, m.act) or \
                            (label == "i8q6b") != q6b.runs(dev, m.ws[0], t):
                        continue
                    timing = m.record(dev, report, t, "matmul", f"{name}.Q6_K.T{t}.{label}")
                cells.append(f"{label} {timing.median_ms * 1e3:6.1f} {timing.gbps:5.0f}")
            print(f"  {name:<11} T={t}  " + " | ".join(cells), flush=True)
        m.free(dev)


TIMED = [("attn_q", Q.Q4_K), ("attn_qkv", Q.Q4_K), ("ffn_gate_up", Q.Q4_K), ("ffn_up", Q.Q4_K), ("ssm_out", Q.Q4_K),
         ("ffn_down", Q.Q4_K), ("ffn_down", Q.Q6_K), ("output", Q.Q6_K), ("attn_kv", Q.Q6_K), ("ssm_ab", Q.Q4_K),
         ("attn_q", Q.Q8_0), ("attn_q", Q.Q5_K)]


def _matmul_variants(qtype: Q, with_persist: bool) -> list[tuple[str, tuple, bool]]:
    """(label, ops.set_pipelined arguments, precise) of each timed variant: the persistent, cp.async-pipelined
    and plain kernels side by side where they exist, in fast and precise mode; the other types plain and fast."""
    kinds: list[tuple[str, tuple]] = []
    if with_persist and qtype in instances.PERSIST_QTYPES:
        kinds.append(("persist", (frozenset({qtype}), True, "persist")))
    if qtype in instances.STAGED_QTYPES:
        kinds.append(("cp", (frozenset({qtype}), True, "cp")))
        kinds += [(k, (frozenset({qtype}), True, k)) for k in ops.STAGED_TILES]
    plain = ("plain", (frozenset(), False, "cp"))
    if not kinds:
        return [(*plain, False)]
    return [(f"{label}{'.precise' if precise else ''}", state, precise) for precise in (False, True)
            for label, state in kinds + [plain]]


def time_matmuls(dev: Device, report: Report, rng: np.random.Generator,
                 token_counts: tuple[int, ...] = (1, 2, 5, 8), with_persist: bool = True) -> None:
    """Median time of each 27B-shape matmul per T and variant, rotating over weight copies bigger than the L2
    (with_persist False: the persistent kernel failed its checks, leave it out)."""
    print("matmul timings (us, GB/s)", flush=True)
    saved = ops.pipeline_state()
    try:
        for name, qtype in TIMED:
            _time_matmul(dev, report, rng, name, qtype, token_counts, with_persist)
    finally:
        ops.set_pipelined(*saved)


@dataclass(slots=True)
class TimedMatrix:
    """One 27B-shape matrix for timing: weight copies that together outgrow the L2 (so each launch streams from
    HBM), 8 tokens of random activations and an output."""

    rows: int
    cols: int
    nbytes: int  # one copy's device bytes
    ws: list[ops.DeviceWeight]
    act: ops.Act
    y: Buffer

    def time(self, dev: Device, num_tokens: int, producer: ops.Producer | None = None,
             y2: Buffer | None = None) -> tuple[float, float]:
        """Median and spread (ms) of one matmul of num_tokens rows (with its producer, where given; in halves,
        the second into y2, where given), rotating over the weight copies."""
        count = {"i": 0}

        def run():
            ops.matmul(dev, self.ws[count["i"] % len(self.ws)], self.act, self.y, num_tokens, self.rows,
                       producer=producer, y2=y2)
            count["i"] += 1

        return median_time(dev, run, reps=20, warmup=3, inner=len(self.ws) * 2)

    def record(self, dev: Device, report: Report, num_tokens: int, category: str, name: str,
               producer: ops.Producer | None = None) -> Timing:
        """time() as a Timing of this matrix's shape and bytes, added to the report."""
        med, spread = self.time(dev, num_tokens, producer)
        timing = Timing(category, name, f"{self.rows}x{self.cols}", med, spread, self.nbytes)
        report.timings.append(timing)
        return timing

    def free(self, dev: Device) -> None:
        act = self.act
        for buf in [w.buf for w in self.ws] + act.buffers() + [self.y]:
            dev.memory.free(buf)


def timed_matrix(dev: Device, rng: np.random.Generator, name: str, qtype: Q, precise: bool,
                 tokens: int = 8) -> TimedMatrix:
    """Fresh random weights of SHAPES_27B[name] in up to 8 copies (256 MB in all), activations for `tokens` tokens
    (with the residue when precise) in the act layout."""
    rows, cols = SHAPES_27B[name]
    nbytes = device_nbytes(qtype, (rows, cols))
    copies = max(1, min(8, (256 << 20) // max(nbytes, 1)))
    data = random_blocks(qtype, (rows, cols), rng)
    ws = [ops.upload_weight(dev, data, qtype, (rows, cols), f"{name}.{i}") for i in range(copies)]
    act = ops.alloc_act(dev, tokens, cols, "x", precise=precise)
    dev.upload(act.f32, rng.standard_normal((tokens, cols), dtype=np.float32))
    ops.act_f16(dev, act.f32, act, tokens, act.ld)
    return TimedMatrix(rows, cols, nbytes, ws, act, dev.alloc(4 * tokens * rows, "y"))


def _time_matmul(dev: Device, report: Report, rng: np.random.Generator, name: str, qtype: Q,
                 token_counts: tuple[int, ...], with_persist: bool) -> None:
    """One shape and type: every variant at every T, one line per T."""
    m = timed_matrix(dev, rng, name, qtype, precise=True)
    act = m.act
    lo = act.x16_lo
    for t in token_counts:
        cells = []
        variants = _matmul_variants(qtype, with_persist)
        if dev.info.arch >= PDL_MIN_ARCH and qtype in instances.STAGED_QTYPES:
            # back-to-back launches with programmatic dependent launch: what overlapping the tails saves
            variants.append(("cp.precise.pdl", (frozenset({qtype}), True, "cp"), True))
        for label, state, precise in variants:
            ops.set_pipelined(*state)
            dev.pdl = label.endswith(".pdl")
            act.x16_lo = lo if precise else None  # precise mode is the presence of the residue
            try:
                timing = m.record(dev, report, t, "matmul", f"{name}.{qtype.name}.T{t}.{label}")
            except Exception:  # one variant's failure (the new kernel's, most likely) must not end the timings
                report.notes.append(f"timing {name}.{qtype.name}.T{t}.{label} raised: {traceback.format_exc(limit=4)}")
                cells.append(f"{label} raised")
                raise_if_context_lost(dev)
                continue
            cells.append(f"{label} {timing.median_ms * 1e3:6.1f} {timing.gbps:5.0f}")
        print(f"  {name:<11} {qtype.name:<5} T={t}  " + " | ".join(cells), flush=True)
    dev.pdl = False
    act.x16_lo = lo
    m.free(dev)


def raise_if_context_lost(dev: Device) -> None:
    """After a failed launch: a kernel fault leaves the context unusable, so nothing later in this process can
    run; re-raise then (gpu_check runs each part in its own process), else carry on."""
    try:
        dev.synchronize()
    except CudaError:
        print("  the CUDA context is lost (a kernel fault): the rest of this part cannot run", flush=True)
        raise


def diagnose_matmul(dev: Device, report: Report, rng: np.random.Generator, qtype: Q, rows: int = 32,
                    cols: int = 512) -> None:
    """For a failing type: feed one-hot activations to read back each effective weight column, and report, per
    position, which reference column it matched and at what scale (finds layout and scale bugs in one run)."""
    data = random_blocks(qtype, (rows, cols), rng)
    ref = dequantize(data, qtype, (rows, cols)).astype(np.float64)  # [rows, cols]
    w = ops.upload_weight(dev, data, qtype, (rows, cols), "diag")
    act = ops.alloc_act(dev, 8, cols, "x")
    y = dev.alloc(4 * 8 * rows, "y")
    got = np.zeros((rows, cols))
    for k0 in range(0, cols, 8):
        eye = np.zeros((8, cols), np.float32)
        eye[np.arange(8), k0 + np.arange(8)] = 1.0
        dev.upload(act.f32, eye)
        ops.act_f16(dev, act.f32, act, 8, act.ld)
        ops.matmul(dev, w, act, y, 8, rows)
        got[:, k0 : k0 + 8] = dev.download(y, np.float32, (8, rows)).T
    lines = []
    for k in range(cols):
        err = np.linalg.norm(got[:, k] - ref[:, k]) / max(np.linalg.norm(ref[:, k]), 1e-30)
        if err > 1e-2:
            dists = np.linalg.norm(got[:, k : k + 1] - ref, axis=0)
            j = int(np.argmin(dists))
            ratio = float(np.dot(got[:, k], ref[:, j]) / max(np.dot(ref[:, j], ref[:, j]), 1e-30))
            lines.append(f"k={k}: err {err:.2e}, best match col {j} (scale {ratio:.3f})")
    summary = f"diagnose {qtype.name}: {len(lines)} of {cols} columns wrong"
    print("  " + summary, flush=True)
    for line in lines[:48]:
        print("    " + line, flush=True)
    report.notes.append(summary + ("; " + " | ".join(lines[:64]) if lines else ""))
    for buf in (w.buf, act.x16, act.sums, act.f32, y):
        dev.memory.free(buf)


def time_gemm(dev: Device, report: Report, rng: np.random.Generator, token_counts=(512, 2048)) -> None:
    """Prefill GEMM throughput at the 27B shapes (TFLOP/s over 2 * rows * cols * T), staged (gemm_cp) and plain."""
    print("gemm timings", flush=True)
    for name, qtype in (("ffn_up", Q.Q4_K), ("ffn_down", Q.Q6_K), ("attn_q", Q.Q4_K)):
        rows, cols = SHAPES_27B[name]
        data = random_blocks(qtype, (rows, cols), rng)
        w = ops.upload_weight(dev, data, qtype, (rows, cols), name)
        for t in token_counts:
            act = ops.alloc_act(dev, t, cols, "x")
            dev.upload(act.f32, rng.standard_normal((t, cols), dtype=np.float32))
            ops.act_f16(dev, act.f32, act, t, act.ld)
            y = dev.alloc(4 * t * rows, "y")
            for staged in (True, False):
                with gemm_staged(staged):
                    med, spread = median_time(dev, lambda: ops.matmul(dev, w, act, y, t, rows), reps=10, warmup=2,
                                              inner=2)
                tflops = 2.0 * rows * cols * t / (med * 1e-3) / 1e12
                kind = "cp" if staged and qtype in instances.GEMM_CP_QTYPES else "plain"
                report.timings.append(Timing("gemm", f"{name}.{qtype.name}.T{t}.{kind}", f"{rows}x{cols}", med,
                                             spread, device_nbytes(qtype, (rows, cols)), {"tflops": round(tflops, 1)}))
                print(f"  {name:<10} {qtype.name:<5} T={t:<5} {kind:<5} {med:8.3f} ms  {tflops:6.1f} TFLOP/s",
                      flush=True)
            for buf in act.buffers() + [y]:
                dev.memory.free(buf)
        dev.memory.free(w.buf)
