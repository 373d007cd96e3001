"""Checks of the persistent stream-K mmvq (kernels/mmvq_persist.cu, bench/NOTES.md v8) on the GPU machine.

At the 27B shapes and the edge shapes of its split, for T = 1, 3, 4, 5, 8 (and 11: two launches) in fast and
precise mode: against the float64 reference on fresh random inputs with the output poisoned first; against
mmvq_cp (the plain kernel for Q5_K, which has no cp instance) on the same inputs; against itself run again (its
sums are in a fixed order, so any difference is a race); and the per-tile counts left zero after every launch.
Then whole tiny models through it. Any failure, exceptions included, is a failed check, not an aborted run.
"""

from __future__ import annotations

import tempfile
import traceback
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import TOL_F16, TOL_F32, Check, Report, compare, poison, record
from bench.gpu_kernels import REF_ROWS, SHAPES_27B, TOL_SAME_MATH, _reference_rows, raise_if_context_lost
from engine.cuda import instances, ops, persist
from engine.cuda.device import Device
from engine.cuda.repack import random_blocks

EDGE_SHAPES = {"tiny": (16, 256), "few_units": (40, 512)}  # one unit; fewer units than one block's rings
# (matrix, type): the 27B matrices the brief names, Q5_K once, the small and odd ones of the split
CHECKED = [("attn_q", Q.Q4_K), ("ffn_gate_up", Q.Q4_K), ("ffn_up", Q.Q4_K), ("ffn_down", Q.Q4_K),
           ("ffn_down", Q.Q6_K), ("ssm_out", Q.Q4_K), ("output", Q.Q6_K), ("attn_q", Q.Q5_K),
           ("attn_kv", Q.Q6_K), ("ssm_ab", Q.Q4_K), ("odd_rows", Q.Q4_K), ("odd_rows", Q.Q5_K),
           ("odd_rows", Q.Q6_K), ("tiny", Q.Q4_K), ("few_units", Q.Q6_K)]
TOKENS = (1, 3, 4, 5, 8)
PERSIST = (frozenset(instances.PERSIST_QTYPES), True, "persist")
MODEL_ARCHS = (("qwen35", False), ("qwen35", True), ("qwen2", False))  # qwen2: the q/k/v biases


class _Inputs:
    """One matrix on the device with its float64 reference rows; activations and outputs for up to 11 tokens."""

    def __init__(self, dev: Device, rng: np.random.Generator, name: str, qtype: Q):
        self.rows, self.cols = SHAPES_27B.get(name) or EDGE_SHAPES[name]
        data = random_blocks(qtype, (self.rows, self.cols), rng)
        self.dev, self.w = dev, ops.upload_weight(dev, data, qtype, (self.rows, self.cols), name)
        self.pick = np.sort(rng.choice(self.rows, size=min(self.rows, REF_ROWS), replace=False))
        self.ref_w = _reference_rows(data, qtype, (self.rows, self.cols), self.pick)  # [picked, cols] f64
        self.act = ops.alloc_act(dev, 11, self.cols, "x", precise=True)
        self.lo = self.act.x16_lo
        self.y = dev.alloc(4 * 11 * self.rows, "y")
        self.res = dev.alloc(4 * 11 * self.rows, "res")
        self.bias = dev.to_device(rng.standard_normal(self.rows, dtype=np.float32), "bias")

    def free(self) -> None:
        """Release every buffer."""
        self.act.x16_lo = self.lo
        for buf in [self.w.buf, *self.act.buffers(), self.y, self.res, self.bias]:
            self.dev.memory.free(buf)


def _run(inp: _Inputs, kernel: tuple, t: int, in_place: bool, with_bias: bool) -> np.ndarray:
    """One matmul with the given pipeline choice into the poisoned y (residual: res, or y itself holding it)."""
    dev, saved = inp.dev, ops.pipeline_state()
    if in_place:
        dev.copy(inp.y, inp.res, 4 * t * inp.rows)
    else:
        poison(dev, inp.y)
    try:
        ops.set_pipelined(*kernel)
        ops.matmul(dev, inp.w, inp.act, inp.y, t, inp.rows, bias=inp.bias if with_bias else None,
                   residual=inp.y if in_place else inp.res)
    finally:
        ops.set_pipelined(*saved)
    return dev.download(inp.y, np.float32, (t, inp.rows))


def _baseline(qtype: Q) -> tuple:
    """What persist is compared with on the same inputs: mmvq_cp where it exists, else the plain kernel."""
    if qtype in instances.STAGED_QTYPES:
        return frozenset({qtype}), True, "cp"
    return frozenset(), False, "cp"


