"""`openjet bench [--model NAME|PATH] [--vs llama-server]`: OpenJet's engine and, side by side, llama-server on the
same model file, each started as a worker, measured on the fixed prompt set, and stopped."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from openjet_tui.runtime.bench import EngineBench, bench_endpoint, format_table
from openjet_tui.runtime.catalog import load_catalog
from openjet_tui.runtime.download import find_ready_model
from openjet_tui.runtime.engines import Facts, engine_command, gather_facts, select_engine
from openjet_tui.runtime.errors import EngineStartError, RuntimeSetupError
from openjet_tui.runtime.setup import is_setup_current, read_record
from openjet_tui.runtime.worker import EngineWorker, WorkerSpec

OUR_ENGINES = ("megakernel", "cuda", "reference")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `openjet bench`."""
    parser.add_argument("--model", metavar="NAME|PATH", help="a verified catalog model or a .gguf file "
                                                             "(default: the model of the last setup)")
    parser.add_argument("--vs", choices=("llama-server",), help="also measure llama-server on the same file")
    parser.add_argument("--only-vs", action="store_true", help="measure only the --vs engine")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    parser.add_argument("--ctx", type=int, default=8192, help="context window of the servers (default 8192)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON results to this file")


def resolve_bench_model(spec: str | None) -> Path:
    """The model file to measure: a path, a verified catalog model, or the last setup's model."""
    if spec is None:
        record = read_record()
        if not is_setup_current(record):
            raise RuntimeSetupError("no model is set up yet: run `openjet setup` or pass --model")
        assert record is not None
        return Path(record.model_path)
    if Path(spec).expanduser().is_file():
        return Path(spec).expanduser().resolve()
    entry = load_catalog().get(spec)
    path = find_ready_model(entry)
    if path is None:
        raise RuntimeSetupError(f"{entry.title} is not downloaded and verified: run `openjet setup --model {spec}`")
    return path


def _measure(engine: str, reason: str, model: Path, facts: Facts, args: argparse.Namespace) -> EngineBench:
    command = engine_command(engine, model, args.ctx, facts)
    try:
        worker = EngineWorker(WorkerSpec(name=f"bench-{engine}", command=command, max_restarts=0)).start()
    except EngineStartError as error:
        return EngineBench(engine, reason, error=str(error).splitlines()[0])
    try:
        return bench_endpoint(engine, reason, f"{worker.base_url}/v1", max_tokens=args.max_tokens)
    finally:
        worker.stop()


def run_benchmarks(model: Path, args: argparse.Namespace) -> list[EngineBench]:
    """Measure OpenJet's best engine for this file, and llama-server when asked."""
    facts = gather_facts(model, context=args.ctx, probe_local=False)
    selection = select_engine(facts)
    benches = []
    if not args.only_vs:
        ours = next((d for d in selection.decisions if d.engine in OUR_ENGINES and d.is_available), None)
        if ours is None:
            why = "; ".join(f"{d.label}: {d.reason}" for d in selection.decisions if d.engine in OUR_ENGINES)
            benches.append(EngineBench("openjet", "", error=f"no OpenJet engine can serve here ({why})"))
        else:
            benches.append(_measure(ours.engine, ours.reason, model, facts, args))
    if args.vs == "llama-server":
        peer = next(d for d in selection.decisions if d.engine == "llama-server")
        if facts.llama_server is None:
            benches.append(EngineBench("llama-server", peer.reason, error=peer.reason))
        else:
            benches.append(_measure("llama-server", peer.reason, model, facts, args))
    return benches


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit 0 when every requested engine was measured."""
    try:
        model = resolve_bench_model(args.model)
        benches = run_benchmarks(model, args)
    except RuntimeSetupError as error:
        print(f"openjet bench: error: {error}", file=sys.stderr)
        return 2
    facts = gather_facts(model, probe_local=False)
    document = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": _commit(), "model": str(model),
                "hardware": facts.hardware.gpu_summary(), "max_tokens": args.max_tokens,
                "engines": [asdict(b) | {"summary": b.summary()} for b in benches]}
    if args.out:
        args.out.write_text(json.dumps(document, indent=1))
    print(json.dumps(document, indent=1) if args.json else "\n".join(format_table(benches)))
    return 0 if all(b.results and not b.error for b in benches) else 1


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own (python -m openjet_tui.runtime.bench_cmd)."""
    parser = argparse.ArgumentParser(prog="openjet bench")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
