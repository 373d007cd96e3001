"""Reviewing an edit proposal hunk by hunk before anything is written."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual.app import ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from openjet_tui.agent.proposals import EditDecision, Hunk, Proposal, current_bytes, digest
from openjet_tui.ui.widgets.diff_view import HighlightedSides, HunkView, diff_stats
from openjet_tui.ui.widgets.prompts import AnswerPrompt

KEYS = ("[y] accept hunk  [n] reject hunk (reason)  [A] accept all  [R] reject all (reason)  "
        "[↑↓] move  [v] unified/side by side  [e] open in $EDITOR  [esc] cancel the turn")
RESERVED_ROWS = 9  # border, title, progress, stale warning and keys around the scrolling hunks
_LINE_FLAG_EDITORS = {"code": "-g", "code-insiders": "-g", "codium": "-g"}  # take path:line after a flag


@dataclass(slots=True)
class HunkVerdict:
    """What the person decided for one hunk."""

    is_accepted: bool
    reason: str | None = None


def editor_command(editor: str, path: Path, line: int) -> list[str]:
    """The command that opens `path` at `line` in `editor` (vi/vim/nano/emacs/micro/hx style `+LINE`)."""
    words = shlex.split(editor)
    if not words:
        raise ValueError("the editor command is empty: set $EDITOR, e.g. EDITOR=vim")
    name = os.path.basename(words[0])
    if name in _LINE_FLAG_EDITORS:
        return [*words, _LINE_FLAG_EDITORS[name], f"{path}:{line}"]
    if name in ("subl", "zed"):
        return [*words, f"{path}:{line}"]
    return [*words, f"+{line}", str(path)]


def first_changed_line(hunk: Hunk) -> int:
    """1-based line of the first change of a hunk in the file as it is now."""
    for tag, i1, _i2, _j1, _j2 in hunk.ops:
        if tag != "equal":
            return i1 + 1
    return hunk.old_start + 1


class HunkBlock(Vertical):
    """A hunk with its header and verdict line."""

    DEFAULT_CSS = """
    HunkBlock { height: auto; border-left: outer $panel-lighten-2; padding-left: 1; margin-bottom: 1; }
    HunkBlock.-current { border-left: outer $accent; }
    HunkBlock.-accepted { border-left: outer $success; }
    HunkBlock.-rejected { border-left: outer $error; }
    HunkBlock.-current.-accepted, HunkBlock.-current.-rejected { border-left: thick $accent; }
    HunkBlock .hunk-header { color: $text-muted; }
    """

    def __init__(self, hunk: Hunk, total: int, sides: HighlightedSides, side_by_side: bool):
        super().__init__(id=f"hunk-{hunk.index}")
        self.hunk, self.total, self.sides, self.side_by_side = hunk, total, sides, side_by_side

    def compose(self) -> ComposeResult:
        """Header line, then the hunk."""
        yield Static(self.header(None), classes="hunk-header")
        yield HunkView(self.hunk, self.sides, self.side_by_side)

    def header(self, verdict: HunkVerdict | None) -> Content:
        """'hunk 2/3 @@ -4,7 +4,8 @@ · rejected: reason'."""
        state = "pending"
        if verdict is not None:
            state = "accepted" if verdict.is_accepted else "rejected"
            if verdict.reason:
                state += f": {verdict.reason}"
        return Content.assemble(f"hunk {self.hunk.index + 1}/{self.total} ", (self.hunk.header, "$text-accent"),
                                f" · {state}")

    def show(self, verdict: HunkVerdict | None, is_current: bool, side_by_side: bool) -> None:
        """Redraw the verdict, the current marker and the layout."""
        self.query_one(".hunk-header", Static).update(self.header(verdict))
        self.set_class(is_current, "-current")
        self.set_class(verdict is not None and verdict.is_accepted, "-accepted")
        self.set_class(verdict is not None and not verdict.is_accepted, "-rejected")
        self.query_one(HunkView).side_by_side = side_by_side


class DiffReview(AnswerPrompt[EditDecision]):
    """Each hunk accepted or rejected (with a reason), or all at once; answers with an EditDecision."""

    KIND = "diff review"

    DEFAULT_CSS = """
    DiffReview { border: round $accent; }
    DiffReview #review-hunks { height: auto; }
    DiffReview #review-progress { color: $text-muted; }
    DiffReview #review-stale { display: none; background: $error; color: $text; text-style: bold; padding: 0 1; }
    DiffReview.-stale #review-stale { display: block; }
    """
    BINDINGS = [
        Binding("y", "accept_hunk", "Accept hunk"), Binding("n", "reject_hunk", "Reject hunk"),
        Binding("A", "accept_all", "Accept all"), Binding("R", "reject_all", "Reject all"),
        Binding("down,j", "move(1)", "Next hunk", show=False), Binding("up,k", "move(-1)", "Previous hunk", show=False),
        Binding("v", "toggle_view", "Unified / side by side"), Binding("e", "open_editor", "Open in $EDITOR"),
    ]
    current: reactive[int] = reactive(0)
    side_by_side: reactive[bool] = reactive(False)
    is_stale: reactive[bool] = reactive(False)

    def __init__(self, proposal: Proposal, editor: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.proposal, self.editor = proposal, editor
        self.verdicts: dict[int, HunkVerdict] = {}
        self.sides = HighlightedSides(proposal)

    def compose(self) -> ComposeResult:
        """Title, stale warning, the hunks, the keys."""
        proposal = self.proposal
        kind = "new file" if proposal.old_text is None else proposal.tool
        yield Static(Content.from_markup("[b]Review edit:[/b] $path  [dim]$kind · $stats[/dim]",
                                         path=proposal.rel_path, kind=kind, stats=diff_stats(proposal)),
                     classes="prompt-title")
        yield Static(id="review-progress")
        yield Static(f"STALE: {proposal.rel_path} changed on disk since this edit was proposed; accepting it "
                     "will be refused (nothing is written). Reject it so the model can re-read the file.",
                     id="review-stale")
        with VerticalScroll(id="review-hunks"):
            for hunk in proposal.hunks:
                yield HunkBlock(hunk, len(proposal.hunks), self.sides, self.side_by_side)
        yield Static(KEYS, classes="prompt-keys", markup=False)

    def on_mount(self) -> None:
        """Mark the first hunk and check the file is still as proposed."""
        self.check_stale()
        self._redraw()
        self.on_resize()

    def on_resize(self) -> None:
        """Let the hunks scroll inside what the screen leaves, so the keys always stay in view."""
        rows = max(3, int(self.app.size.height * 0.7) - RESERVED_ROWS)
        self.query_one("#review-hunks", VerticalScroll).styles.max_height = rows

    def check_stale(self) -> bool:
        """Compare the file with the bytes the proposal was made against; marks the review stale if it changed."""
        if self.proposal.is_stale or digest(current_bytes(self.proposal.path)) != self.proposal.base_digest:
            self.is_stale = True
        return self.is_stale

    def watch_is_stale(self, is_stale: bool) -> None:
        """Show or hide the stale warning."""
        self.set_class(is_stale, "-stale")

    def watch_current(self) -> None:
        """Move the marker and bring the hunk into view."""
        self._redraw()
        for block in self.query(f"#hunk-{self.current}"):
            self.query_one("#review-hunks", VerticalScroll).scroll_to_widget(block, top=True, animate=False)

    def watch_side_by_side(self) -> None:
        """Switch every hunk's layout."""
        self._redraw()

    def _redraw(self) -> None:
        accepted = sum(v.is_accepted for v in self.verdicts.values())
        rejected, total = len(self.verdicts) - accepted, len(self.proposal.hunks)
        for progress in self.query("#review-progress").results(Static):
            progress.update(f"hunk {self.current + 1} of {total} · {accepted} accepted · {rejected} rejected · "
                            f"{total - len(self.verdicts)} to decide")
        for block in self.query(HunkBlock):
            index = block.hunk.index
            block.show(self.verdicts.get(index), index == self.current, self.side_by_side)

    def _decide(self, index: int, verdict: HunkVerdict) -> None:
        """Record one hunk's verdict; move to the next undecided hunk, or answer when none is left."""
        self.verdicts[index] = verdict
        pending = [h.index for h in self.proposal.hunks if h.index not in self.verdicts]
        if not pending:
            self._finish()
            return
        later = [i for i in pending if i > index]
        self.current = later[0] if later else pending[0]
        self._redraw()

    def _finish(self) -> None:
        accepted = frozenset(i for i, v in self.verdicts.items() if v.is_accepted)
        reasons = {i: v.reason for i, v in self.verdicts.items() if not v.is_accepted and v.reason}
        self.resolve(EditDecision(accepted, None, reasons))

    def action_accept_hunk(self) -> None:
        """Accept the current hunk."""
        self._decide(self.current, HunkVerdict(True))

    def action_reject_hunk(self) -> None:
        """Reject the current hunk, with a reason the model will read."""
        index = self.current
        self.ask_reason(f"Why reject hunk {index + 1}? (Enter to confirm, empty for no reason, Esc to go back)",
                        lambda reason: self._decide(index, HunkVerdict(False, reason or None)))

    def action_accept_all(self) -> None:
        """Accept every hunk."""
        self.resolve(EditDecision.accept_all(self.proposal))

    def action_reject_all(self) -> None:
        """Reject the whole edit, with a typed reason."""
        self.ask_reason("Why reject the whole edit? The model reads this (Enter to confirm, Esc to go back)",
                        lambda reason: self.resolve(EditDecision.reject_all(reason or None)))

    def action_move(self, step: int) -> None:
        """Go to the next or previous hunk."""
        if self.proposal.hunks:
            self.current = (self.current + step) % len(self.proposal.hunks)

    def action_toggle_view(self) -> None:
        """Unified or side by side."""
        self.side_by_side = not self.side_by_side

    def action_open_editor(self) -> None:
        """Open the file at the current hunk in $EDITOR (a preview of the content, for a new file)."""
        if not self.proposal.hunks:
            return
        hunk = self.proposal.hunks[self.current]
        path, line = self.proposal.path, first_changed_line(hunk)
        if self.proposal.old_text is None:  # nothing on disk yet: show what would be written
            path, line = self._preview_file(), hunk.new_start + 1
        editor = self.editor or os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        try:
            command = editor_command(editor, path, line)
            code = _run_editor(self, command)
        except (OSError, ValueError) as exc:
            self.notify(f"could not open {editor!r}: {exc}", severity="error")
            return
        if code:
            self.notify(f"{command[0]} exited with code {code}", severity="warning")
        if self.check_stale():
            self.notify(f"{self.proposal.rel_path} changed in the editor: this proposal is stale", severity="warning")

    def _preview_file(self) -> Path:
        suffix = Path(self.proposal.rel_path).suffix
        handle, name = tempfile.mkstemp(prefix="openjet-preview-", suffix=suffix)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(self.proposal.new_text)
        return Path(name)


def _run_editor(widget: DiffReview, command: list[str]) -> int:
    """Run the editor in the terminal the app gives up for it; without a terminal (tests, pipes), run it plainly."""
    try:
        with widget.app.suspend():
            return subprocess.run(command).returncode
    except SuspendNotSupported:
        return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True).returncode
