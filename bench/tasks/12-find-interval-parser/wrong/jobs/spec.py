"""Schedule specifications: the text users write in jobs.toml."""

import re
from dataclasses import dataclass

from jobs.units import SECONDS_PER

_PART = re.compile(r"(\d+)([hms])")


def parse_interval(text: str) -> int:
    """Parse an interval such as '1h30m', '10m' or '45s' into seconds."""
    text = text.strip()
    if not text or _PART.sub("", text):
        raise ValueError(f"bad interval: {text!r}")
    return sum(int(number) * SECONDS_PER[unit] for number, unit in _PART.findall(text))


@dataclass(frozen=True)
class Schedule:
    interval_seconds: int

    @classmethod
    def from_text(cls, text: str) -> "Schedule":
        """Parse 'every <interval>'."""
        words = text.split()
        if len(words) != 2 or words[0] != "every":
            raise ValueError(f"bad schedule: {text!r} (expected 'every <interval>')")
        seconds = parse_interval(words[1])
        if seconds <= 0:
            raise ValueError(f"bad interval: {words[1]!r} (must be more than zero)")
        return cls(seconds)
