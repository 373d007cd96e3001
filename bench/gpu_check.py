"""`make gpu-check` / `make bench`: the CUDA backend checked against the numpy reference and timed, on the GPU.

  python bench/gpu_check.py                 kernels and whole tiny models against the reference
  python bench/gpu_check.py --bench         the same, then the 27B-shape timings, megakernel and llama.cpp
  python bench/gpu_check.py --parts kernels,timings --out DIR

Prints a short table last and writes results JSON (and the log) under --out (default $OUT, else bench/results).
Exits non-zero if any check failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.gpu_common import Report, copy_bandwidth, machine_info  # noqa: E402

PARTS = ("compile", "bandwidth", "kernels", "persist", "models", "timings", "model27b", "mk27b", "peer", "stream",
         "mixers", "i8", "mtp27b", "producers", "q6i8", "gemm_wg", "timeline", "sample")
# --bench: ours, the megakernel, llama.cpp on one 27B file, then where the matmuls' bandwidth goes
BENCH_PARTS = ["timings", "model27b", "mk27b", "peer", "stream"]
SKIP_PERSIST_PARTS = ("timings", "model27b")  # parts that leave the persistent mmvq out when its checks failed


def compile_all(report: Report, dev) -> None:
    """Compile every kernel file for this GPU into an empty cache (parallel processes), timing each, and load them."""
    import tempfile

    from engine.cuda import nvrtc

    print("compile (cold cache, parallel)", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for file, arch, seconds, _ in nvrtc.compile_all([report.info["arch_num"]], directory=Path(tmp)):
            report.info.setdefault("compile_s", {})[file] = round(seconds, 2)
            print(f"  {file:<12} sm_{arch}  {seconds:6.2f} s", flush=True)
    report.info["compile_wall_s"] = round(time.perf_counter() - t0, 2)
    print(f"  all files: {report.info['compile_wall_s']} s wall", flush=True)
    dev.load_all()


def run_part(name: str, dev, report: Report, rng: np.random.Generator, args) -> None:
    """One part of the check, by name."""
    if name == "compile":
        compile_all(report, dev)
    elif name == "bandwidth":
        t = copy_bandwidth(dev)
        report.timings.append(t)
        report.info["copy_gbps"] = round(t.gbps, 1)
        print(f"copy bandwidth: {t.gbps:.0f} GB/s (read + write, {t.median_ms:.3f} ms for {t.shape})", flush=True)
    elif name == "kernels":
        from bench import gpu_kernels, gpu_mixers, gpu_ops, gpu_penalties

        gpu_kernels.run_matmul_checks(dev, report, rng)
        gpu_ops.run_op_checks(dev, report, rng)
        gpu_penalties.check_choose_penalised(dev, report, rng)
        gpu_mixers.run_mixer_checks(dev, report, rng)
    elif name == "persist":  # the persistent mmvq (bench/NOTES.md v8), in its own process: a fault stays here
        from bench import gpu_persist

        gpu_persist.run_persist_checks(dev, report, rng)
    elif name == "timings":
        from bench import gpu_kernels

        from bench import gpu_mixers

        gpu_kernels.time_matmuls(dev, report, rng, with_persist=not args.skip_persist)
        gpu_kernels.time_gemm(dev, report, rng)
        gpu_mixers.time_delta_rule(dev, report, rng)
    elif name == "mixers":  # the sequence mixers alone (also inside "kernels"); the delta rule's forms timed
        from bench import gpu_mixers

        gpu_mixers.run_mixer_checks(dev, report, rng)
        gpu_mixers.time_delta_rule(dev, report, rng)
        gpu_mixers.time_conv_rule(dev, report, rng)
    elif name == "i8":  # the int8-activation Q4_K matmul alone (also inside "kernels"), timed beside the default
        from bench import gpu_kernels

        gpu_kernels.run_i8_checks(dev, report, rng)
        gpu_kernels.time_i8(dev, report, rng)
        gpu_kernels.time_q6_i8(dev, report, rng, token_counts=(1,))  # the one-token Q6_K forms (q6i8: 1-5 tokens)
    elif name == "q6i8":  # the int8-activation Q6_K matmul alone (also inside "i8"), timed beside the f16 kernels
        from bench import gpu_kernels

        gpu_kernels.run_q6_i8_checks(dev, report, rng)
        gpu_kernels.time_q6_i8(dev, report, rng)
    elif name == "timeline":  # the 27B passes kernel by kernel (CUPTI through torch.profiler): where the time goes
        from bench import gpu_timeline

        gpu_timeline.run_timeline(report, args)
    elif name == "producers":  # the producers' checks (also inside "kernels"), each timed at 1-8 tokens
        from bench import gpu_ops

        gpu_ops.run_act_checks(dev, report, rng)
        gpu_ops.time_producers(dev, report, rng)
    elif name == "gemm_wg":  # an experiment, not in the default parts: the prefill GEMM on wgmma (sm_90a)
        from bench import gpu_gemm_wg

        gpu_gemm_wg.run_gemm_wg(dev, report, rng)
    elif name == "stream":  # diagnostic, not in the default parts: mmvq vs its loads alone vs a plain read
        from bench import gpu_stream

        gpu_stream.run_stream_probe(dev, report, rng)
    elif name == "sample":  # the token choice on the device alone (also inside "kernels"), penalties included
        from bench import gpu_ops, gpu_penalties

        gpu_ops.check_argmax(dev, report, rng)
        gpu_ops.check_choose_rows(dev, report, rng)
        gpu_penalties.check_choose_penalised(dev, report, rng)
        gpu_penalties.time_penalties(dev, report, rng)
        gpu_ops.time_choose_rows(dev, report, rng)
    elif name == "models":
        from bench import gpu_models

        gpu_models.run_model_checks(dev, report, args)
    elif name == "model27b":
        from bench import gpu_models

        gpu_models.run_27b(dev, report, args)
    elif name == "mtp27b":  # the per-op MTP head on the same file: its catch-up in every pass, drafts of 1..4
        from bench import gpu_mtp27b

        gpu_mtp27b.run_mtp27b(report, args)
    elif name == "mk27b":  # the megakernel's cycle at d = 0..4 on the same file
        from bench import gpu_megakernel

        gpu_megakernel.part_model27b(dev, report, gpu_megakernel.parse_args([]))
    elif name == "peer":  # llama.cpp on the same file (bench/gpu_peer.py): its failures are recorded, never raised
        from bench import gpu_peer

        gpu_peer.run_into(report)


def summary(report: Report) -> None:
    """The short table printed last."""
    failed = [c for c in report.checks if not c.ok]
    print("\n==== summary ====")
    print(f"gpu {report.info.get('gpu')} {report.info.get('arch')}  copy {report.info.get('copy_gbps', '?')} GB/s  "
          f"commit {str(report.info.get('commit', ''))[:10]}")
    print(f"checks: {len(report.checks) - len(failed)}/{len(report.checks)} ok")
    for c in failed:
        print(f"  FAIL {c.op} {c.variant} {c.shape} rel {c.rel_err:.2e} tol {c.tol:.0e} unwritten {c.unwritten}")
    for line in report.notes:
        print(f"  note: {line}")
    rows: dict[str, list[str]] = {}
    for t in report.timings:  # matmuls at T = 1 and 5: one line per shape, the variants side by side
        parts = t.variant.split(".")
        if t.op == "matmul" and len(parts) >= 4 and parts[2] in ("T1", "T5"):
            rows.setdefault(".".join(parts[:3]), []).append(f"{'.'.join(parts[3:])} {t.median_ms * 1e3:.1f} us "
                                                             f"{t.gbps / 1e3:.2f} TB/s")
    for key, cells in rows.items():
        print(f"  matmul   {key:<22} " + " | ".join(cells))
    for t in report.timings:
        if t.op in ("forward", "prefill", "copy"):
            print(f"  {t.op:<8} {t.variant:<22} {t.median_ms:9.3f} ms  {t.gbps:7.0f} GB/s  {t.extra}")
    if "peer" in report.info:  # last: ours vs llama.cpp
        from bench.gpu_compare import ours_from_timings, print_comparison

        print_comparison(ours_from_timings(report.timings), report.info["peer"])


def run_child(args, parts: list[str]) -> int:
    """Run parts in this process (one CUDA context); write part JSON to --out."""
    from engine.cuda.device import Device

    report, rng, ok = Report(), np.random.default_rng(args.seed), True
    with Device() as dev:
        report.info = machine_info(dev) | {"arch_num": dev.info.arch, "seed": args.seed, "parts": parts}
        for part in parts:
            t0 = time.perf_counter()
            try:
                run_part(part, dev, report, rng, args)
            except Exception:  # a broken part must not hide the others' results
                ok = False
                report.notes.append(f"part {part} raised: {traceback.format_exc(limit=8)}")
                traceback.print_exc()
            report.info.setdefault("part_s", {})[part] = round(time.perf_counter() - t0, 1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report.write(Path(args.out) / f"part_{'_'.join(parts)}.json")
    return 0 if ok else 1


def merge(out_dir: Path, parts: list[str]) -> Report:
    """Merge the parts' JSON files into one report."""
    import json

    from bench.gpu_common import Check, Timing

    report = Report()
    for part in parts:
        path = out_dir / f"part_{part}.json"
        if not path.exists():
            report.notes.append(f"part {part} wrote no results (crashed?)")
            continue
        data = json.loads(path.read_text())
        report.info.update({k: v for k, v in data["info"].items() if k not in ("parts", "part_s")})
        report.info.setdefault("part_s", {}).update(data["info"].get("part_s", {}))
        report.notes += data["notes"]
        report.checks += [Check(**{k: v for k, v in c.items() if k != "ok"}) for c in data["checks"]]
        report.timings += [Timing(**{k: v for k, v in t.items() if k != "gbps"}) for t in data["timings"]]
    return report


