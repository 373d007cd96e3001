"""Reproduce the task-suite results quoted in the README: `openjet bench tasks` per model and engine, each server
started the way OpenJet starts it, greedy (temperature 0, seed 0), JSON to bench/results/tasks-<model>-<engine>-
<date>.json with the server's command line, the model file's sha256 and the machine beside the numbers.

    python bench/run_task_results.py --list                              # the published runs
    python bench/run_task_results.py --run 0.5b-llama-server             # one of them
    python bench/run_task_results.py --model qwen2.5-coder-1.5b --engine reference --tasks 05-*,08-* --time-scale 4

Models come from the catalog (assets/catalog.toml) and are fetched and sha256-checked if missing. Engines: `reference`
(`openjet-engine serve --backend reference`, numpy on the CPU) and `llama-server` (the build OpenJet's runtime finds,
with OpenJet's own options). Run it under `nice` on a shared machine; the server is stopped however the run ends.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from openjet_tui.cli import main as openjet_main  # noqa: E402
from openjet_tui.runtime.catalog import ModelEntry, load_catalog  # noqa: E402
from openjet_tui.runtime.download import fetch_model  # noqa: E402
from openjet_tui.runtime.engines import engine_command, gather_facts  # noqa: E402
from openjet_tui.runtime.errors import RuntimeSetupError  # noqa: E402
from openjet_tui.runtime.worker import EngineWorker, WorkerSpec  # noqa: E402

RESULTS_DIR = REPO / "bench" / "results"
ENGINES = ("reference", "llama-server")
PROVIDER_OF = {"reference": "openjet", "llama-server": "llama-server"}  # how the agent is told to talk to each
CONTEXT = 16384  # both models' catalog default; the task conversations stay far below it
START_TIMEOUT_S = 900.0  # the reference engine dequantizes every weight at load: minutes on a busy CPU


@dataclass(slots=True)
class PlannedRun:
    """One published run: a model, an engine, which tasks, how often, and how much the time limits stretch."""

    name: str
    model: str
    engine: str
    tasks: str | None = None  # None: every task
    repeat: int = 1
    time_scale: float = 1.0
    note: str = ""


# The runs behind the README's table. Every run stretches the time limits 4x: the reference engine runs the float32
# math of the specification on two shared CPU cores, several times slower than llama-server's quantized kernels, and
# llama-server's two threads stall whenever another process takes a core. The question these runs answer is what each
# model does through each engine, not how fast a busy CPU is; wall times and tok/s are recorded all the same.
SCALE = 4.0
PUBLISHED: tuple[PlannedRun, ...] = (
    PlannedRun("0.5b-llama-server", "qwen2.5-coder-0.5b", "llama-server", time_scale=SCALE),
    PlannedRun("0.5b-llama-server-repeat", "qwen2.5-coder-0.5b", "llama-server", tasks="10-*", repeat=2,
               time_scale=SCALE, note="greedy determinism: the same task twice gives the same pass/fail"),
    PlannedRun("1.5b-llama-server", "qwen2.5-coder-1.5b", "llama-server", time_scale=SCALE),
    PlannedRun("0.5b-reference", "qwen2.5-coder-0.5b", "reference", time_scale=SCALE),
    PlannedRun("1.5b-reference", "qwen2.5-coder-1.5b", "reference", time_scale=SCALE),
)


def model_file(name: str) -> tuple[ModelEntry, Path, str]:
    """The catalog entry, its verified file (fetched if missing) and the file's sha256."""
    entry = load_catalog().get(name)
    fetched = fetch_model(entry, progress=lambda event: None)
    if not fetched.is_pinned:
        raise RuntimeSetupError(f"{entry.title}: the catalog pins no sha256, so results could not name the file")
    return entry, fetched.path, fetched.sha256


def start_server(engine: str, path: Path) -> tuple[EngineWorker, list[str]]:
    """Start the engine on the model file as OpenJet does; returns the running worker and its command line."""
    facts = gather_facts(path, context=CONTEXT, probe_local=False)
    if engine == "llama-server" and facts.llama_server is None:
        raise RuntimeSetupError("no llama-server build found: build one with `python -m openjet_tui.runtime.llamacpp`")
    command = engine_command(engine, path, CONTEXT, facts)
    worker = EngineWorker(WorkerSpec(name=f"tasks-{engine}", command=command, max_restarts=0,
                                     start_timeout_s=START_TIMEOUT_S))
    return worker.start(), command


def bench_arguments(run: PlannedRun, base_url: str, results_dir: Path, keep: Path | None) -> list[str]:
    """The `openjet bench tasks` command line for a run (greedy with a fixed seed is the harness default)."""
    argv = ["bench", "tasks", "--provider", PROVIDER_OF[run.engine], "--base-url", base_url, "--model", run.model,
            "--repeat", str(run.repeat), "--time-scale", str(run.time_scale), "--results-dir", str(results_dir)]
    if run.tasks:
        argv += ["--tasks", run.tasks]
    if keep is not None:
        argv += ["--keep", str(keep)]
    return argv


