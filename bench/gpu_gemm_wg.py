"""The prefill matmul on warpgroup MMA (engine/cuda/kernels/gemm_wg.cu, sm_90a) against gemm_cp: each case checked
against x @ W^T in float64 and against gemm_cp on fresh random weights and activations, then timed (TFLOP/s over
2 rows cols T) at the 27B shapes, through ops.matmul with OPENJET_CUDA_GEMM_WG's modes (1: each superblock
drained, 2: overlapped, 3: the warp-specialised gemm_ws of kernels/gemm_ws.cu, 4: the same on a persistent grid).
Part `gemm_wg` of bench/gpu_check.py.

Issue 5 asks for prefill at 8,192 tokens at 2 x llama.cpp's (2,451 tok/s on the H200); the per-op path's 3,262
spends 66 % of its time in gemm_cp at ~220 TFLOP/s on mma.sync (bench/NOTES.md Y3): a GEMM 2 x faster is most of
the way there. The engine runs gemm_ws (mode 4) by default for matmuls of gemm.WS_AUTO_TOKENS tokens or more on
sm_90 (bench/NOTES.md Z17), the other modes only where OPENJET_CUDA_GEMM_WG asks. Its SwiGLU instances (gate | up
storing silu(gate) * up into ffn_down's input, gemm.launch_swiglu) are checked against the two launches they replace,
bit for bit, and against float64, then timed against them.
"""

from __future__ import annotations

import os

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import TOL_F16, Report, Timing, compare, median_time, patched, poison, record
from bench.gpu_kernels import SHAPES_27B, _reference_rows
from engine.cuda import gemm, ops
from engine.cuda.megakernel.formats import act_index
from engine.cuda.repack import device_nbytes, random_blocks

CASES = (("ffn_up", Q.Q4_K), ("ffn_down", Q.Q6_K), ("ffn_down", Q.Q4_K), ("attn_q", Q.Q4_K))
EDGES = (("odd_rows", Q.Q4_K, 300), ("odd_rows", Q.Q6_K, 77))  # a partial row tile, partial token tiles: checked
MODES = {"wg": 1, "wgo": 2, "wgws": 3, "wgwsp": 4}  # OPENJET_CUDA_GEMM_WG
MODES_ENV = "OPENJET_BENCH_GEMM_MODES"  # a comma list of MODES' names to run beside gemm_cp (all when unset)
TOL_SAME = 2e-3  # against gemm_cp: the same f16 fragments, f32 sums in another order
REF_ROWS = 64
# gemm_ws with SwiGLU behind: (ffn width f, K, token counts), W gate | up of 2 f rows; the small one at a partial
# token tile and group
SWIGLU_CASES = ((17408, 5120, (2048, 8192)), (512, 768, (300,)))


def _modes() -> dict[str, int]:
    """MODES, or those MODES_ENV names (a name it does not know is an error naming it)."""
    names = [n for n in os.environ.get(MODES_ENV, "").split(",") if n]
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ValueError(f"{MODES_ENV}: unknown mode(s) {unknown}; expected some of {sorted(MODES)}")
    return {n: MODES[n] for n in names} if names else MODES


def gemm_wg(mode: int):
    """ops.matmul's prefill GEMM: gemm_wg in this mode (0: gemm_cp), and as it was again after."""
    return patched(gemm, WG=mode)


def run_gemm_wg(dev, report: Report, rng: np.random.Generator, token_counts=(512, 2048, 8192)) -> None:
    """Every case at every T: correctness first (a wrong kernel is not timed), then gemm_cp and gemm_wg timed."""
    with gemm_wg(1):
        if gemm.wg_instance(dev.info.arch, Q.Q4_K, 512, 256, False) is None:
            report.notes.append(f"gemm_wg: sm_{dev.info.arch} has no build of it (sm_90a only)")
            return
    print("gemm_wg against gemm_cp (ms, TFLOP/s)", flush=True)
    for name, qtype, counts in [(n, q, token_counts) for n, q in CASES] + [(n, q, (t,)) for n, q, t in EDGES]:
        rows, cols = SHAPES_27B[name]
        data = random_blocks(qtype, (rows, cols), rng)
        w = ops.upload_weight(dev, data, qtype, (rows, cols), name)
        pick = np.sort(rng.choice(rows, size=min(rows, REF_ROWS), replace=False))
        ref_w = _reference_rows(data, qtype, (rows, cols), pick).T
        for t in counts:
            _case(dev, report, rng, w, qtype, name, rows, cols, t, pick, ref_w)
        dev.memory.free(w.buf)
    print("gemm_ws with SwiGLU behind against gemm_ws + act_swiglu (ms)", flush=True)
    with gemm_wg(gemm.WS_PERSISTENT):
        for f, cols, counts in SWIGLU_CASES:
            data = random_blocks(Q.Q4_K, (2 * f, cols), rng)
            w = ops.upload_weight(dev, data, Q.Q4_K, (2 * f, cols), "ffn_gate_up")
            pick = np.sort(rng.choice(f, size=min(f, REF_ROWS), replace=False))
            ref_w = _reference_rows(data, Q.Q4_K, (2 * f, cols), np.concatenate([pick, f + pick])).T
            for t in counts:
                _swiglu_case(dev, report, rng, w, f, cols, t, pick, ref_w)
            dev.memory.free(w.buf)