def _persist_failed(part_dir: Path, codes: dict[str, int]) -> bool:
    """Whether the persist part ran in this run and failed (raised, or any of its checks failed)."""
    import json

    if "persist" not in codes:
        return False
    path = part_dir / "part_persist.json"
    if codes["persist"] != 0 or not path.exists():
        return True
    return not all(c["ok"] for c in json.loads(path.read_text())["checks"])


def main(argv: list[str] | None = None) -> int:
    """Run each part in its own process (a fault in one leaves the others' results); exit 1 on any failure."""
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", action="store_true", help="also run the 27B-shape timings")
    parser.add_argument("--parts", default="", help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for results JSON")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--skip-persist", action="store_true", help="leave the persistent mmvq out of the timings")
    parser.add_argument("--part-timeout", type=float, default=0,
                        help="seconds after which a part's process is killed (0: no limit); the others go on")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p] or (
        ["compile", "bandwidth", "kernels", "persist", "models"] + (BENCH_PARTS if args.bench else []))
    out_dir = Path(args.out) if args.out else Path(__file__).resolve().parent / "results"
    if args.child:
        args.out = str(out_dir)
        return run_child(args, parts)
    part_dir = out_dir / "parts"
    codes = {}
    for part in parts:
        cmd = [sys.executable, __file__, "--child", "--parts", part, "--out", str(part_dir), "--seed", str(args.seed)]
        if part in SKIP_PERSIST_PARTS and (args.skip_persist or _persist_failed(part_dir, codes)):
            print(f"{part}: without the persistent mmvq (its checks failed)", flush=True)
            cmd.append("--skip-persist")
        try:
            codes[part] = subprocess.run(cmd, timeout=args.part_timeout or None).returncode
        except subprocess.TimeoutExpired:  # a hung kernel costs this part, not the run's later parts
            print(f"{part}: killed after {args.part_timeout:.0f} s", flush=True)
            codes[part] = 124
    report = merge(part_dir, parts)
    report.info["exit_codes"] = codes
    for path in part_dir.glob("part_*.json"):
        path.unlink()  # merged: only the combined file is kept
    if part_dir.exists() and not any(part_dir.iterdir()):
        part_dir.rmdir()
    report.write(out_dir / ("gpu_bench.json" if args.bench else "gpu_check.json"))
    summary(report)
    return 0 if all(c == 0 for c in codes.values()) and all(c.ok for c in report.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
