"""The prefill matmul on warpgroup MMA (bench/kernels/gemm_wg.cu, sm_90a) against the engine's gemm_cp: checked
against x @ W^T in float64 on fresh random weights and activations, then timed (TFLOP/s over 2 rows cols T) at the
27B shapes. Part `gemm_wg` of bench/gpu_check.py, or alone:

  python bench/gpu_gemm_wg.py [--out DIR] [--tokens 512,2048,8192]

Issue 5 asks for prefill at 8,192 tokens at 2 x llama.cpp's (2,451 tok/s on the H200); the per-op path's 3,262
spends 66 % of its time in gemm_cp at ~220 TFLOP/s on mma.sync (bench/NOTES.md): a GEMM 2 x faster is most of the
way there. Nothing else calls gemm_wg until it has passed here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

from bench.gpu_common import TOL_F16, Report, Timing, compare, machine_info, median_time, poison  # noqa: E402
from bench.gpu_kernels import SHAPES_27B, _reference_rows  # noqa: E402
from engine.cuda import ops  # noqa: E402
from engine.cuda.repack import device_nbytes, random_blocks  # noqa: E402

SOURCE = Path(__file__).resolve().parent / "kernels" / "gemm_wg.cu"
ROWS, TOKENS, THREADS = 128, 128, 256  # gemm_wg.cu: WG_ROWS, WG_TOKENS, WG_WARPS * 32
SMEM = 2 * (8 * 4096 + 65536) + 128  # gemm_wg.cu WG_SMEM_BYTES: two slots of 8 weight stages and 64 KB of B
QTYPES = {Q.Q4_K: 12, Q.Q6_K: 14}  # ggml type ids: the kernel's instances, each drained and overlapped
KINDS = {"wg": "false", "wgo": "true"}  # gemm_wg<QT, OVERLAP>
CASES = (("ffn_up", Q.Q4_K), ("ffn_down", Q.Q6_K), ("ffn_down", Q.Q4_K), ("attn_q", Q.Q4_K))
EDGES = (("odd_rows", Q.Q4_K, 300), ("odd_rows", Q.Q6_K, 77))  # a partial row tile, partial token tiles: checked
TOL_SAME = 2e-3  # against gemm_cp: the same f16 fragments, f32 sums in another order
REF_ROWS = 64


def compile_gemm_wg(arch: int):
    """Both instances for sm_<arch>a, through the kernel cache (bench/precompile.py fills it ahead)."""
    from engine.cuda import nvrtc

    exprs = tuple(f"gemm_wg<{t}, {o}>" for t in QTYPES.values() for o in KINDS.values())
    return nvrtc.compile_cached(SOURCE, arch, exprs, (f"-arch=sm_{arch}a",))


def launch(dev, kernel, w, act, y, residual, num_tokens: int) -> None:
    """y[T, rows] = act @ W^T (+ residual), one block per 128 rows x 128 tokens (row tiles along x)."""
    grid = ((w.rows + ROWS - 1) // ROWS, (num_tokens + TOKENS - 1) // TOKENS)
    dev.launch(kernel, grid, THREADS, [w.buf, act.x16, y, residual, w.rows, w.cols, num_tokens, w.rows], smem=SMEM)


def run_gemm_wg(dev, report: Report, rng: np.random.Generator, token_counts=(512, 2048, 8192)) -> None:
    """Every case at every T: correctness first (a wrong kernel is not timed), then gemm_cp and gemm_wg timed."""
    if dev.info.arch != 90:
        report.notes.append(f"gemm_wg: sm_{dev.info.arch} has no wgmma (sm_90a only)")
        return
    compiled = compile_gemm_wg(dev.info.arch)
    names = {f"{kind}.{qt.name}": f"gemm_wg<{t}, {o}>" for qt, t in QTYPES.items() for kind, o in KINDS.items()}
    kernels = dev.load_kernels(compiled.image, {n: compiled.symbols[e] for n, e in names.items()}, "gemm_wg")
    for kernel in kernels.values():
        dev.set_max_dynamic_smem(kernel, SMEM)
    print("gemm_wg against gemm_cp (ms, TFLOP/s)", flush=True)
    for name, qtype, counts in [(n, q, token_counts) for n, q in CASES] + [(n, q, (t,)) for n, q, t in EDGES]:
        rows, cols = SHAPES_27B[name]
        data = random_blocks(qtype, (rows, cols), rng)
        w = ops.upload_weight(dev, data, qtype, (rows, cols), name)
        pick = np.sort(rng.choice(rows, size=min(rows, REF_ROWS), replace=False))
        ref_w = _reference_rows(data, qtype, (rows, cols), pick).T
        for t in counts:
            act = ops.alloc_act(dev, t, cols, "x")
            x = rng.standard_normal((t, cols), dtype=np.float32)
            dev.upload(act.f32, x)
            ops.act_f16(dev, act.f32, act, t, act.ld)
            res = dev.to_device(rng.standard_normal((t, rows), dtype=np.float32), "res")
            y_cp, y_wg = dev.alloc(4 * t * rows, "y_cp"), dev.alloc(4 * t * rows, "y_wg")
            variant = f"{name}.{qtype.name}.T{t}"
            poison(dev, y_cp)
            ops.matmul(dev, w, act, y_cp, t, rows, residual=res)
            out_cp = dev.download(y_cp, np.float32, (t, rows))
            ref = x.astype(np.float64) @ ref_w + dev.download(res, np.float32, (t, rows))[:, pick]
            timed = median_time(dev, lambda: ops.matmul(dev, w, act, y_cp, t, rows), reps=10, warmup=2, inner=2)
            cells = [f"{variant:<24} cp {_record(report, variant, 'cp', rows, cols, t, qtype, *timed)}"]
            for kind in KINDS:
                kernel = kernels[f"{kind}.{qtype.name}"]
                poison(dev, y_wg)
                launch(dev, kernel, w, act, y_wg, res, t)
                out = dev.download(y_wg, np.float32, (t, rows))
                ok = compare(report, f"gemm_{kind}", variant, out[:, pick], ref, TOL_F16).ok
                ok = compare(report, f"gemm_{kind}.same", variant + ".vs_cp", out, out_cp, TOL_SAME).ok and ok
                if not ok:  # a wrong kernel is not timed
                    cells.append(f"{kind} WRONG")
                    continue
                timed = median_time(dev, lambda k=kernel: launch(dev, k, w, act, y_wg, None, t), reps=10, warmup=2,
                                    inner=2)
                cells.append(f"{kind} {_record(report, variant, kind, rows, cols, t, qtype, *timed)}")
            print("  " + " | ".join(cells), flush=True)
            for buf in act.buffers() + [res, y_cp, y_wg]:
                dev.memory.free(buf)
        dev.memory.free(w.buf)


def _record(report: Report, variant: str, kind: str, rows: int, cols: int, t: int, qtype: Q, med: float,
            spread: float) -> str:
    """One timing into the report (TFLOP/s over 2 rows cols T); its cell of the printed line."""
    tflops = 2.0 * rows * cols * t / (med * 1e-3) / 1e12
    report.timings.append(Timing("gemm_wg", f"{variant}.{kind}", f"{rows}x{cols}", med, spread,
                                 device_nbytes(qtype, (rows, cols)), {"tflops": round(tflops, 1)}))
    return f"{med:7.3f} ms {tflops:6.1f}"


def main(argv: list[str] | None = None) -> int:
    from engine.cuda.device import Device

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "") or str(Path(__file__).parent / "results"))
    parser.add_argument("--tokens", default="512,2048,8192")
    args = parser.parse_args(argv)
    report = Report()
    with Device() as dev:
        report.info = machine_info(dev) | {"part": "gemm_wg"}
        run_gemm_wg(dev, report, np.random.default_rng(0), tuple(int(t) for t in args.tokens.split(",")))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report.write(Path(args.out) / "gpu_gemm_wg.json")
    return 0 if all(c.ok for c in report.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
