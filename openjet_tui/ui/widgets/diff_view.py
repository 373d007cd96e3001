"""Syntax-highlighted diff hunks, unified or side by side, with old and new line numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.highlight import highlight
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from openjet_tui.agent.proposals import Hunk, Proposal

ADDED, REMOVED = "on $success-muted", "on $error-muted"
MAX_HIGHLIGHT_CHARS = 400_000  # larger files are shown plain: highlighting them would stall the screen


@dataclass(slots=True)
class DiffRow:
    """One row of a hunk: an old line, a new line, or both (context, or a paired change side by side)."""

    old_number: int | None
    new_number: int | None
    old: Content | None
    new: Content | None
    tag: str  # equal | delete | insert | replace


class HighlightedSides:
    """Both versions of a proposal's file, highlighted once and split into lines."""

    def __init__(self, proposal: Proposal):
        self.old = _highlight_lines(proposal.old_text or "", proposal.rel_path)
        self.new = _highlight_lines(proposal.new_text, proposal.rel_path)

    def old_line(self, index: int) -> Content:
        """Old line `index` (0-based)."""
        return self.old[index] if index < len(self.old) else Content("")

    def new_line(self, index: int) -> Content:
        """New line `index` (0-based)."""
        return self.new[index] if index < len(self.new) else Content("")


def _highlight_lines(text: str, path: str) -> list[Content]:
    if len(text) > MAX_HIGHLIGHT_CHARS:
        return [Content(line) for line in text.splitlines()]
    return highlight(text, path=path).split("\n") if text else []


def hunk_rows(hunk: Hunk, sides: HighlightedSides, side_by_side: bool) -> list[DiffRow]:
    """The rows of a hunk: unified lists removals then additions; side by side pairs them up."""
    rows: list[DiffRow] = []
    for tag, i1, i2, j1, j2 in hunk.ops:
        if tag == "equal":
            rows += [DiffRow(i + 1, j + 1, sides.old_line(i), sides.new_line(j), tag)
                     for i, j in zip(range(i1, i2), range(j1, j2))]
        elif side_by_side:
            for k in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + k, j1 + k
                rows.append(DiffRow(i + 1 if i < i2 else None, j + 1 if j < j2 else None,
                                    sides.old_line(i) if i < i2 else None, sides.new_line(j) if j < j2 else None,
                                    tag))
        else:
            rows += [DiffRow(i + 1, None, sides.old_line(i), None, "delete") for i in range(i1, i2)]
            rows += [DiffRow(None, j + 1, None, sides.new_line(j), "insert") for j in range(j1, j2)]
    return rows


def _number(value: int | None, width: int) -> str:
    return str(value).rjust(width) if value is not None else " " * width


def unified_lines(rows: list[DiffRow], width: int) -> list[Content]:
    """`old new ±code` lines, additions and removals tinted."""
    lines = []
    for row in rows:
        gutter = f"{_number(row.old_number, width)} {_number(row.new_number, width)} "
        if row.tag == "equal":
            lines.append(Content.assemble((gutter, "$text-muted"), "  ", row.new or Content("")))
        elif row.old is not None:
            lines.append(Content.assemble((gutter, "$text-muted"), ("- ", "bold $text-error"), row.old)
                         .stylize(REMOVED))
        else:
            lines.append(Content.assemble((gutter, "$text-muted"), ("+ ", "bold $text-success"),
                                          row.new or Content("")).stylize(ADDED))
    return lines


def side_lines(rows: list[DiffRow], width: int, side: str) -> list[Content]:
    """One column of a side-by-side hunk (`side` is "old" or "new"); blank rows keep the columns aligned."""
    lines = []
    for row in rows:
        number = row.old_number if side == "old" else row.new_number
        code = row.old if side == "old" else row.new
        if code is None:
            lines.append(Content(" " * (width + 1)))
            continue
        line = Content.assemble((_number(number, width) + " ", "$text-muted"), code)
        if row.tag != "equal":
            line = line.stylize(REMOVED if side == "old" else ADDED)
        lines.append(line)
    return lines


class HunkView(Widget):
    """One hunk, drawn unified or in two aligned columns."""

    DEFAULT_CSS = """
    HunkView { height: auto; }
    HunkView Horizontal { height: auto; }
    HunkView Static { width: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }
    HunkView .old-side { border-right: vkey $panel-lighten-2; }
    """
    side_by_side: reactive[bool] = reactive(False, recompose=True)

    def __init__(self, hunk: Hunk, sides: HighlightedSides, side_by_side: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.hunk, self.sides = hunk, sides
        self.set_reactive(HunkView.side_by_side, side_by_side)

    def compose(self) -> ComposeResult:
        """The hunk's rows in the current layout."""
        rows = hunk_rows(self.hunk, self.sides, self.side_by_side)
        width = len(str(max(self.hunk.old_end, self.hunk.new_end, 1)))
        if not self.side_by_side:
            yield Static(Content("\n").join(unified_lines(rows, width)))
            return
        with Horizontal():
            yield Static(Content("\n").join(side_lines(rows, width, "old")), classes="old-side")
            yield Static(Content("\n").join(side_lines(rows, width, "new")), classes="new-side")


def diff_stats(proposal: Proposal) -> str:
    """'+3 -1 in 2 hunks'."""
    added = sum(h.num_added for h in proposal.hunks)
    removed = sum(h.num_removed for h in proposal.hunks)
    count = len(proposal.hunks)
    return f"+{added} -{removed} in {count} hunk{'s' if count != 1 else ''}"