def _check_case(inp: _Inputs, report: Report, rng: np.random.Generator, t: int, precise: bool, in_place: bool,
                with_bias: bool, tag: str) -> None:
    """One T and mode: fresh activations and residual, then the four comparisons."""
    dev = inp.dev
    x = rng.standard_normal((t, inp.cols), dtype=np.float32)
    res = rng.standard_normal((t, inp.rows), dtype=np.float32)
    dev.upload(inp.act.f32, x)
    inp.act.x16_lo = inp.lo if precise else None  # precise mode is the presence of the residue
    ops.act_f16(dev, inp.act.f32, inp.act, t, inp.act.ld)
    dev.upload(inp.res, res)
    out = _run(inp, PERSIST, t, in_place, with_bias)
    ref = x.astype(np.float64) @ inp.ref_w.T + res[:, inp.pick]
    if with_bias:
        ref += dev.download(inp.bias, np.float32, (inp.rows,))[inp.pick]
    variant = f"{inp.w.qtype.name}.T{t}{'.precise' if precise else ''}{tag}.persist"
    compare(report, "matmul.persist", f"{inp.w.name}.{variant}", out[:, inp.pick], ref, TOL_F32 if precise else TOL_F16)
    report.checks[-1].unwritten = int(np.count_nonzero(np.isnan(out)))
    base = _run(inp, _baseline(inp.w.qtype), t, in_place, with_bias)
    compare(report, "matmul.persist.same", f"{inp.w.name}.{variant}", out, base, TOL_SAME_MATH)
    again = _run(inp, PERSIST, t, in_place, with_bias)
    record(report, "matmul.persist.repeat", f"{inp.w.name}.{variant}", "max |diff|",
           float(np.abs(again - out).max()) if np.isfinite(again).all() else float("inf"), 1e-30)


def _check_counts_reset(dev: Device, report: Report) -> None:
    """Every launch leaves the per-tile counts at zero (a wrong count of a tile's warps leaves some behind)."""
    state = persist._SCRATCH.get(dev)
    if state is None or state.counts is None:
        return
    counts = dev.download(state.counts, np.uint32, (state.counts.nbytes // 4,))
    record(report, "matmul.persist.counts", "reset", f"{counts.size} tiles", float(np.count_nonzero(counts)), 0.5)


def _failed(report: Report, what: str, exc: BaseException) -> None:
    """An exception of a check, recorded as a failed check with its traceback in the notes."""
    report.checks.append(Check("matmul.persist", what, "raised", float("inf"), 0.0))
    report.notes.append(f"persist {what} raised: {traceback.format_exc(limit=6)}")
    print(f"  FAIL matmul.persist {what} raised {type(exc).__name__}: {exc}", flush=True)


def run_persist_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """Every CHECKED matrix at every T and mode; a CUDA fault (the context is lost) ends the part as failed."""
    print("persistent mmvq checks", flush=True)
    for name, qtype in CHECKED:
        inp = _Inputs(dev, rng, name, qtype)
        try:
            for t in TOKENS + ((11,) if name == "attn_q" else ()):
                for precise in (False, True):
                    _check_case(inp, report, rng, t, precise, False, False, "")
            if name == "attn_q":  # the model's epilogues: a bias, and the residual added in place
                for t in (3, 5):
                    _check_case(inp, report, rng, t, True, True, True, ".bias.inplace")
        except Exception as exc:  # a bug in one matrix's cases must not hide the others'
            _failed(report, f"{name}.{qtype.name}", exc)
            raise_if_context_lost(dev)
        finally:
            inp.free()
    _check_counts_reset(dev, report)
    schedule_notes(dev, report)
    run_model_checks(report, rng)


def run_model_checks(report: Report, rng: np.random.Generator) -> None:
    """Tiny generated models through the persistent kernel against the reference (bench/gpu_models.py checks)."""
    from bench.gpu_models import NUM_GREEDY, compare_backend, greedy
    from engine.cuda.backend import CudaBackend
    from engine.gguf.testmodel import write_test_model
    from engine.reference.backend import ReferenceBackend

    print("whole tiny models through the persistent mmvq", flush=True)
    saved = ops.pipeline_state()
    ops.set_pipelined(*PERSIST)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            refs = {}
            for arch, precise in MODEL_ARCHS:
                if arch not in refs:
                    path = write_test_model(Path(tmp) / f"{arch}.gguf", arch, seed=int(rng.integers(1 << 30)))
                    ref = ReferenceBackend.from_gguf(path, context_size=1024)
                    prompt = [int(t) for t in rng.integers(0, ref.vocab_size, size=24)]
                    refs[arch] = (path, ref, prompt, *greedy(ref, prompt, NUM_GREEDY))
                path, ref, prompt, ref_tokens, ref_rows = refs[arch]
                cuda = CudaBackend.from_gguf(path, context_size=1024, max_tokens=64, precise=precise)
                try:
                    compare_backend(report, f"{arch}{'.precise' if precise else ''}.persist", ref, cuda, prompt,
                                    ref_tokens, ref_rows, rng)
                finally:
                    cuda.close()
    finally:
        ops.set_pipelined(*saved)


def schedule_notes(dev: Device, report: Report) -> None:
    """Per 27B matrix: the launch this device gets (occupancy included), the units a warp streams and the most
    warps summing one tile (context for the timings)."""
    for name, qtype in CHECKED[:8]:
        rows, cols = SHAPES_27B[name]
        tiles, nb = (rows + 15) // 16, cols // 256
        kernel = dev.kernel(f"mmvq_{instances.qtype_tag(qtype)}_persist")
        blocks, warps, smem = persist.plan(dev, kernel, *ops.STAGE_SHAPE[qtype], rows, cols)
        num_warps = blocks * warps
        widest = max(len(persist.share_slots(t, tiles, nb, num_warps)) for t in range(0, tiles, max(1, tiles // 64)))
        line = (f"persist {name} {qtype.name}: {blocks} blocks x {warps} warps ({smem} B shared each), "
                f"{tiles * nb / num_warps:.1f} units a warp, up to {widest} warps a tile")
        report.notes.append(line)
        print("  " + line, flush=True)
