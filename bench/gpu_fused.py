"""The one-token int8 matmul with its producer fused in front (kernels/mmvq_i8b.cu, engine/cuda/i8b.py fuses):
checks against the float64 reference of producer and matmul and against the same two launched apart, then the
time of both forms at the 27B shapes where the pass fuses them.

Every check draws fresh random inputs (never zeros), poisons the output with NaN, and names the mode and shape.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import Report, compare, poison, record
from bench.gpu_kernels import REF_ROWS, SHAPES_27B, TimedMatrix, _reference_rows, bulk_i8, i8_matmul, timed_matrix
from engine.cuda import i8b, instances, ops
from engine.cuda.device import Buffer, Device
from engine.cuda.repack import random_blocks

EPS = 1e-6
HEAD = 128  # the DeltaNet's value head at 27B
# (matrix, producer mode): the pass's fused pairs at 27B (ffn_norm -> gate|up, attn_norm -> q | k | v where one
# type, the gated norm -> ssm_out, the attention's output -> attn_output), and odd_rows (3 superblocks: more warps
# than a row fills, a partial tile) in every mode
FUSED_CHECKS = [("ffn_gate_up", "rmsnorm"), ("attn_qkv", "rmsnorm"), ("ssm_out", "gatednorm"),
                ("attn_output", "plain")] + [("odd_rows", mode) for mode in instances.I8B_FUSED_MODES]
# Against the float64 reference: LEVEL_ERROR_MARGIN x the error the two int8 levels predict for these values (each
# rounds to a step of its superblock's largest / (127 x 254): the gated norm's heavier tails, silu(z) x w, give
# ~1e-4 where gaussian rows give ~3e-5). A lost low level is ~250 x that, a lost sub-block ~1e-2.
LEVEL_ERROR_MARGIN = 4.0
# Fused and launched apart, both from the same inputs: the norms' sums are summed in another order, so values at a
# rounding edge (~1e-3 of them) move one low-level step: ~0.1 x level_error (7e-6 seen on odd_rows' gated norm,
# 006b145); the bound is TOL_APART or half the level error, whichever is larger. A lost sub-block sum or scale
# is 1e-3 or more.
TOL_APART = 1e-5
FUSED_TIMED = FUSED_CHECKS[:4]
# the other instance shapes (S superblocks a stage, NS stages a warp) on a partial tile and on ring turns of the
# two modes with reductions
FUSED_SHAPE_CHECKS = [(name, mode, shape) for shape in instances.I8B_FUSED_SHAPES if shape != i8b.SHAPE
                      for name, mode in (("odd_rows", "gatednorm"), ("ffn_gate_up", "rmsnorm"))]


@dataclass(slots=True)
class ProducerInputs:
    """A producer's random inputs on the device and in float64 on the host."""

    producer: ops.Producer
    values: np.ndarray  # what the producer makes, float64 [cols]
    buffers: list[Buffer]


def producer_inputs(dev: Device, rng: np.random.Generator, mode: str, cols: int) -> ProducerInputs:
    """Fresh inputs of one token for `mode` and the float64 values it should produce from them."""
    x = (rng.standard_normal(cols) * rng.uniform(0.5, 3.0)).astype(np.float32)
    xb = dev.to_device(x, "x")
    x64 = x.astype(np.float64)
    if mode == "plain":
        return ProducerInputs(ops.plain_of(xb, cols), x64, [xb])
    if mode == "rmsnorm":
        w = (1.0 + 0.2 * rng.standard_normal(cols)).astype(np.float32)
        wb = dev.to_device(w, "norm")
        values = x64 / np.sqrt(np.mean(x64 * x64) + EPS) * w
        return ProducerInputs(ops.rmsnorm_of(xb, wb, cols, EPS), values, [xb, wb])
    assert mode == "gatednorm", mode
    head = HEAD if cols % HEAD == 0 else 32
    z = rng.standard_normal(cols).astype(np.float32)
    w = (1.0 + 0.2 * rng.standard_normal(head)).astype(np.float32)
    zb, wb = dev.to_device(z, "z"), dev.to_device(w, "norm")
    heads = x64.reshape(-1, head)
    normed = heads / np.sqrt(np.mean(heads * heads, axis=1, keepdims=True) + EPS) * w
    z64 = z.astype(np.float64)
    values = normed.reshape(-1) * z64 / (1.0 + np.exp(-z64))
    return ProducerInputs(ops.gatednorm_of(xb, zb, wb, head, cols, cols, EPS), values, [xb, zb, wb])


def level_error(values: np.ndarray) -> float:
    """The relative error of a product with random weight rows that the two-level int8 form of `values` (float64,
    whole superblocks) predicts: each value off by a uniform rounding of its superblock's low-level step."""
    blocks = values.reshape(-1, 256)
    step = np.abs(blocks).max(axis=1) / (127.0 * 254.0)
    return float(np.sqrt(np.sum(256 * step * step / 12.0) / np.sum(values * values)))


