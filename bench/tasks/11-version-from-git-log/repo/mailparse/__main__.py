"""python -m mailparse [--version] FILE: print the headers of a message."""

import sys

from mailparse import __version__
from mailparse.headers import parse_headers


def main(argv: list[str]) -> int:
    """Print the version, or each header of the message in FILE."""
    if argv == ["--version"]:
        print(f"mailparse {__version__}")
        return 0
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        for name, value in parse_headers(handle.read()).items():
            print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
