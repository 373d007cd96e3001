"""Sort the lines of a file (or standard input) and print them.

Usage: python sortlines.py [-n] [-r] [FILE]
"""

import argparse
import sys


def sort_lines(lines: list[str], numeric: bool = False, reverse: bool = False) -> list[str]:
    """Sort lines as text, or by their numeric value with numeric=True (bad numbers raise ValueError)."""
    if numeric:
        return sorted(lines, key=float)
    return sorted(lines, reverse=reverse)


def main(argv: list[str] | None = None) -> int:
    """Read the lines, sort them, print them."""
    parser = argparse.ArgumentParser(description="Sort lines of text.")
    parser.add_argument("file", nargs="?", help="file to read (default: standard input)")
    parser.add_argument("-n", "--numeric", action="store_true", help="compare lines as numbers")
    parser.add_argument("-r", "--reverse", action="store_true", help="print the lines in descending order")
    args = parser.parse_args(argv)
    if args.file:
        with open(args.file, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    else:
        lines = sys.stdin.read().splitlines()
    try:
        ordered = sort_lines(lines, numeric=args.numeric, reverse=args.reverse)
    except ValueError as exc:
        print(f"sortlines: {exc}", file=sys.stderr)
        return 1
    for line in ordered:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
