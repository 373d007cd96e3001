"""The megakernel on the GPU machine, in one call: correctness first, then cycle times on the 27B shape.

  python bench/gpu_megakernel.py                         every part, results in $OUT (else bench/results)
  python bench/gpu_megakernel.py --parts compile,diff     a subset (compile, diff, tiny, sampling, model27b)

Parts (each in its own process: a fault in one leaves the others' results):
  compile   NVRTC for this GPU and the 27B shape, cold cache, with ptxas' register and spill report
  diff      VM vs megakernel from the same state, cut after every op of the first 4 stages and after every stage;
            prints the first diverging (stage, op) and buffer
  diff27    the same at every width of the 27B file (4 layers + MTP, vocabulary 248320: bench/mk_trace.py
            wide_config), stopping at the first diverging buffer; then 64 greedy tokens megakernel vs the numpy
            reference vs the per-op path on that file, with the first difference and its top-2 gaps
  tiny      256 greedy tokens at d = 0..4 on a tiny qwen35: megakernel = reference = per-op CUDA path
  sampling  the device sampler's distribution (chi-square), VERIFY alone on fixed logits
  cycle27b  the 27B-shaped file's cycle times at --depths alone (no greedy checks), each with the launch's
            critical path by opcode (bench/mk_profile.py); OPENJET_MK_DEFINES compiles a variant, and
            --variants "name:MK_A=1,MK_B=2;name2:..." times more variants after it on the same upload
  latency   the per-instruction costs alone, one SM measuring while the others idle or stream DRAM: L2 and DRAM
            round trips, fences, the counters' signal and wait (as built and with MK_SYNC_ACQREL=1), cold and warm
            code (bench/gpu_latency.py)
  model27b  the Qwen3.8-27B-shaped file (generated once): 256 greedy tokens vs the per-op path (prefilled 8
            tokens at a time, so it runs its precise mmvq as the megakernel does, and as one chunk, which runs its
            f16 GEMM), the first differing position with each run's top-2 logits, cycle times at d = 0..4 against
            the copy bandwidth of the same run, the bandwidth floor of each cycle, per-phase times, and tokens/s
            projected with Qwen3.8's published MTP acceptance (labelled as a projection); also the per-op path's
            shipped int8 form against its f16 one: the yardstick for the megakernel's own int8 copies
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.gpu_common import (Report, Timing, copy_bandwidth, machine_info, median_time, record,  # noqa: E402
                               results_json)

PARTS = ("compile", "diff", "diff27", "tiny", "sampling", "model27b")  # cycle27b, latency: on request
PROMPT = [11, 201, 35, 90, 400, 17]
PUBLISHED_ACCEPTANCE = {0: 1.0, 1: 1.90, 2: 2.68, 3: 3.28, 4: 3.79}  # Qwen3.8 MTP, tokens per cycle (REFERENCE.md)


def _per_op_precise() -> None:
    """The per-op path these parts compare with runs its precise f16 matmuls as the megakernel does: no int8
    activations (ops.I8_MATMUL, on by default for 1-4 tokens). Each part runs in its own process."""
    from engine.cuda import ops

    ops.set_i8(False)


def part_compile(dev, report: Report, args) -> None:
    """Cold compile for this GPU, 27B specialisation; ptxas' report into the notes."""
    from engine.cuda import nvrtc
    from engine.cuda.megakernel import build
    from engine.cuda.megakernel.costs import spec_from_config
    from engine.model.config import qwen38_27b_config

    extra = build.model_options(spec_from_config(qwen38_27b_config())) + ("--ptxas-options=-v",)
    t0 = time.perf_counter()
    compiled = nvrtc.compile_file(build.SOURCE, dev.info.arch, (build.ENTRY,), build.options() + extra,
                                  kernel_dir=build.MEGAKERNEL_DIR)  # uncached: the cold time
    report.info["megakernel_compile_s"] = round(time.perf_counter() - t0, 1)
    lines = [line for line in compiled.log.splitlines() if "spill" in line or "registers" in line]
    report.notes += [f"ptxas: {line.strip()}" for line in lines[:60]]
    print(f"compile: {report.info['megakernel_compile_s']} s; {len(compiled.image)} bytes", flush=True)


