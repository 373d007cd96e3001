"""`openjet bench tasks [--provider NAME --base-url URL --model NAME] [--tasks PATTERN] [--repeat N] [--json]`:
run the coding-task suite through the headless agent and score each run with its hidden check.

Exit codes: 0 the suite ran (whatever the pass rate); 1 a task was rejected as broken; 2 bad options or task
definitions; 3 the model server cannot be used."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from openjet_tui.benchtasks.agentrun import AgentTarget
from openjet_tui.benchtasks.errors import BenchTaskError, TaskDefinitionError
from openjet_tui.benchtasks.report import Reporter
from openjet_tui.benchtasks.results import BROKEN_TASK
from openjet_tui.benchtasks.runner import ServerUnusableError, SuiteOptions, run_suite
from openjet_tui.benchtasks.suite import load_suite
from openjet_tui.llm.providers import PROVIDERS

EXIT_OK, EXIT_BROKEN, EXIT_USAGE, EXIT_SERVER = 0, 1, 2, 3


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `openjet bench tasks`."""
    # Absent unless given, so `openjet --provider X bench tasks` keeps the option given before the subcommand.
    unset = argparse.SUPPRESS
    parser.add_argument("--provider", choices=list(PROVIDERS), default=unset, help="model server kind")
    parser.add_argument("--base-url", default=unset, help="server base URL, e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default=unset, help="model name to request (default: the first listed)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature sent with every request (default 0: greedy, repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed sent with every request (default 0)")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                        help="multiply every task's time limit by X (e.g. 4 for a CPU engine; recorded in the JSON)")
    parser.add_argument("--tasks", metavar="PATTERN",
                        help="comma-separated: globs on task names, name fragments or categories")
    parser.add_argument("--repeat", type=_positive_int, default=1, metavar="N", help="attempts per task")
    parser.add_argument("--json", action="store_true", help="print the results document as JSON on stdout")
    parser.add_argument("--list", action="store_true", help="list the selected tasks and exit")
    parser.add_argument("--suite", type=Path, metavar="DIR", help="task folder (default: bench/tasks)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep each run's workspace and agent events (events.jsonl) in DIR for inspection")
    parser.add_argument("--results-dir", type=Path, metavar="DIR", help="where to write JSON (default: bench/results)")


def list_tasks(args: argparse.Namespace) -> int:
    """Print the selected tasks: name, category, time limit and title."""
    for task in load_suite(args.suite, args.tasks):
        print(f"{task.name:34} {task.category:15} {task.time_limit_s:5.0f} s  {task.title}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Run the suite; returns the exit code."""
    err = Console(stderr=True)
    try:
        if args.list:
            return list_tasks(args)
        target = AgentTarget(*(getattr(args, name, None) for name in ("provider", "base_url", "model")),
                             temperature=args.temperature, seed=args.seed)
        options = SuiteOptions(target, args.tasks, args.repeat, args.suite, args.results_dir, keep_dir=args.keep,
                               time_scale=args.time_scale)
        # Off a terminal rich assumes 80 columns, which folds every cell; a log file can be wider.
        reporter = Reporter(Console(width=None if sys.stdout.isatty() else 160), is_quiet=args.json)
        document, path = run_suite(options, reporter)
    except ServerUnusableError as exc:
        err.print(f"openjet bench tasks: the model server cannot be used: {exc}", markup=False, soft_wrap=True)
        return EXIT_SERVER
    except (TaskDefinitionError, BenchTaskError) as exc:
        err.print(f"openjet bench tasks: error: {exc}", markup=False, soft_wrap=True)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        err.print(f"results written to {path}", markup=False, soft_wrap=True)
    return EXIT_BROKEN if document["summary"]["failures"].get(BROKEN_TASK) else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Run on its own: python -m openjet_tui.benchtasks.cli."""
    parser = argparse.ArgumentParser(prog="openjet bench tasks")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
