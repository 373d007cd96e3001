"""Stock levels read from a CSV export."""

import csv
from pathlib import Path


def load_stock(path: Path) -> dict[str, int]:
    """Item name -> quantity on hand."""
    stock = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            stock[row["item"]] = int(row["quantity"])
    return stock


def low_stock(stock: dict[str, int], limit: int = 5) -> list[str]:
    """Items at or below the limit, sorted by name."""
    return sorted(name for name, quantity in stock.items() if quantity <= limit)
