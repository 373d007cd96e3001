"""Human-readable durations for the scheduler's log."""

from jobs.units import SECONDS_PER


def format_duration(seconds: int) -> str:
    """Format seconds as e.g. '1h30m', dropping zero parts; under a minute shows as '0m'."""
    parts = []
    for unit in ("h", "m"):
        amount, seconds = divmod(seconds, SECONDS_PER[unit])
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0m"