def tiny_path(args) -> Path:
    """A tiny qwen35 model (vocabulary 512), written once."""
    from engine.gguf.testmodel import write_test_model

    path = Path(args.work) / "tiny-qwen35.gguf"
    if not path.exists():
        write_test_model(path, "qwen35", tokenizer=False, vocab_size=512)
    return path


def part_diff(dev, report: Report, args) -> None:
    """The op-by-op sweep for three draft depths; every buffer's error recorded, the first failure named."""
    diff_sweeps(dev, report, tiny_path(args), "mk_diff", 4, (0, 2, 4))


def diff_sweeps(dev, report: Report, path: Path, op_name: str, detail_layers: int, depths: tuple[int, ...]) -> None:
    """VM vs megakernel on one file at each draft depth, cut after every op of the first `detail_layers` stages and
    after every stage, each sweep stopping at its first diverging point (printed: stage, op, buffer)."""
    from engine.cuda.megakernel.backend import capacity_for
    from engine.cuda.megakernel.diff import act8_checks, prepare, sweep
    from engine.cuda.megakernel.layout import ModelSpec
    from engine.cuda.megakernel.runner import GpuExecutor
    from engine.cuda.megakernel.vm import VirtualMachine
    from engine.model.weights import load_model
    from engine.reference.weights import load_weights

    _, _, tensors = load_model(str(path))
    spec = ModelSpec.from_tensors(tensors)
    gpu = GpuExecutor(dev, spec, tensors, capacity_for(512))
    vm = VirtualMachine(spec, load_weights(tensors), capacity_for(512), gpu.config, order="program")
    for drafts in ([7, 8, 9, 10][:d] for d in depths):
        # each int8 copy its writer forms at 1 + d rows: the encoding of the act it left (act8_store, act8_fill)
        prepare(vm, PROMPT, drafts)
        for name, (stage, op), frac in act8_checks(vm, gpu):
            record(report, op_name + "_act8", f"d{len(drafts)}.{name}.s{stage}.{op.name}", "levels", frac, 1e-3)
        prepare(vm, PROMPT, drafts)
        for (stage, op), diffs in sweep(vm, gpu, detail_layers=detail_layers):
            worst = max(diffs, key=lambda d: (not d.ok, d.rel_err))
            record(report, op_name, f"d{len(drafts)}.s{stage}.{op.name}", worst.name, worst.rel_err if worst.ok
                   else float("inf"), 1.0)
            for d in diffs:
                if not d.ok:
                    line = (f"{op_name} d={len(drafts)}: first divergence after stage {stage} {op.name}: {d.name} "
                            f"({d.kind}) rel {d.rel_err:.3e}, {d.mismatches} bad")
                    report.notes.append(line)
                    print(line, flush=True)
    gpu.close()


def part_diff27(dev, report: Report, args) -> None:
    """Every width of the 27B file: the VM diff, then greedy megakernel vs reference vs per-op (64 tokens), and the
    per-op path's shipped int8 form against the reference (how far int8 levels move these logits)."""
    _per_op_precise()
    from bench.mk_trace import compare_runs, describe, trace_host, trace_megakernel, wide_path
    from engine.cuda.backend import CudaBackend
    from engine.cuda.megakernel.runner import open_backend
    from engine.reference.backend import ReferenceBackend

    path = wide_path(Path(args.work) / "qwen38-27b-widths-4layers.gguf", workers=os.cpu_count())
    diff_sweeps(dev, report, path, "mk_diff27", args.wide_detail, (0, 4))  # the VM takes seconds a cycle here
    ref = trace_host(ReferenceBackend.from_gguf(path, context_size=512), "reference", PROMPT, 64)
    per_op_backend = CudaBackend.from_gguf(path, context_size=512, device=dev)
    per_op = trace_host(per_op_backend, "per_op", PROMPT, 64, 8)
    shipped = trace_per_op_int8(per_op_backend, PROMPT, 64, 8)  # the int8 yardstick against the reference
    per_op_backend.close()
    mk_backend = open_backend(path, context_size=512, device=dev)
    mk = trace_megakernel(mk_backend, "megakernel", PROMPT, 64)
    mk_backend.ex.close()
    for a, b in ((mk, ref), (mk, per_op), (per_op, ref), (shipped, ref)):
        rep = compare_runs(a, b)
        report.info.setdefault("wide_first_difference", []).append(rep)
        print("  27B widths: " + describe(rep), flush=True)
        if a is mk:
            record(report, "mk_greedy_27b_widths", f"vs_{b.name}", "64 tokens", 64 - rep["first_difference"], 1)


