"""Kernel checks against the numpy reference at the real Qwen3.8-27B shapes, and their timings.

Every check draws fresh random inputs, poisons the output with NaN, runs the kernel and compares with the
float64/float32 numpy result by ||out - ref|| / ||ref||.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import TOL_F16, TOL_F32, Report, Timing, compare, median_time, poison
from engine.cuda import ops
from engine.cuda.device import Device
from engine.cuda.repack import device_nbytes, random_blocks
from engine.gguf.quants import dequantize

H, FFN, VOCAB = 5120, 17408, 248320
# (name, rows, cols) of the 27B model's matrices
SHAPES_27B = {
    "attn_q": (12288, H), "attn_kv": (1024, H), "attn_output": (H, 6144), "attn_qkv": (10240, H),
    "attn_gate": (6144, H), "ssm_ab": (48, H), "ssm_out": (H, 6144), "ffn_up": (FFN, H), "ffn_down": (H, FFN),
    "output": (VOCAB, H),
}
# which types each matrix is checked in (all types on one shape; the Q4_K_M mix on the others)
CHECKS = [("attn_q", qt) for qt in (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16)] + [
    ("attn_kv", Q.Q6_K), ("ssm_ab", Q.Q4_K), ("ffn_down", Q.Q6_K), ("ffn_up", Q.Q4_K), ("attn_output", Q.Q4_K),
    ("output", Q.Q6_K), ("ssm_ab", Q.F32),
]
# prefill-sized checks: the GEMM types through the tensor-core GEMM, the others through mmvq 8 tokens at a time
GEMM_CHECKS = [("attn_q", Q.Q4_K, 40), ("ffn_down", Q.Q6_K, 70), ("attn_q", Q.Q8_0, 33), ("attn_q", Q.Q5_K, 16),
               ("attn_q", Q.Q4_0, 20), ("attn_kv", Q.Q6_K, 129)]
REF_ROWS = 4096  # the reference recomputes at most this many (random) rows of a large matrix


def _reference_rows(data: np.ndarray, qtype: Q, shape: tuple[int, int], rows: np.ndarray) -> np.ndarray:
    """Dequantized rows of a tensor in float64."""
    sub = data[rows]
    return dequantize(sub, qtype, (len(rows), shape[1])).astype(np.float64)


def check_matmul(dev: Device, report: Report, rng: np.random.Generator, name: str, qtype: Q, num_tokens: int,
                 with_residual: bool = True, precise: bool = False) -> None:
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
    compare(report, "matmul", f"{qtype.name}.T{num_tokens}" + (".precise" if precise else ""), out[:, pick], ref, tol)
    unwritten = int(np.count_nonzero(np.isnan(out)))
    if unwritten:
        report.checks[-1].unwritten = unwritten
    for buf in (w.buf, act.x16, act.sums, act.f32, y, act.x16_lo, act.sums_lo) + ((res,) if res is not None else ()):
        if buf is not None:
            dev.memory.free(buf)


def run_matmul_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """All matmul checks: every type at attn_q, the Q4_K_M mix at the other shapes, several T."""
    print("matmul checks (27B shapes)", flush=True)
    for name, qtype in CHECKS:
        for num_tokens in (1, 5) if name != "output" else (1, 3):
            check_matmul(dev, report, rng, name, qtype, num_tokens)
    check_matmul(dev, report, rng, "attn_q", Q.Q4_K, 8)
    check_matmul(dev, report, rng, "attn_q", Q.Q4_K, 11)  # two launches: 8 + 3 rows
    for name, qtype, num_tokens in GEMM_CHECKS:
        check_matmul(dev, report, rng, name, qtype, num_tokens)
    for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # precise mode: exact K-quant weights, f32-level activations
        check_matmul(dev, report, rng, "attn_q", qtype, 3, precise=True)
    failing = {c.variant.split(".")[0] for c in report.checks if c.op == "matmul" and not c.ok}
    for name in sorted(failing):
        diagnose_matmul(dev, report, rng, Q[name])


def time_matmuls(dev: Device, report: Report, rng: np.random.Generator,
                 token_counts: tuple[int, ...] = (1, 2, 3, 5, 8)) -> None:
    """Median time of each 27B-shape matmul per T, rotating over weight copies bigger than the L2 together."""
    print("matmul timings", flush=True)
    mix = [("attn_q", Q.Q4_K), ("attn_qkv", Q.Q4_K), ("ffn_up", Q.Q4_K), ("ffn_down", Q.Q4_K),
           ("ffn_down", Q.Q6_K), ("output", Q.Q6_K), ("attn_kv", Q.Q6_K), ("ssm_ab", Q.Q4_K),
           ("attn_q", Q.Q8_0), ("attn_q", Q.Q5_K), ("attn_q", Q.F16)]
    for name, qtype in mix:
        rows, cols = SHAPES_27B[name]
        nbytes = device_nbytes(qtype, (rows, cols)) if qtype != Q.F16 else rows * cols * 2
        copies = max(1, min(8, (256 << 20) // max(nbytes, 1)))
        data = random_blocks(qtype, (rows, cols), rng)
        ws = [ops.upload_weight(dev, data, qtype, (rows, cols), f"{name}.{i}") for i in range(copies)]
        act = ops.alloc_act(dev, 8, cols, "x")
        dev.upload(act.f32, rng.standard_normal((8, cols), dtype=np.float32))
        ops.act_f16(dev, act.f32, act, 8, act.ld)
        y = dev.alloc(4 * 8 * rows, "y")
        for t in token_counts:
            state = {"i": 0}

            def run(t=t, state=state):
                """One matmul, rotating over the weight copies."""
                ops.matmul(dev, ws[state["i"] % copies], act, y, t, rows)
                state["i"] += 1

            med, spread = median_time(dev, run, reps=20, warmup=3, inner=copies * 2)
            timing = Timing("matmul", f"{name}.{qtype.name}.T{t}", f"{rows}x{cols}", med, spread, nbytes)
            report.timings.append(timing)
            print(f"  {name:<12} {qtype.name:<5} T={t}  {med * 1e3:8.1f} us  {timing.gbps:7.0f} GB/s", flush=True)
        for buf in [w.buf for w in ws] + [act.x16, act.sums, act.f32, y]:
            dev.memory.free(buf)


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
    """Prefill GEMM throughput at the 27B shapes (TFLOP/s over 2 * rows * cols * T)."""
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
            med, spread = median_time(dev, lambda: ops.matmul(dev, w, act, y, t, rows), reps=10, warmup=2, inner=2)
            tflops = 2.0 * rows * cols * t / (med * 1e-3) / 1e12
            report.timings.append(Timing("gemm", f"{name}.{qtype.name}.T{t}", f"{rows}x{cols}", med, spread,
                                         device_nbytes(qtype, (rows, cols)), {"tflops": round(tflops, 1)}))
            print(f"  {name:<10} {qtype.name:<5} T={t:<5} {med:8.3f} ms  {tflops:6.1f} TFLOP/s", flush=True)
            for buf in (act.x16, act.sums, act.f32, y):
                dev.memory.free(buf)
        dev.memory.free(w.buf)
