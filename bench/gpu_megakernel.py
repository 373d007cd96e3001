"""The megakernel on the GPU machine, in one call: correctness first, then cycle times on the 27B shape.

  python bench/gpu_megakernel.py                         every part, results in $OUT (else bench/results)
  python bench/gpu_megakernel.py --parts compile,diff     a subset (compile, diff, tiny, sampling, model27b)

Parts (each in its own process: a fault in one leaves the others' results):
  compile   NVRTC for this GPU and the 27B shape, cold cache, with ptxas' register and spill report
  diff      VM vs megakernel from the same state, cut after every op of the first 4 stages and after every stage;
            prints the first diverging (stage, op) and buffer
  tiny      256 greedy tokens at d = 0..4 on a tiny qwen35: megakernel = reference = per-op CUDA path
  sampling  the device sampler's distribution (chi-square), VERIFY alone on fixed logits
  model27b  the Qwen3.8-27B-shaped file (generated once): 256 greedy tokens vs the per-op path, cycle times at
            d = 0..4 against the copy bandwidth of the same run, the bandwidth floor of each cycle, per-phase times,
            and tokens/s projected with Qwen3.8's published MTP acceptance (labelled as a projection)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.gpu_common import Report, Timing, copy_bandwidth, machine_info, median_time, record  # noqa: E402

PARTS = ("compile", "diff", "tiny", "sampling", "model27b")
PROMPT = [11, 201, 35, 90, 400, 17]
PUBLISHED_ACCEPTANCE = {0: 1.0, 1: 1.90, 2: 2.68, 3: 3.28, 4: 3.79}  # Qwen3.8 MTP, tokens per cycle (REFERENCE.md)


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
    from engine.cuda.megakernel.backend import capacity_for
    from engine.cuda.megakernel.diff import prepare, sweep
    from engine.cuda.megakernel.layout import ModelSpec
    from engine.cuda.megakernel.runner import GpuExecutor
    from engine.cuda.megakernel.vm import VirtualMachine
    from engine.model.weights import load_model
    from engine.reference.weights import load_weights

    _, _, tensors = load_model(str(tiny_path(args)))
    spec = ModelSpec.from_tensors(tensors)
    gpu = GpuExecutor(dev, spec, tensors, capacity_for(512))
    vm = VirtualMachine(spec, load_weights(tensors), capacity_for(512), gpu.config, order="program")
    for drafts in ([], [7, 8], [7, 8, 9, 10]):
        prepare(vm, PROMPT, drafts)
        for (stage, op), diffs in sweep(vm, gpu, detail_layers=4):
            worst = max(diffs, key=lambda d: (not d.ok, d.rel_err))
            record(report, "mk_diff", f"d{len(drafts)}.s{stage}.{op.name}", worst.name, worst.rel_err if worst.ok
                   else float("inf"), 1.0)
            for d in diffs:
                if not d.ok:
                    report.notes.append(f"d={len(drafts)} after stage {stage} {op.name}: {d.name} ({d.kind}) "
                                        f"rel {d.rel_err:.3e}, {d.mismatches} bad")
    gpu.close()


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


def part_model27b(dev, report: Report, args) -> None:
    """27B: greedy equality with the per-op path, then cycle times at d = 0..4."""
    from engine.backend import TokenSequence
    from engine.cuda.backend import CudaBackend
    from engine.cuda.megakernel.costs import cycle_bytes
    from engine.cuda.megakernel.runner import open_backend
    from engine.sampling import SamplingParams

    path = model27b_path(report)
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 150000, 32)]
    bw = copy_bandwidth(dev)
    report.timings.append(bw)
    report.info["copy_gbps"] = round(bw.gbps, 1)
    per_op = CudaBackend.from_gguf(path, context_size=4096, device=dev)
    want, _ = greedy_run(per_op, 0, 256, prompt)  # its 16 GB stay on the device beside the megakernel's (H200)
    from engine.cuda.megakernel.schedule import ScheduleConfig

    config = ScheduleConfig(num_sms=dev.info.multiprocessors, tiles_per_sm=args.tiles_per_sm)
    report.info["schedule"] = {"tiles_per_sm": args.tiles_per_sm, "num_sms": config.num_sms}
    mk = open_backend(path, context_size=4096, device=dev, config=config, draft_vocab=args.draft_vocab, timings=True)
    got, _ = greedy_run(mk, 0, 256, prompt)
    record(report, "mk_greedy_27b", "vs_per_op", "256 tokens", 256 - first_difference(got, want), 1)
    params = SamplingParams(temperature=0.0, seed=0)
    for d in range(5):
        mk.next_draft = d
        seq = TokenSequence.start(prompt + got[: 1], params)
        mk.reset()
        mk.prefill(seq.tokens[:-1])
        for _ in range(3):  # drafts ready on the device, caches warm
            mk.cycle(seq, d, params)
        med, spread = median_time(dev, lambda: mk.ex.run("cycle"), reps=20, warmup=2)
        parts = cycle_bytes(mk.spec, 1 + d, d, mk.num_tokens, mk.ex.config)
        nbytes = sum(v for k, v in parts.items() if k != "flops")
        floor_ms = nbytes / (bw.gbps * 1e9) * 1e3
        projected = PUBLISHED_ACCEPTANCE[d] / (med * 1e-3)
        report.timings.append(Timing("mk_cycle", f"27b.d{d}", f"ctx{mk.num_tokens}", med, spread, nbytes,
                                     {"roofline_frac": round(floor_ms / med, 3), "floor_ms": round(floor_ms, 3),
                                      "projected_tok_s": round(projected, 1), "bytes": parts}))
        print(f"  27B cycle d={d}: {med:.3f} ms ({floor_ms / med:.0%} of the floor {floor_ms:.2f} ms); projected "
              f"{projected:.0f} tok/s at the published acceptance (a projection)", flush=True)
        phase_profile(mk, report, d)


def phase_profile(mk, report: Report, d: int) -> None:
    """Device time per (stage, op) group of the last cycle launch, from the timing slots (top 12)."""
    program = mk.ex.programs["cycle"]
    times = mk.ex.read_timings("cycle")
    spans: dict[str, list[int]] = {}
    for sm, queue in enumerate(program.queues):
        for slot, index in enumerate(queue):
            inst = program.instructions[index]
            key = f"{inst.stage}.{inst.OPCODE.name}"
            start, end = int(times[sm, slot, 0]), int(times[sm, slot, 2])
            if start and end:
                span = spans.setdefault(key, [end, start])
                span[0], span[1] = min(span[0], start), max(span[1], end)
    ranked = sorted(((end - start) / 1e3, key) for key, (start, end) in spans.items())[::-1][:12]
    report.info.setdefault("mk_phases_us", {})[f"d{d}"] = {key: round(us, 1) for us, key in ranked}


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
    parser.add_argument("--tiles-per-sm", type=int, default=3, help="matmul instructions per SM and matrix")
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
               "--draft-vocab", str(args.draft_vocab), "--tiles-per-sm", str(args.tiles_per_sm)]
        codes[part] = subprocess.run(cmd).returncode
        path = Path(args.out) / f"mk_part_{part}.json"
        if path.exists():
            merged["parts"][part] = json.loads(path.read_text())
            path.unlink()
    merged["exit_codes"] = codes
    (Path(args.out) / "gpu_megakernel.json").write_text(json.dumps(merged, indent=1, default=float))
    print(json.dumps({"exit_codes": codes}, indent=1))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
