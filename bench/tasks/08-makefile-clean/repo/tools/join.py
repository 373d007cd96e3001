"""Join the handbook pages in a folder into one file, in name order.

Usage: join.py SRC_DIR OUT_FILE | join.py --check SRC_DIR
"""

import sys
from pathlib import Path


def pages(folder: Path) -> list[Path]:
    """The .txt pages of the folder sorted by name; each must start with a title line."""
    found = sorted(folder.glob("*.txt"))
    for page in found:
        first = page.read_text(encoding="utf-8").splitlines()[:1]
        if not first or not first[0].strip():
            raise SystemExit(f"{page}: the first line must be a title")
    return found


def main(argv: list[str]) -> int:
    """Check or join the pages."""
    if len(argv) == 2 and argv[0] == "--check":
        print(f"{len(pages(Path(argv[1])))} pages ok")
        return 0
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages(Path(argv[0])))
    Path(argv[1]).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
