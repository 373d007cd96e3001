"""Prices and VAT. All amounts are integer cents."""

# VAT bands in whole percent.
VAT_PERCENT = {"standard": 20, "reduced": 5, "zero": 0}


def gross_price(net_cents: int, band: str = "standard") -> int:
    """Return the gross price in cents for a net price in a VAT band, rounding half up."""
    if band not in VAT_PERCENT:
        raise KeyError(f"unknown VAT band {band!r}")
    return (net_cents * (100 + VAT_PERCENT[band]) + 50) // 100


def format_cents(cents: int) -> str:
    """Format an amount in cents as pounds, e.g. 1234 -> '£12.34'."""
    return f"£{cents // 100}.{cents % 100:02d}"
