"""Hidden check: intervals accept seconds alone and combined with hours and minutes."""

import pytest

from jobs.logfmt import format_duration
from jobs.scheduler import Scheduler
from jobs.spec import Schedule, parse_interval


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45s", 45), ("2m15s", 135), ("1h30m", 5400), ("10m", 600), ("1h0m5s", 3605), ("24h", 86400), ("90s", 90)],
)
def test_parse_interval(text, seconds):
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "45", "45x", "1d", "5 s", "m10"])
def test_bad_intervals_still_rejected(text):
    with pytest.raises(ValueError):
        parse_interval(text)


def test_schedule_in_seconds():
    assert Schedule.from_text("every 45s").interval_seconds == 45
    with pytest.raises(ValueError):
        Schedule.from_text("every 0s")


def test_scheduler_runs_second_jobs():
    scheduler = Scheduler()
    scheduler.add("ping", "every 30s")
    scheduler.add("sync", "every 1m")
    assert [job.name for job in scheduler.due(0.0)] == ["ping", "sync"]
    assert [job.name for job in scheduler.due(30.0)] == ["ping"]
    assert [job.name for job in scheduler.due(60.0)] == ["ping", "sync"]


def test_log_format_unchanged_for_whole_minutes():
    assert format_duration(5400) == "1h30m"
    assert format_duration(600) == "10m"