def greedy_run(backend, num_draft: int, num_tokens: int, prompt: list[int]) -> tuple[list[int], float]:
    """(tokens, seconds) of greedy decoding with cycles of num_draft drafts."""
    from engine.backend import TokenSequence
    from engine.sampling import SamplingParams
    from engine.spec.verify import greedy_accept

    params = SamplingParams(temperature=0.0, seed=0)
    backend.prefill(prompt[:-1])
    seq = TokenSequence.start(prompt, params)
    t0 = time.perf_counter()
    while len(seq.generated) < num_tokens:
        backend.cycle(seq, num_draft if backend.can_draft else 0, params, rule=greedy_accept)
    return seq.generated[:num_tokens], time.perf_counter() - t0


def first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first differing token (len when equal)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def part_tiny(dev, report: Report, args) -> None:
    """256 greedy tokens at every d: megakernel vs reference and per-op CUDA."""
    _per_op_precise()
    from engine.cuda.backend import CudaBackend
    from engine.cuda.megakernel.runner import open_backend
    from engine.reference.backend import ReferenceBackend

    path = tiny_path(args)
    ref, _ = greedy_run(ReferenceBackend.from_gguf(path, context_size=512), 0, 256, PROMPT)
    per_op = CudaBackend.from_gguf(path, context_size=512, device=dev)
    op_tokens, _ = greedy_run(per_op, 0, 256, PROMPT)
    for d in range(5):
        mk = open_backend(path, context_size=512, device=dev)
        tokens, seconds = greedy_run(mk, d, 256, PROMPT)
        record(report, "mk_greedy_tiny", f"d{d}.vs_ref", "256 tokens", 256 - first_difference(tokens, ref), 1)
        record(report, "mk_greedy_tiny", f"d{d}.vs_per_op", "256 tokens", 256 - first_difference(tokens, op_tokens), 1)
        report.info.setdefault("tiny_launches", {})[f"d{d}"] = dict(mk.launches)
        print(f"  tiny d={d}: {256 / seconds:.0f} tok/s, launches {dict(mk.launches)}", flush=True)
        mk.ex.close()


def part_sampling(dev, report: Report, args) -> None:
    """The device sampler on fixed logits: chi-square of 4000 draws."""
    import pytest

    code = pytest.main(["-q", "-x", str(Path(__file__).resolve().parent.parent / "tests/kernels/test_megakernel_diff.py"),
                        "-k", "sampling or faults"])
    record(report, "mk_sampling", "chi2+faults", "pytest", float(code != 0), 0.5)


def model27b_path(report: Report) -> Path:
    """The generated 27B-shaped file (once per machine)."""
    from engine.gguf.testmodel import write_preset

    path = Path(os.environ.get("OPENJET_27B", "/tmp/openjet-qwen38-27b.gguf"))
    if not path.exists():
        t0 = time.perf_counter()
        write_preset(path, "qwen3.8-27b", workers=os.cpu_count())
        report.info["model27b_generate_s"] = round(time.perf_counter() - t0, 1)
    return path


def setup_27b(dev, report: Report, prompt_len: int) -> tuple[Path, list[int], Timing]:
    """The 27B file, the prompt the 27B parts decode from (its first prompt_len tokens) and this run's copy
    bandwidth (recorded)."""
    path = model27b_path(report)
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 150000, prompt_len)]
    bw = copy_bandwidth(dev)
    report.timings.append(bw)
    report.info["copy_gbps"] = round(bw.gbps, 1)
    return path, prompt, bw


def part_latency(dev, report: Report, args) -> None:
    from bench.gpu_latency import run_latency_probe

    run_latency_probe(dev, report, np.random.default_rng(0))


def part_model27b(dev, report: Report, args) -> None:
    """27B: greedy equality with the per-op path, then cycle times at d = 0..4."""
    path, prompt, bw = setup_27b(dev, report, 32)
    mk, got = greedy_27b(dev, report, args, path, prompt)
    time_cycles(dev, report, mk, prompt + got[:1], bw)


