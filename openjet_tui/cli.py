"""openjet: the application's command line. Plain `openjet` opens the full-screen app; each subcommand lives in
the module named in SUBCOMMANDS, which defines add_arguments(parser) and run(args) -> int."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, help). Add a subcommand by adding a line here and a module with add_arguments and run.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("openjet_tui.agent.headless", "run one task without the full-screen app"),
    "sessions": ("openjet_tui.agent.transcript", "list, show or export stored sessions"),
    "config": ("openjet_tui.config", "show the merged settings and where each value came from"),
    "setup": ("openjet_tui.runtime.setup_cmd", "find the hardware, fetch the model (verified), choose the engine"),
    "doctor": ("openjet_tui.runtime.doctor_cmd", "show the hardware, the model and every engine decision with why"),
    "bench": ("openjet_tui.runtime.bench_cmd", "measure the engine (and llama-server) on a fixed prompt set"),
    "bench tasks": ("openjet_tui.benchtasks.cli", "run the coding-task suite through the agent and score it"),
}
APP_MODULE = "openjet_tui.ui.app"  # defines main(args: argparse.Namespace) -> int


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (app options) with one subparser per subcommand."""
    from openjet_tui.agent.headless import add_agent_options

    parser = argparse.ArgumentParser(prog="openjet", description="OpenJet: a local coding agent. Without a "
                                     "subcommand, opens the full-screen app.")
    add_agent_options(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers: dict[str, argparse.ArgumentParser] = {}
    nested: dict[str, argparse._SubParsersAction] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        parent, _, child = name.rpartition(" ")  # "bench tasks": `tasks` under `bench` (listed after it)
        group = nested.setdefault(parent, parsers[parent].add_subparsers(metavar="SUITE")) if parent else subparsers
        sub = parsers[name] = group.add_parser(child, help=help_text, description=help_text)
        sub.set_defaults(module_name=module_name)
        importlib.import_module(module_name).add_arguments(sub)
    return parser


def open_app(args: argparse.Namespace) -> int:
    """Open the Textual app with the same options as `openjet run`."""
    try:
        app = importlib.import_module(APP_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != APP_MODULE:
            raise
        print("openjet: the full-screen app is not part of this build yet; run a task with "
              '`openjet run "TASK"` (see `openjet run --help`)', file=sys.stderr)
        return 2
    return int(app.main(args))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the openjet script."""
    args = build_parser().parse_args(argv)
    try:
        if args.command is None:
            return open_app(args)
        return int(importlib.import_module(args.module_name).run(args))
    except BrokenPipeError:  # output piped into a reader that stopped early (e.g. `| head`)
        sys.stdout = open(os.devnull, "w")
        return 0


if __name__ == "__main__":
    sys.exit(main())