@contextmanager
def fusing(on: bool):
    """i8b.FUSE set for the block (the one-token int8 matmul on at every width, in blocks of mmvq_i8's own warp
    count, which leaves a warp few enough superblocks to fuse), restored after it."""
    saved, saved_warps = i8b.FUSE, ops.I8_WARPS_AT
    try:
        i8b.FUSE, ops.I8_WARPS_AT = on, {}
        with i8_matmul(True), bulk_i8(True):
            yield
    finally:
        i8b.FUSE, ops.I8_WARPS_AT = saved, saved_warps


def check_fused(dev: Device, report: Report, rng: np.random.Generator, name: str, mode: str,
                shape: tuple[int, int] | None = None) -> None:
    """One fused launch (in instance shape `shape`, default i8b.SHAPE) against the float64 reference, then against
    producer and matmul launched apart."""
    saved = i8b.SHAPE
    try:
        i8b.SHAPE = shape or saved
        _check_fused(dev, report, rng, name, mode, "" if shape is None else f".s{shape[0]}n{shape[1]}")
    finally:
        i8b.SHAPE = saved


def _check_fused(dev: Device, report: Report, rng: np.random.Generator, name: str, mode: str, tag: str) -> None:
    rows, cols = SHAPES_27B[name]
    data = random_blocks(Q.Q4_K, (rows, cols), rng)
    w = ops.upload_weight(dev, data, Q.Q4_K, (rows, cols), name)
    act = ops.alloc_act(dev, 1, cols, "act", precise=True)
    inputs = producer_inputs(dev, rng, mode, cols)
    res = dev.to_device(rng.standard_normal(rows).astype(np.float32), "res")
    y = dev.alloc(4 * rows, "y")
    variant = f"{name}.{mode}{tag}"

    def run(on: bool) -> np.ndarray:
        poison(dev, y)
        with fusing(on):
            if i8b.fuses(dev, w, 1, inputs.producer) != on:
                raise AssertionError(f"{variant}: i8b.fuses is {not on} with FUSE {on}")
            ops.matmul(dev, w, act, y, 1, rows, residual=res, producer=inputs.producer)
        return dev.download(y, np.float32, (rows,))

    try:
        fused = run(True)
        pick = np.sort(rng.choice(rows, size=min(rows, REF_ROWS), replace=False))
        ref = _reference_rows(data, Q.Q4_K, (rows, cols), pick) @ inputs.values
        ref += dev.download(res, np.float32, (rows,))[pick]
        compare(report, "matmul.fused", variant, fused[pick], ref, LEVEL_ERROR_MARGIN * level_error(inputs.values))
        unwritten = int(np.count_nonzero(np.isnan(fused)))
        if unwritten:
            report.checks[-1].unwritten = unwritten
        compare(report, "matmul.fused", variant + ".vs_apart", fused, run(False),
                max(TOL_APART, 0.5 * level_error(inputs.values)))
    finally:
        for buf in [w.buf, y, res, *act.buffers(), *inputs.buffers]:
            dev.memory.free(buf)


def run_fused_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """FUSED_CHECKS, on GPUs with the tensor-copy matmul (sm_90+); elsewhere one record says it was not run."""
    if dev.info.arch < i8b.MIN_ARCH:
        record(report, "matmul.fused", f"not run on sm_{dev.info.arch}", "-", 0.0, 1.0)
        return
    print("fused producer checks", flush=True)
    for name, mode in FUSED_CHECKS:
        check_fused(dev, report, rng, name, mode)
    for name, mode, shape in FUSED_SHAPE_CHECKS:
        check_fused(dev, report, rng, name, mode, shape)


def time_fused(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """Producer then matmul (two launches) against the fused launch in every instance shape (S superblocks a
    stage, NS stages a warp), with the default spare blocks and with every SM's blocks (i8b.SPARE_PER_SM 0), at
    the pass's 27B pairs (us)."""
    if dev.info.arch < i8b.MIN_ARCH:
        return
    print("fused producer timings (us): producer + mmvq_i8b | fused sSnNS (spare default / none)", flush=True)
    saved_spare, saved_shape = i8b.SPARE_PER_SM, i8b.SHAPE
    for name, mode in FUSED_TIMED:
        m: TimedMatrix = timed_matrix(dev, rng, name, Q.Q4_K, precise=True)
        inputs = producer_inputs(dev, rng, mode, m.cols)
        cells = []
        trials = [(False, saved_shape, saved_spare)] + [(True, shape, spare) for shape in instances.I8B_FUSED_SHAPES
                                                        for spare in (saved_spare, 0)]
        try:
            for on, shape, spare in trials:
                i8b.SPARE_PER_SM, i8b.SHAPE = spare, shape
                with fusing(on):
                    label = f"fused.s{shape[0]}n{shape[1]}" if on else "apart"
                    label += "" if spare == saved_spare else f".spare{spare}"
                    timing = m.record(dev, report, 1, "matmul", f"{name}.Q4_K.T1.{mode}.{label}",
                                      producer=inputs.producer)
                cells.append(f"{label} {timing.median_ms * 1e3:5.1f}")
        finally:
            i8b.SPARE_PER_SM, i8b.SHAPE = saved_spare, saved_shape
            m.free(dev)
            for buf in inputs.buffers:
                dev.memory.free(buf)
        print(f"  {name:<11} {mode:<9} " + " | ".join(cells), flush=True)