def part_cycle27b(dev, report: Report, args) -> None:
    """27B: cycle times and their critical paths only, at the depths asked for."""
    from engine.cuda.megakernel.runner import open_backend

    variants = parse_variants(args.variants)  # a malformed option fails before the model is opened
    path, prompt, bw = setup_27b(dev, report, args.context)
    report.info["mk_defines"] = os.environ.get("OPENJET_MK_DEFINES", "")
    config = schedule_config(dev, report, args)
    # a malformed schedule item fails before the model is opened too; the buffers hold every variant's head parts
    schedules = tuple(variant_schedule(defines, config) for _, defines in variants)
    t0 = time.perf_counter()
    mk = open_backend(path, context_size=max(4096, args.context + 256), device=dev, config=config,
                      draft_vocab=args.draft_vocab, timings=True, reserve=tuple(s for s in schedules if s != config))
    report.info["open_s"] = round(time.perf_counter() - t0, 1)
    depths = [int(d) for d in args.depths.split(",")]
    base = {key: os.environ.get(key) for key in ("OPENJET_MK_DEFINES", "OPENJET_MK_SMEM_KB")}
    pool, ahead = precompile_variants(mk, variants, base)
    time_cycles(dev, report, mk, prompt, bw, depths)
    for (name, defines), schedule in zip(variants, schedules):
        env = variant_environment(defines, base["OPENJET_MK_DEFINES"] or "")
        print(f"  variant {name}: " + " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
        with environment(env):  # the next variant starts from the default again
            try:
                wait_precompiled(ahead.get(name), name)
                mk.ex.recompile()
                if schedule != config:
                    mk.ex.reschedule(schedule)
                time_cycles(dev, report, mk, prompt, bw, depths, label=name)
            except Exception:  # a variant that fails to build or run is reported, the others still run
                report.notes.append(f"variant {name} raised: {traceback.format_exc(limit=4)}")
                traceback.print_exc()
        if mk.ex.config != config:
            mk.ex.reschedule(config)
    if pool is not None:
        pool.shutdown()
    report.info["variants"] = dict(variants)


def precompile_variants(mk, variants: list[tuple[str, str]], base: dict[str, str | None]):
    """Every variant's megakernel compiled into the disk cache by worker processes, started before the default's
    timings, so that each variant's recompile loads it (NVRTC takes ~40 s of one CPU a build; one after the other
    that was most of a call's device time). Returns the pool (or None) and a future per variant."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from engine.cuda.megakernel import build

    if not variants:
        return None, {}
    jobs = {}
    for name, defines in variants:
        with environment(variant_environment(defines, base["OPENJET_MK_DEFINES"] or "")):
            try:
                jobs[name] = mk.ex.compile_args()
            except ValueError as exc:  # a malformed define: the variant reports it when it runs
                print(f"  variant {name}: not compiled ahead ({exc})", flush=True)
    workers = max(1, min(len(jobs), (os.cpu_count() or 2) - 1))  # a CPU left for the timings
    # spawn, not fork: this process holds a CUDA context (the workers only ever touch NVRTC)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    return pool, {name: pool.submit(build.compile_megakernel, arch, extra, None, ptx)
                  for name, (arch, extra, ptx) in jobs.items()}


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """os.environ with env's values in place, and as it was again after (keys it lacked removed)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def wait_precompiled(future, name: str) -> None:
    """Wait for a variant's compile ahead; its failure is left for the variant's own compile to report."""
    if future is None:
        return
    t0 = time.perf_counter()
    try:
        future.result()
    except Exception as exc:  # noqa: BLE001 - recompile raises it again, with the variant's name
        print(f"  variant {name}: compile ahead failed ({type(exc).__name__})", flush=True)
    waited = time.perf_counter() - t0
    if waited > 1:
        print(f"  variant {name}: waited {waited:.0f} s for its compile", flush=True)


SCHEDULE_PREFIX = "SCHED."  # a variant item SCHED.<ScheduleConfig field>=<value>: the schedule, not the kernel


def variant_schedule(defines: str, config):
    """The schedule a variant runs: `config` with the variant's SCHED.<field>=<value> items (integer fields, and
    the flags as 0 / 1) in place; config itself without any."""
    import dataclasses

    changes = {}
    for item in (d.strip() for d in defines.split(",") if d.strip().startswith(SCHEDULE_PREFIX)):
        field, _, value = item[len(SCHEDULE_PREFIX):].partition("=")
        kinds = {f.name: f.type for f in dataclasses.fields(config)}
        if field not in kinds or not value.lstrip("-").isdigit():
            raise ValueError(f"--variants: {item!r} is not SCHED.<one of {', '.join(kinds)}>=<integer>")
        changes[field] = bool(int(value)) if kinds[field] in (bool, "bool") else int(value)
    return dataclasses.replace(config, **changes) if changes else config


def variant_environment(defines: str, base: str) -> dict[str, str]:
    """The environment a variant compiles under: its MK_ defines after the base ones in OPENJET_MK_DEFINES, and
    its SMEM_KB=n (if any) as OPENJET_MK_SMEM_KB (its SCHED. items are its schedule: variant_schedule)."""
    items = [d.strip() for d in defines.split(",") if d.strip() and not d.strip().startswith(SCHEDULE_PREFIX)]
    env = {"OPENJET_MK_DEFINES": ",".join(d for d in (base, *(i for i in items if not i.startswith("SMEM_KB="))) if d)}
    smem = [i.partition("=")[2] for i in items if i.startswith("SMEM_KB=")]
    if smem:
        env["OPENJET_MK_SMEM_KB"] = smem[-1]
    return env


def parse_variants(text: str) -> list[tuple[str, str]]:
    """("name", "MK_A=1,MK_B=2") pairs from "name:MK_A=1,MK_B=2;name2:MK_C=3" (empty: none)."""
    out = []
    for item in (i.strip() for i in text.split(";") if i.strip()):
        name, sep, defines = item.partition(":")
        if not sep or not name.strip() or not defines.strip():
            raise ValueError(f"--variants: {item!r} is not name:MK_NAME=value[,...]")
        out.append((name.strip(), defines.strip()))
    return out


def schedule_config(dev, report: Report, args):
    """The 27B parts' schedule for this GPU's SMs, as the options ask, recorded in the report."""
    from engine.cuda.megakernel.schedule import ScheduleConfig

    config = ScheduleConfig(num_sms=dev.info.multiprocessors, tiles_per_sm=args.tiles_per_sm,
                            split_tiles=args.split_tiles, joint_rows=not args.per_matrix_runs)
    report.info["schedule"] = {"tiles_per_sm": config.tiles_per_sm, "num_sms": config.num_sms,
                               "split_tiles": config.split_tiles, "joint_rows": config.joint_rows,
                               "overhead_bytes": config.overhead_bytes}
    return config


def greedy_27b(dev, report: Report, args, path: Path, prompt: list[int]):
    """256 greedy tokens: the per-op path prefilled 8 at a time (its precise mmvq, as the megakernel prefills) and
    in one chunk (its f16 GEMM: weights and activations rounded to f16), then the megakernel; where each pair
    parts, both runs' top-2 logits (bench/mk_trace.py). Returns the megakernel backend and its tokens."""
    _per_op_precise()
    from bench.mk_trace import PREFILL_PRECISE, compare_runs, describe, trace_host, trace_megakernel
    from engine.cuda.backend import CudaBackend
    from engine.cuda.megakernel.runner import open_backend

    per_op = CudaBackend.from_gguf(path, context_size=4096, device=dev)  # its 16 GB stay beside the megakernel's
    precise = trace_host(per_op, "per_op", prompt, 256, PREFILL_PRECISE)
    per_op.reset()
    gemm = trace_host(per_op, "per_op_gemm_prefill", prompt, 256)
    shipped = trace_per_op_int8(per_op, prompt, 256, PREFILL_PRECISE)
    config = schedule_config(dev, report, args)
    mk = open_backend(path, context_size=4096, device=dev, config=config, draft_vocab=args.draft_vocab, timings=True)
    got = trace_megakernel(mk, "megakernel", prompt, 256)
    mk.keep_logits = False
    # Only the first pair is a check: the per-op path prefilled through its f16 GEMM parts from the same path
    # prefilled precisely (the H200 run of 2026-12-01: both at token 51, a near-tie), so the other two pairs
    # measure the GEMM's rounding, not the megakernel; they stay as first-difference lines. The random 27B-shaped
    # file has near-ties every few dozen tokens (top-2 gaps of 0.003 on logits of ~30), which the int8 levels'
    # rounding may turn either way: the check is that the runs part only at one (compare_runs: both margins within
    # the logit noise before it) and that the noise stays small; a wrong op moves the logits by far more.
    # The per-op path as it ships (int8 levels for its 1-4-token matmuls) against its f16 form is the yardstick for
    # the megakernel's own int8 copies: how far the same kind of rounding moves these logits there.
    pairs = ((got, precise, "vs_per_op"), (got, gemm, None), (precise, gemm, None), (shipped, precise, None),
             (got, shipped, None))
    for a, b, check in pairs:
        rep = compare_runs(a, b)
        report.info.setdefault("mk27_first_difference", []).append(rep)
        print("  27B: " + describe(rep), flush=True)
        if check:
            apart = 0 if rep["equal"] or rep["near_tie"] else 256 - rep["first_difference"]
            record(report, "mk_greedy_27b", check, "tokens after a split", apart, 1)
            record(report, "mk_greedy_27b", check, "max |dlogit| before", rep["max_abs_dlogit_before"], 0.1)
    return mk, got.tokens


def trace_per_op_int8(per_op, prompt: list[int], num_tokens: int, chunk: int):
    """Greedy tokens of the per-op path with its int8 matmuls on (its default), prefilled `chunk` tokens at a time;
    the backend is left in f16 again, its graphs (which hold the launches) dropped both times."""
    from bench.gpu_kernels import i8_matmul
    from bench.mk_trace import trace_host

    try:
        with i8_matmul(True):
            per_op.drop_graphs()
            per_op.reset()
            return trace_host(per_op, "per_op_int8", prompt, num_tokens, chunk)
    finally:
        per_op.drop_graphs()


def time_cycles(dev, report: Report, mk, tokens: list[int], bw: Timing, depths=range(5), label: str = "") -> None:
    """Cycle times at each depth after `tokens`, against the bandwidth floor, and the launch's critical path;
    `label` names a kernel variant (its timings are 27b.d<d>.<label>)."""
    from engine.backend import TokenSequence
    from engine.cuda.megakernel.costs import cycle_bytes
    from engine.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, seed=0)
    for d in depths:
        mk.next_draft = d
        seq = TokenSequence.start(list(tokens), params)
        mk.reset()
        mk.prefill(seq.tokens[:-1])
        for _ in range(3):  # drafts ready on the device, caches warm
            mk.cycle(seq, d, params)
        med, spread = median_time(dev, lambda: mk.ex.run("cycle"), reps=20, warmup=2)
        parts = cycle_bytes(mk.spec, 1 + d, d, mk.num_tokens, mk.ex.config)
        nbytes = sum(v for k, v in parts.items() if k != "flops")
        floor_ms = nbytes / (bw.gbps * 1e9) * 1e3
        projected = PUBLISHED_ACCEPTANCE[d] / (med * 1e-3)
        tag = f"d{d}" + (f".{label}" if label else "")
        report.timings.append(Timing("mk_cycle", f"27b.{tag}", f"ctx{mk.num_tokens}", med, spread, nbytes,
                                     {"roofline_frac": round(floor_ms / med, 3), "floor_ms": round(floor_ms, 3),
                                      "projected_tok_s": round(projected, 1), "bytes": parts}))
        print(f"  27B cycle {tag}: {med:.3f} ms ({floor_ms / med:.0%} of the floor {floor_ms:.2f} ms); projected "
              f"{projected:.0f} tok/s at the published acceptance (a projection)", flush=True)
        phase_profile(mk, report, tag)


