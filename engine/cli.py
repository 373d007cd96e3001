"""openjet-engine: the inference engine's command line. Each subcommand lives beside the code it drives."""

from __future__ import annotations

import argparse
import importlib
import sys

from engine.errors import EngineError

# name -> (module, help). Each module defines add_arguments(parser) and run(args) -> int.
SUBCOMMANDS = {
    "make-test-model": ("engine.gguf.testmodel", "write a random-weight GGUF test model"),
    "generate": ("engine.reference.generate", "generate text from a GGUF model"),
    "serve": ("engine.server.main", "serve a model over OpenAI-compatible HTTP"),
    "compile": ("engine.cuda.compile_cmd", "compile the CUDA kernels for a GPU architecture into the disk cache"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per subcommand."""
    parser = argparse.ArgumentParser(prog="openjet-engine", description="OpenJet inference engine")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text)
        sub.set_defaults(module_name=module_name)
        module = importlib.import_module(module_name)
        module.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the openjet-engine script."""
    args = build_parser().parse_args(argv)
    module = importlib.import_module(args.module_name)
    try:
        return module.run(args)
    except EngineError as exc:
        print(f"openjet-engine: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
