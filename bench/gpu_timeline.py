"""The kernels of a graph-replayed 27B pass on one timeline: where a pass's time goes, kernel by kernel.

CUPTI (through torch.profiler, which the GPU machine has) records each kernel of a CUDA graph replay with its
start and end on the GPU. Under programmatic dependent launch a kernel's blocks start before its predecessor ends
and wait, so a kernel's own span overstates it; what it adds to the pass is how much later it ends than every
kernel that ended before it (its `increment`: its boundary, its wait and its work). The increments of a replay add
up to the replay's wall time, so their sums by kernel name split the pass exactly, with PDL on, where the
ablation's figures do not (bench/NOTES.md: under PDL a producer class came out negative). Streams are not used:
CUPTI reports a graph's kernels on whatever streams the graph executor picked. A kernel that runs wholly inside
another's span (Device.beside: DeltaNet's alpha | beta beside qkv) is counted beside it, adding nothing: ordered by
end it would take the first part of the longer kernel's time, which the pass would spend without it too (an H100
run of 2026-12-06 read 6 us a layer off alpha | beta that way; removing the launch saved none of it: bench/NOTES.md
Z3).

  python bench/gpu_check.py --parts model27b,timeline      (the 27B file from model27b, or OPENJET_27B)
  OPENJET_BENCH_VARIANTS=v7,noq6b ... --parts timeline    (each variant of bench/gpu_bench27b.py in turn)

Last, one prefill chunk of the engine's size (eager launches) the same way (prefill_chunk).

summarize() is plain Python over spans, tested without a GPU (tests/bench/test_gpu_timeline.py).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TOKEN_COUNTS = (1, 5)  # the passes issue 4's targets name
TOKENS_ENV = "OPENJET_TIMELINE_TOKENS"  # other token counts, comma-separated (4,5: where the fifth token's time goes)


def token_counts() -> tuple[int, ...]:
    """TOKENS_ENV's counts, else TOKEN_COUNTS."""
    raw = os.environ.get(TOKENS_ENV, "")
    return tuple(int(x) for x in raw.split(",") if x) or TOKEN_COUNTS
REPLAYS = 5  # profiled replays a pass, each in a profiler session of its own; the one of median wall is reported
TOP = 12  # kernel names and gaps a pass prints
# Kernel classes by instance-name prefix, summed first (the first class whose prefix matches takes a kernel): the
# pass split as the ablation classes split it (bench/gpu_bench27b.py ABLATION), here from one replay's timeline.
CLASSES = (("matmuls", ("mmvq", "mmv_", "gemm")), ("producers", ("act_",)),
           ("attention", ("attn", "qk_prep", "kv_store")), ("deltanet", ("gdn", "conv")))


def class_of(name: str) -> str:
    """The CLASSES entry a kernel's instance name falls in, else "other" (norms, rope, embedding, argmax)."""
    return next((label for label, prefixes in CLASSES if name.startswith(prefixes)), "other")


@dataclass(frozen=True, slots=True)
class Span:
    """One kernel on the GPU: its instance name (kernels/*.cu, engine/cuda/instances.py) where known, its start
    and end (us) and its stream."""

    name: str
    start: float
    end: float
    stream: int


def instance_names() -> dict[str, str]:
    """NVRTC name expression -> instance name, to read CUPTI's demangled kernel names ("void mmvq_i8b<2, 2, -1,
    -1>(TensorMap, ...)")."""
    from engine.cuda import instances

    return {inst.expr.replace(" ", ""): inst.name for inst in instances.INSTANCES.values()}


def kernel_name(raw: str, names: dict[str, str]) -> str:
    """The instance name of a demangled kernel name, or the name without its return type and arguments."""
    base = re.sub(r"^void\s+", "", raw)
    depth, cut = 0, len(base)
    for i, ch in enumerate(base):  # the argument list: the first "(" outside template brackets
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            cut = i
            break
    base = base[:cut].strip()
    return names.get(base.replace(" ", ""), base)