def phase_profile(mk, report: Report, tag: str) -> None:
    """The last cycle launch's critical path by opcode (bench/mk_profile.py), printed and kept in the report."""
    from bench.mk_profile import (code_split, critical_path, repeat_split, split_table, table, trace_table,
                                  warp_trace)
    from engine.cuda.megakernel import build

    program, times = mk.ex.programs["cycle"], mk.ex.read_timings("cycle")
    profile = critical_path(program, times)
    print(table(profile), flush=True)
    split = code_split(program, times)
    print(split_table(split), flush=True)
    report.info.setdefault("mk_code_split", {})[tag] = split
    again = repeat_split(program, times)  # only where an SM runs a group's instructions twice (SCHED.tiles_per_sm=2)
    if again:
        print(split_table(again, ("first_on_sm", "again"), "an SM's first instruction of a group against its "
                          "next ones (code and tables just used)"), flush=True)
        report.info.setdefault("mk_repeat_split", {})[tag] = again
    if build.tuning_define("MK_TRACE") not in (None, "0"):  # a variant with the warp trace compiled in
        trace = warp_trace(program, times, mk.ex.read_trace("cycle"))
        print(trace_table(trace), flush=True)
        report.info.setdefault("mk_warp_trace", {})[tag] = trace
    report.info.setdefault("mk_profile", {})[tag] = {
        "total_us": round(profile["total_us"], 1),
        "by_op": {op: {k: ({q: round(u, 2) for q, u in v.items()} if isinstance(v, dict) else round(v, 1))
                       for k, v in a.items()} for op, a in profile["by_op"].items()},
        "groups": [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in g.items()}
                   for g in profile["groups"]]}


