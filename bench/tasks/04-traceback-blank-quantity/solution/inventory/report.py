"""Print the total stock per warehouse from a CSV export.

Usage: python -m inventory.report EXPORT.csv
"""

import csv
import sys
from collections import defaultdict


def parse_quantity(text: str) -> int:
    """Parse the quantity column; the export writes whole numbers such as "12".

    An empty field means the item is out of stock and counts as 0.
    """
    if not text.strip():
        return 0
    return int(text)


def totals_by_warehouse(rows: list[dict[str, str]]) -> dict[str, int]:
    """Sum the quantity of every row per warehouse."""
    totals: dict[str, int] = defaultdict(int)
    for row in rows:
        totals[row["warehouse"]] += parse_quantity(row["quantity"])
    return dict(totals)


def load_rows(path: str) -> list[dict[str, str]]:
    """Read the export as a list of dicts keyed by column name."""
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def main(argv: list[str]) -> int:
    """Print one line per warehouse, sorted by name."""
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    totals = totals_by_warehouse(load_rows(argv[0]))
    for warehouse, total in sorted(totals.items()):
        print(f"{warehouse}: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