def spans_of_trace(trace: dict, names: dict[str, str]) -> list[Span]:
    """The kernels of a Chrome trace as torch.profiler exports it (events of category "kernel"), by start."""
    spans = [Span(kernel_name(e["name"], names), float(e["ts"]), float(e["ts"]) + float(e["dur"]),
                  int(e.get("args", {}).get("stream", 0)))
             for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X"]
    return sorted(spans, key=lambda s: (s.start, s.end))


@dataclass(slots=True)
class Summary:
    """One replay: its wall time (first start to last end), its kernels and the streams CUPTI put them on, each
    name's count, sum of increments and of spans, and the largest increments with the kernel that ended before."""

    wall_us: float
    kernels: int
    streams: int
    by_name: dict[str, tuple[int, float, float]]  # name -> (count, sum of increments, sum of spans)
    largest: list[tuple[float, str, str]]  # (increment, kernel, the kernel that ended last before it)
    beside: dict[str, int]  # name -> its kernels that ran inside another's span


def beside_others(spans: list[Span]) -> set[int]:
    """Indices of the spans lying wholly inside an earlier-starting (or, at the same start, longer or earlier
    listed) span: kernels that ran beside another one."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i].start, -spans[i].end, i))
    inside, reach = set(), float("-inf")
    for i in order:
        if spans[i].end <= reach:
            inside.add(i)
        reach = max(reach, spans[i].end)
    return inside


def summarize(spans: list[Span]) -> Summary:
    """The increments of one replay's kernels, ordered by end: how much later each ends than all before it (none
    for a kernel ending inside the others' time; the first: its own span), so that they sum to the wall time. A
    kernel inside another's span (beside_others) adds nothing: the one around it takes that time."""
    if not spans:
        raise ValueError("no kernels in the replay: did the profiler see the graph's kernels?")
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    beside: dict[str, int] = defaultdict(int)
    largest = []
    inside = beside_others(spans)
    frontier, before = min(s.start for s in spans), "(start)"
    for i in sorted(range(len(spans)), key=lambda i: spans[i].end):
        s = spans[i]
        entry = by_name[s.name]
        entry[0] += 1
        entry[2] += s.end - s.start
        if i in inside:
            beside[s.name] += 1
            continue
        inc = max(0.0, s.end - frontier)
        entry[1] += inc
        largest.append((inc, s.name, before))
        if s.end >= frontier:
            frontier, before = s.end, s.name
    wall = max(s.end for s in spans) - min(s.start for s in spans)
    return Summary(wall, len(spans), len({s.stream for s in spans}),
                   {k: (int(v[0]), v[1], v[2]) for k, v in by_name.items()}, sorted(largest, reverse=True)[:TOP],
                   dict(beside))


def table(summary: Summary, title: str) -> str:
    """The summary as lines: the wall, then the names by their share of it, then the largest increments."""
    classes: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, (count, inc, _) in summary.by_name.items():
        classes[class_of(name)][0] += count
        classes[class_of(name)][1] += inc
    split = ", ".join(f"{label} {inc / 1e3:.3f} ms / {int(count)}" for label, (count, inc) in
                      sorted(classes.items(), key=lambda kv: -kv[1][1]))
    lines = [f"{title}: {summary.wall_us / 1e3:.3f} ms wall, {summary.kernels} kernels on {summary.streams} "
             f"stream(s)", f"  by class (increments / kernels): {split}"]
    if summary.beside:
        lines.append("  beside another kernel (adding nothing): " +
                     ", ".join(f"{name} {count}" for name, count in sorted(summary.beside.items())))
    lines.append("  name                                   count  increments ms  (share)  mean us  spans ms")
    for name, (count, inc, span) in sorted(summary.by_name.items(), key=lambda kv: -kv[1][1])[:TOP]:
        lines.append(f"  {name:<38} {count:5d}  {inc / 1e3:13.3f}  ({inc / summary.wall_us:5.1%})  "
                     f"{inc / count:7.2f}  {span / 1e3:8.3f}")
    lines.append("  largest increments (us, kernel, after the kernel that ended last before it):")
    lines += [f"    {inc:7.2f}  {name}  after {before}" for inc, name, before in summary.largest]
    return "\n".join(lines)


def as_json(summary: Summary) -> dict:
    return {"wall_us": round(summary.wall_us, 2), "kernels": summary.kernels, "streams": summary.streams,
            "by_name": {k: {"count": c, "increments_us": round(i, 2), "spans_us": round(s, 2)}
                        for k, (c, i, s) in summary.by_name.items()},
            "largest": [[round(i, 2), n, b] for i, n, b in summary.largest], "beside": summary.beside}


def profile_replays(dev, graph, replays: int = REPLAYS) -> list[list[Span]]:
    """Each replay's kernels, one profiler session a replay (after warm-up replays outside the profiler)."""
    for _ in range(3):
        graph.launch()
    dev.synchronize()
    return [profile_call(dev, graph.launch) for _ in range(replays)]


def profile_call(dev, fn) -> list[Span]:
    """The kernels of one call of fn (a graph replay, or eager launches: a prefill chunk), in a profiler session of
    their own."""
    import torch  # the GPU machine's; CUPTI's records arrive through its profiler
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            dev.synchronize()
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return spans_of_trace(json.loads(path.read_text()), instance_names())


def run_timeline(report, args) -> None:
    """Each variant's passes of token_counts() tokens after a 512-token prompt: the median replay's summary; then
    one prefill chunk of the engine's size (v7)."""
    import numpy as np

    from bench.gpu_bench27b import CONTEXT, VARIANTS, _decode_sanity, _model_file, _use_variant
    from engine.cuda.backend import CudaBackend

    path = _model_file(report)
    backend = CudaBackend.from_gguf(path, context_size=CONTEXT, max_tokens=None, mtp=False)  # its prefill chunk
    chosen = [v for v in os.environ.get("OPENJET_BENCH_VARIANTS", "v7").split(",") if v]
    results = report.info.setdefault("timeline", {})
    try:
        for name in chosen:
            if name not in VARIANTS:
                raise SystemExit(f"OPENJET_BENCH_VARIANTS: no variant {name!r} in bench/gpu_bench27b.py")
            _use_variant(backend, name)
            _decode_sanity(backend, report, f".timeline.{name}")
            rng = np.random.default_rng(7)
            for t in token_counts():
                tokens = [int(x) for x in rng.integers(0, backend.vocab_size, size=t)]
                backend.verify(tokens)  # eager run + capture
                backend.verify(tokens)
                replays = profile_replays(backend.dev, backend._graphs[(t, False, t)])
                if not all(replays):
                    report.notes.append(f"timeline {name} T={t}: the profiler saw no kernels")
                    print(f"timeline {name} T={t}: the profiler saw no kernels", flush=True)
                    continue
                summaries = sorted((summarize(spans) for spans in replays), key=lambda s: s.wall_us)
                median = summaries[len(summaries) // 2]
                results[f"{name}.T{t}"] = as_json(median) | {
                    "walls_us": [round(s.wall_us, 2) for s in summaries],
                    "wall_median_us": round(statistics.median(s.wall_us for s in summaries), 2)}
                print(table(median, f"timeline {name} T={t} (median of {len(summaries)} replays)"), flush=True)
        _use_variant(backend, "v7")
        prefill_chunk(backend, report, results)
    finally:
        _use_variant(backend, "v7")
        backend.close()


def prefill_chunk(backend, report, results: dict) -> None:
    """One prefill chunk (the engine's size, eager launches after one unprofiled run) on the timeline: what each
    kernel adds to its wall time, so that a launch beside the main stream (the DeltaNet's gates, attn_k) counts for
    what it delays rather than for its event span, which includes its wait for SMs held by the persistent GEMM."""
    import numpy as np

    n, rng = backend.prefill_chunk, np.random.default_rng(4)
    tokens = [int(x) for x in rng.integers(0, backend.vocab_size, size=n)]

    def chunk() -> None:
        backend.model.set_tokens(tokens, 0)
        backend.model.forward(n, True, 0)

    chunk()
    backend.dev.synchronize()
    spans = profile_call(backend.dev, chunk)
    if not spans:
        report.notes.append(f"timeline prefill{n}: the profiler saw no kernels")
        return
    summary = summarize(spans)
    results[f"prefill{n}"] = as_json(summary)
    print(table(summary, f"timeline prefill{n} (one chunk)"), flush=True)
