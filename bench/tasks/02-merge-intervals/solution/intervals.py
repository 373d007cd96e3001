"""Helpers for closed integer ranges, such as the hours a meeting room is booked."""

Interval = tuple[int, int]


def merge_intervals(intervals: list[Interval]) -> list[Interval]:
    """Merge overlapping or touching closed intervals.

    Each interval is (start, end) with both ends included. The input may be in any
    order and must not be modified. Two intervals are merged when they overlap or
    when one ends exactly where the next one starts: (1, 3) and (3, 5) become
    (1, 5), while (1, 3) and (4, 5) stay apart. The result is sorted by start.

    Raises ValueError if an interval has start > end.
    """
    for start, end in intervals:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) has start > end")
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def busy_hours(bookings: list[Interval]) -> int:
    """Return how many hours of the day are covered by at least one booking."""
    return sum(end - start for start, end in merge_intervals(bookings))