def _case(dev, report: Report, rng: np.random.Generator, w, qtype: Q, name: str, rows: int, cols: int, t: int,
          pick: np.ndarray, ref_w: np.ndarray) -> None:
    """One matrix at t tokens: gemm_cp, then each gemm_wg mode checked against float64 and gemm_cp, then timed."""
    act = ops.alloc_act(dev, t, cols, "x")
    x = rng.standard_normal((t, cols), dtype=np.float32)
    dev.upload(act.f32, x)
    ops.act_f16(dev, act.f32, act, t, act.ld)
    res = dev.to_device(rng.standard_normal((t, rows), dtype=np.float32), "res")
    y = dev.alloc(4 * t * rows, "y")
    ref = x.astype(np.float64) @ ref_w + dev.download(res, np.float32, (t, rows))[:, pick]
    variant = f"{name}.{qtype.name}.T{t}"
    cells, out_cp = [f"{variant:<24}"], None
    for kind, mode in {"cp": 0, **_modes()}.items():
        with gemm_wg(mode):
            poison(dev, y)
            ops.matmul(dev, w, act, y, t, rows, residual=res)
            out = dev.download(y, np.float32, (t, rows))
            if mode:
                ok = compare(report, f"gemm_{kind}", variant, out[:, pick], ref, TOL_F16).ok
                ok = compare(report, f"gemm_{kind}.same", variant + ".vs_cp", out, out_cp, TOL_SAME).ok and ok
                if not ok:  # a wrong kernel is not timed
                    cells.append(f"{kind} WRONG")
                    continue
            else:
                out_cp = out
            med, spread = median_time(dev, lambda: ops.matmul(dev, w, act, y, t, rows), reps=10, warmup=2, inner=2)
        tflops = 2.0 * rows * cols * t / (med * 1e-3) / 1e12
        report.timings.append(Timing("gemm_wg", f"{variant}.{kind}", f"{rows}x{cols}", med, spread,
                                     device_nbytes(qtype, (rows, cols)), {"tflops": round(tflops, 1)}))
        cells.append(f"{kind} {med:7.3f} ms {tflops:6.1f}")
    print("  " + " | ".join(cells), flush=True)
    for buf in act.buffers() + [res, y]:
        dev.memory.free(buf)


def _swiglu_case(dev, report: Report, rng: np.random.Generator, w, f: int, cols: int, t: int, pick: np.ndarray,
                 ref_w: np.ndarray) -> None:
    """gate | up at t tokens: the fused launch's act values equal to gemm_ws + act_swiglu's bit for bit (the same
    sums, the same SwiGLU arithmetic), within TOL_F16 of float64 (f16 values), every slot of its groups written
    (poisoned first), then both timed."""
    variant = f"swiglu.{f}x{cols}.T{t}"
    act = ops.alloc_act(dev, t, cols, "x")
    # random Q4_K rows give sums of ~130 (up to ~600) at K = 5,120 for unit activations: their products would pass
    # f16's 65,504 (inf in both forms alike); a 16th keeps them within it
    x = rng.standard_normal((t, cols), dtype=np.float32) / 16
    dev.upload(act.f32, x)
    ops.act_f16(dev, act.f32, act, t, act.ld)
    outs = [ops.alloc_act(dev, t, f, name) for name in ("swiglu.fused", "swiglu.apart")]
    for out in outs:
        out.gemm_only = True  # no f16 residue: what the fused launch writes
    y = dev.alloc(4 * t * 2 * f, "y")
    fused, apart = outs

    def two_launches() -> None:
        ops.matmul(dev, w, act, y, t, 2 * f)
        ops.act_swiglu(dev, y, y.view(4 * f), apart, t, 2 * f)

    groups = (t + 7) // 8
    n = groups * fused.num_superblocks * 2048
    poison(dev, fused.x16)
    gemm.launch_swiglu(dev, w, act.x16, fused.x16, t)
    two_launches()
    got, want = (dev.download(o.x16, np.uint16, (n,)) for o in outs)
    record(report, "gemm_swiglu.same", variant, f"{groups} groups", float(np.count_nonzero(got != want)), 0.5)
    values = got.view(np.float16)[act_index(f)[:, :f] + (np.arange(groups) * fused.num_superblocks * 2048)[:, None,
                                                                                                          None]]
    values = values.reshape(groups * 8, f)[:t].astype(np.float64)
    sums = x.astype(np.float64) @ ref_w
    gate, up = sums[:, :len(pick)], sums[:, len(pick):]
    compare(report, "gemm_swiglu", variant, values[:, pick], gate / (1.0 + np.exp(-gate)) * up, TOL_F16)
    cells = [f"{variant:<24}"]
    for kind, fn in (("apart", two_launches), ("fused", lambda: gemm.launch_swiglu(dev, w, act.x16, fused.x16, t))):
        med, spread = median_time(dev, fn, reps=10, warmup=2, inner=2)
        report.timings.append(Timing("gemm_swiglu", f"{variant}.{kind}", f"{2 * f}x{cols}", med, spread,
                                     device_nbytes(Q.Q4_K, (2 * f, cols)),
                                     {"tflops": round(2.0 * 2 * f * cols * t / (med * 1e-3) / 1e12, 1)}))
        cells.append(f"{kind} {med:7.3f} ms")
    print("  " + " | ".join(cells), flush=True)
    for buf in act.buffers() + fused.buffers() + apart.buffers() + [y]:
        dev.memory.free(buf)
