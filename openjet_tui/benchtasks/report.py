"""The results table, with a live progress display on a terminal and one line per run elsewhere."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from openjet_tui.benchtasks.results import TaskRun

_COLUMNS = ("task", "result", "wall s", "turns", "tools", "applied/rejected", "prompt/gen tok", "tok/s", "accept")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def run_row(run: TaskRun) -> list[str]:
    """One table row for a run, as plain strings."""
    m = run.metrics
    name = run.task if run.attempt == 1 else f"{run.task} #{run.attempt}"
    result = "pass" if run.passed else f"FAIL {run.failure}"
    return [
        name, result, f"{run.wall_s:.1f}", str(m.turns), str(m.tool_calls),
        f"{m.proposals_applied}/{m.proposals_rejected}", f"{m.prompt_tokens}/{m.generated_tokens}",
        _fmt(m.decode_tok_s, ".1f"), "-" if m.draft_acceptance is None else f"{100 * m.draft_acceptance:.0f} %",
    ]


def results_table(runs: list[TaskRun], summary: dict[str, Any] | None = None) -> Table:
    """A rich table of the runs so far, with the pass rate as its caption when the suite is done."""
    table = Table(title="openjet bench tasks", title_justify="left")
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column in ("task", "result") else "right")
    for run in runs:
        table.add_row(*run_row(run), style=None if run.passed else "red")
    if summary is not None:
        mean = summary["mean_wall_s_passed"]
        table.caption = (f"passed {summary['passed']}/{summary['runs']} ({100 * summary['pass_rate']:.0f} %)"
                         + (f", mean time to done {mean:.1f} s" if mean is not None else ""))
    return table


class Reporter:
    """Shows progress while the suite runs and the table at the end; quiet when JSON goes to stdout."""

    def __init__(self, console: Console | None = None, *, is_quiet: bool = False):
        self.console = console or Console()
        self.is_quiet = is_quiet
        self.runs: list[TaskRun] = []
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=self.console)
        self._bar = self._progress.add_task("starting", total=None)
        self._live: Live | None = None

    def start(self, total: int) -> None:
        """Begin a suite of `total` runs."""
        self._progress.update(self._bar, total=total)
        if not self.is_quiet and self.console.is_terminal:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
            self._live.start()

    def begin(self, task: str, attempt: int) -> None:
        """A run is starting."""
        self._progress.update(self._bar, description=f"{task}" + (f" #{attempt}" if attempt > 1 else ""))
        self._refresh()

    def note(self, message: str) -> None:
        """A line worth showing now (a rejected broken task, a setup problem)."""
        if not self.is_quiet:
            self.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def finish(self, run: TaskRun) -> None:
        """A run is done: add its row."""
        self.runs.append(run)
        self._progress.advance(self._bar)
        if self._live is not None:
            self._refresh()
        elif not self.is_quiet:
            self.console.print(" | ".join(run_row(run)), markup=False, highlight=False, soft_wrap=True)

    def skip(self) -> None:
        """A planned run that will not happen (its task was rejected)."""
        self._progress.advance(self._bar)
        self._refresh()

    def close(self, summary: dict[str, Any]) -> None:
        """Stop the live display and print the final table."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        if not self.is_quiet:
            self.console.print(results_table(self.runs, summary))

    def _render(self) -> Group:
        return Group(results_table(self.runs), self._progress)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())