def run_child(args, part: str) -> int:
    """One part in this process."""
    from engine.cuda.device import Device

    report, ok = Report(), True
    with Device() as dev:
        report.info = machine_info(dev) | {"part": part}
        try:
            globals()[f"part_{part}"](dev, report, args)
        except Exception:
            ok = False
            report.notes.append(f"part {part} raised: {traceback.format_exc(limit=8)}")
            traceback.print_exc()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report.write(Path(args.out) / f"mk_part_{part}.json")
    return 0 if ok and all(c.ok for c in report.checks) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """This script's options; parse_args([]) gives the defaults `make bench` runs part_model27b with."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--out", default=os.environ.get("OUT", "") or str(Path(__file__).parent / "results"))
    parser.add_argument("--work", default="/tmp/openjet-megakernel")
    parser.add_argument("--draft-vocab", type=int, default=32768)
    parser.add_argument("--tiles-per-sm", type=int, default=1, help="matmul instructions per SM and matrix")
    parser.add_argument("--split-tiles", action="store_true", help="27B parts: tiles split by superblocks")
    parser.add_argument("--per-matrix-runs", action="store_true",
                        help="27B parts: MIX_IN's matrices cut one by one, not as one row list")
    parser.add_argument("--wide-detail", type=int, default=4, help="diff27: stages cut after every op")
    parser.add_argument("--context", type=int, default=33, help="cycle27b: prompt tokens before the timed cycles")
    parser.add_argument("--depths", default="0,1,2,3,4", help="cycle27b: draft depths timed")
    parser.add_argument("--variants", default="", help='cycle27b: "name:MK_A=1,MK_B=2;name2:..." kernel variants '
                        "timed after the default on the same upload (SMEM_KB=n: n KB of shared memory; "
                        "SCHED.<field>=<n>: a ScheduleConfig field, e.g. SCHED.split_tiles=1)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Every part in its own process; the merged results in <out>/gpu_megakernel.json."""
    args = parse_args(argv)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.child:
        return run_child(args, args.child)
    codes, merged = {}, {"parts": {}}
    for part in [p for p in args.parts.split(",") if p]:
        cmd = [sys.executable, __file__, "--child", part, "--out", args.out, "--work", args.work,
               "--draft-vocab", str(args.draft_vocab), "--tiles-per-sm", str(args.tiles_per_sm),
               *(["--split-tiles"] if args.split_tiles else []),
               *(["--per-matrix-runs"] if args.per_matrix_runs else []),
               "--wide-detail", str(args.wide_detail), "--depths", args.depths, "--context", str(args.context),
               "--variants", args.variants]
        codes[part] = subprocess.run(cmd).returncode
        path = Path(args.out) / f"mk_part_{part}.json"
        if path.exists():
            merged["parts"][part] = json.loads(path.read_text())
            path.unlink()
    merged["exit_codes"] = codes
    (Path(args.out) / "gpu_megakernel.json").write_text(results_json(merged))
    print(json.dumps({"exit_codes": codes}, indent=1))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
