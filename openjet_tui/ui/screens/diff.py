"""/diff: every change the session applied, file by file, unified or side by side."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from openjet_tui.agent.proposals import Proposal
from openjet_tui.ui.widgets.diff_view import HighlightedSides, HunkView, diff_stats


class DiffScreen(ModalScreen[None]):
    """Read-only diffs; v switches the layout, esc closes."""

    CSS_PATH = "diff.tcss"
    BINDINGS = [Binding("escape,q", "dismiss", "Close"), Binding("v", "toggle_view", "Unified / side by side")]

    def __init__(self, changes: list[Proposal], **kwargs: Any):
        super().__init__(**kwargs)
        self.changes = changes

    def compose(self) -> ComposeResult:
        """One header and its hunks per file."""
        with VerticalScroll(id="diff-box") as box:
            box.border_title = "changes applied in this session (v: side by side, esc: close)"
            if not self.changes:
                yield Static("No applied changes in this session.", id="diff-empty")
            for proposal in self.changes:
                sides = HighlightedSides(proposal)
                yield Static(Content.from_markup("[b]$path[/b]  [dim]$stats[/dim]", path=proposal.rel_path,
                                                 stats=diff_stats(proposal)), classes="diff-file")
                for hunk in proposal.hunks:
                    yield HunkView(hunk, sides)

    def action_toggle_view(self) -> None:
        """Unified or side by side, for every hunk."""
        for view in self.query(HunkView):
            view.side_by_side = not view.side_by_side
