"""Time units shared by the scheduler and the log formatter."""

SECONDS_PER = {"h": 3600, "m": 60, "s": 1}
