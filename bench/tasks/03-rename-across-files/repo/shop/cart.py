"""The shopping cart."""

from dataclasses import dataclass, field

from shop.pricing import calc, format_cents


@dataclass
class Line:
    name: str
    net_cents: int
    quantity: int = 1
    band: str = "standard"


@dataclass
class Cart:
    lines: list[Line] = field(default_factory=list)

    def add(self, name: str, net_cents: int, quantity: int = 1, band: str = "standard") -> None:
        """Add a line to the cart."""
        self.lines.append(Line(name, net_cents, quantity, band))

    def total_cents(self) -> int:
        """Total gross price of the cart in cents."""
        return sum(calc(line.net_cents, line.band) * line.quantity for line in self.lines)

    def receipt(self) -> str:
        """A plain-text receipt, one line per item and a total."""
        rows = [
            f"{line.quantity} x {line.name}: {format_cents(calc(line.net_cents, line.band) * line.quantity)}"
            for line in self.lines
        ]
        rows.append(f"total: {format_cents(self.total_cents())}")
        return "\n".join(rows)