def annotate(document: dict[str, Any], run: PlannedRun, command: list[str], entry: ModelEntry, sha256: str,
             health: dict[str, Any]) -> dict[str, Any]:
    """Add what the harness cannot know: the engine, its command line and the model file."""
    document["server"] = {"engine": run.engine, "command": [Path(command[0]).name, *command[1:]],
                          "health": health, "context": CONTEXT}
    document["model_file"] = {"name": entry.name, "title": entry.title, "filename": entry.filename,
                              "sha256": sha256, "size": entry.size}
    document["plan"] = {"name": run.name, "tasks": run.tasks or "all", "note": run.note}
    return document


def execute(run: PlannedRun, keep: Path | None = None) -> Path:
    """Fetch the model, start the server, run the suite, stop the server; returns the results file."""
    entry, path, sha256 = model_file(run.model)
    print(f"[{run.name}] {entry.title} ({sha256[:12]}) on {run.engine}", flush=True)
    worker, command = start_server(run.engine, path)
    try:
        print(f"[{run.name}] server ready at {worker.base_url} (log {worker.log_path})", flush=True)
        with tempfile.TemporaryDirectory(prefix="openjet-task-results-") as scratch:
            code = openjet_main(bench_arguments(run, f"{worker.base_url}/v1", Path(scratch), keep))
            written = sorted(Path(scratch).glob("tasks-*.json"))
            if code not in (0, 1) or not written:
                raise RuntimeError(f"openjet bench tasks exited {code} without results")
            document = annotate(json.loads(written[-1].read_text()), run, command, entry, sha256,
                                worker.health_info)
    finally:
        worker.stop()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"tasks-{run.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"[{run.name}] {summary_line(document)} -> {out.relative_to(REPO)}", flush=True)
    return out


def summary_line(document: dict[str, Any]) -> str:
    """Pass rate, mean wall time, tokens, decode speed and failure counts of one results document."""
    tasks, summary = document["tasks"], document["summary"]
    scored = [t for t in tasks if t["failure"] != "broken-task"]
    wall = sum(t["wall_s"] for t in scored) / max(1, len(scored))
    prompt = sum(t["prompt_tokens"] for t in scored)
    generated = sum(t["generated_tokens"] for t in scored)
    speeds = [(t["decode_tok_s"], t["generated_tokens"]) for t in scored if t["decode_tok_s"]]
    weight = sum(n for _, n in speeds)
    decode = sum(s * n for s, n in speeds) / weight if weight else None
    failures = ", ".join(f"{k} {v}" for k, v in summary["failures"].items()) or "none"
    return (f"passed {summary['passed']}/{summary['runs']} ({100 * summary['pass_rate']:.0f} %), mean wall "
            f"{wall:.0f} s, prompt {prompt} / generated {generated} tokens, decode "
            f"{'-' if decode is None else f'{decode:.1f}'} tok/s, failures: {failures}")


def custom_run(args: argparse.Namespace) -> PlannedRun:
    """A run described on the command line instead of by name."""
    if args.engine not in ENGINES:
        raise SystemExit(f"--engine must be one of {', '.join(ENGINES)}")
    name = f"{args.model.removeprefix('qwen2.5-coder-')}-{args.engine}"
    return PlannedRun(name, args.model, args.engine, args.tasks, args.repeat, args.time_scale)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the published runs and exit")
    parser.add_argument("--run", action="append", metavar="NAME", help="a published run by name (repeatable)")
    parser.add_argument("--all", action="store_true", help="every published run, in order")
    parser.add_argument("--model", help="catalog model name, for a run not in the published list")
    parser.add_argument("--engine", choices=ENGINES, help="engine for --model")
    parser.add_argument("--tasks", help="task pattern for --model (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="attempts per task for --model")
    parser.add_argument("--time-scale", type=float, default=1.0, help="time limit multiplier for --model")
    parser.add_argument("--keep", type=Path, help="keep workspaces and agent events here (a new folder)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the selected runs one after another."""
    args = parse_args(argv)
    by_name = {run.name: run for run in PUBLISHED}
    if args.list:
        for run in PUBLISHED:
            print(f"{run.name:26} {run.model:20} {run.engine:13} tasks {run.tasks or 'all':26} x{run.repeat} "
                  f"time x{run.time_scale:g}  {run.note}")
        return 0
    unknown = [name for name in args.run or [] if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown run {unknown[0]!r}; --list shows them")
    runs = list(PUBLISHED) if args.all else [by_name[name] for name in args.run or []]
    if args.model:
        runs.append(custom_run(args))
    if not runs:
        raise SystemExit("nothing to run: give --run NAME, --all or --model with --engine (see --list)")
    for run in runs:
        execute(run, args.keep / run.name if args.keep else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
