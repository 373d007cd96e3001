"""Progress reporting shared by downloads, builds and engine start-up: plain events, rendered at the edges."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn


@dataclass(slots=True)
class ProgressEvent:
    """One step of a long task: `done` of `total` units (bytes, percent, seconds); total None when unknown."""

    task: str
    done: float
    total: float | None = None
    unit: str = "B"
    note: str = ""
    is_finished: bool = False


ProgressCallback = Callable[[ProgressEvent], None]


def no_progress(event: ProgressEvent) -> None:
    """A callback that drops every event (headless callers that report nothing)."""


def _format_amount(value: float, unit: str) -> str:
    if unit != "B":
        return f"{value:.0f}{unit}"
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if value >= scale:
            return f"{value / scale:.1f} {name}"
    return f"{value:.0f} B"


class TextProgress:
    """Prints one line per task at most every `interval` seconds: for logs, pipes and non-terminals."""

    def __init__(self, stream: TextIO | None = None, interval: float = 2.0):
        self.stream, self.interval = stream or sys.stderr, interval
        self._last_print: dict[str, float] = {}

    def __enter__(self) -> "TextProgress":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stream.flush()

    def __call__(self, event: ProgressEvent) -> None:
        """Print the event if it finishes a task or enough time has passed since this task's last line."""
        now = time.monotonic()
        if not event.is_finished and now - self._last_print.get(event.task, -1e9) < self.interval:
            return
        self._last_print[event.task] = now
        amount = _format_amount(event.done, event.unit)
        if event.total:
            amount += f" / {_format_amount(event.total, event.unit)} ({100 * event.done / event.total:.0f}%)"
        note = f" {event.note}" if event.note else ""
        status = " done" if event.is_finished else ""
        print(f"{event.task}: {amount}{note}{status}", file=self.stream, flush=True)


class RichProgress:
    """Terminal progress bars, one per task, as a context manager whose instance is the callback."""

    def __init__(self, console: Console | None = None):
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[amount]}"),
            TimeRemainingColumn(), TextColumn("{task.fields[note]}"), console=console or Console(stderr=True), transient=False,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> "RichProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()

    def __call__(self, event: ProgressEvent) -> None:
        """Create or advance the bar for the event's task."""
        amount = _format_amount(event.done, event.unit)
        if event.total:
            amount += f" / {_format_amount(event.total, event.unit)}"
        task_id = self._tasks.get(event.task)
        if task_id is None:
            task_id = self._progress.add_task(event.task, total=event.total, note=event.note, amount=amount)
            self._tasks[event.task] = task_id
        self._progress.update(task_id, completed=event.done, total=event.total, note=event.note, amount=amount)
        if event.is_finished:
            self._progress.update(task_id, completed=event.total or event.done)


def progress_for_terminal(stream: TextIO | None = None) -> RichProgress | TextProgress:
    """Rich bars on a terminal, plain lines elsewhere."""
    stream = stream or sys.stderr
    if stream.isatty():
        return RichProgress(Console(file=stream))
    return TextProgress(stream)
