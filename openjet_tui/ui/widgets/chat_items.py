"""What the conversation is made of: user messages, streaming replies, tool cards, notices and the todo list.

Every item can describe itself as a `record()`: a factory that rebuilds it in its current state, so the
conversation can unmount old items and mount them again when the person scrolls back.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Collapsible, Static

from openjet_tui.agent.proposals import Proposal
from openjet_tui.ui.widgets.diff_view import HighlightedSides, HunkView, diff_stats
from openjet_tui.ui.widgets.markdown_text import ReplyBody

Record = Callable[[], Widget]
ORIGIN_BADGES = {"cloud": ("☁ cloud", "bold $text-error"), "delegate": ("local · delegated", "$text-accent")}
MAX_RESULT_LINES = 60
APPROVAL_TOOLS = frozenset({"run_shell", "edit_file", "write_file"})
STATUS_STYLES = {"error": "$text-error", "denied": "$text-error", "rejected": "$text-error", "stale": "$text-error",
                 "failed": "$text-error", "never": "$text-error", "partial": "$text-warning",
                 "running": "$text-warning", "pending": "$text-warning", "awaiting": "$text-warning"}


def estimate_tokens(text: str) -> int:
    """About four characters per token: what the reasoning header shows (marked "~") when nothing was counted."""
    return math.ceil(len(text) / 4)


def reasoning_title(reasoning: str, num_tokens: int | None) -> Content:
    """'reasoning · 42 tokens' (reported by the server, or one per streamed chunk), else '~N' from the length."""
    count = f"~{estimate_tokens(reasoning)}" if num_tokens is None else f"{num_tokens:,}"
    unit = "token" if count == "1" else "tokens"
    return Content.from_markup("reasoning [dim]· $count $unit[/dim]", count=count, unit=unit)


class UserMessage(Static):
    """What the person typed; marked when it went to the Slipstream cloud endpoint."""

    DEFAULT_CSS = """
    UserMessage { background: $boost; border-left: thick $primary; padding: 0 1; margin: 1 0 0 0; }
    UserMessage.-cloud { border-left: thick $error; }
    """

    def __init__(self, text: str, to_cloud: bool = False):
        badge = Content.styled("  → sent to cloud", "bold $text-error") if to_cloud else Content("")
        super().__init__(Content.assemble(("you ", "bold $text-primary"), badge, "\n", text),
                         classes="-cloud" if to_cloud else "")
        self.text, self.to_cloud = text, to_cloud

    def record(self) -> Record:
        """Rebuild as is."""
        return functools.partial(UserMessage, self.text, self.to_cloud)


class AssistantReply(Vertical):
    """A model reply: collapsed reasoning with its token count, then the text, streamed as it arrives. The count is
    the server's (usage.completion_tokens_details.reasoning_tokens) when it reports one, else one per streamed
    reasoning chunk, else (a stored or unstreamed reply) an estimate from the length."""

    DEFAULT_CSS = """
    AssistantReply { height: auto; margin: 1 0 0 0; }
    AssistantReply .reply-badge { color: $text-muted; }
    AssistantReply Collapsible { border: none; padding: 0; margin: 0; background: transparent; }
    AssistantReply .reasoning-text { color: $text-muted; text-style: italic; }
    """

    def __init__(self, origin: str = "local", content: str = "", reasoning: str = "", is_streaming: bool = False,
                 reasoning_tokens: int | None = None):
        super().__init__(classes=f"-{origin}")
        self.origin, self.reasoning = origin, reasoning
        self.reasoning_tokens = reasoning_tokens  # None: not counted (the title shows an estimate)
        self.body = ReplyBody(content, is_streaming=is_streaming)

    @property
    def content(self) -> str:
        """The reply text so far."""
        return self.body.text

    def compose(self) -> ComposeResult:
        """Badge, reasoning (collapsed, only when there is some), reply text."""
        label, style = ORIGIN_BADGES.get(self.origin, ("assistant", "bold $text-secondary"))
        yield Static(Content.styled(label, style), classes="reply-badge")
        if self.reasoning:
            yield self._reasoning_box()
        yield self.body

    def _reasoning_box(self) -> Collapsible:
        return Collapsible(Static(self.reasoning, classes="reasoning-text", markup=False),
                           title=self._reasoning_title(), collapsed=True, id="reasoning")  # type: ignore[arg-type]

    def _reasoning_title(self) -> Content:
        return reasoning_title(self.reasoning, self.reasoning_tokens)

    async def append_text(self, fragment: str) -> None:
        """Stream more reply text."""
        await self.body.append(fragment)

    async def append_reasoning(self, fragment: str, num_chunks: int = 1) -> None:
        """Add reasoning text and count its streamed chunks; the header's count follows (the text itself is filled
        in when opened)."""
        self.reasoning += fragment
        self.reasoning_tokens = (self.reasoning_tokens or 0) + num_chunks
        box = next(self.query("#reasoning").results(Collapsible), None)
        if box is None:
            await self.mount(self._reasoning_box(), before=self.body)
            return
        box.title = self._reasoning_title()  # type: ignore[assignment]  # Collapsible accepts Content titles
        if not box.collapsed:
            box.query_one(".reasoning-text", Static).update(self.reasoning)

    def set_reasoning_tokens(self, num_tokens: int) -> None:
        """The server's count of this reply's reasoning tokens (it replaces the counted chunks)."""
        self.reasoning_tokens = num_tokens
        box = next(self.query("#reasoning").results(Collapsible), None)
        if box is not None:
            box.title = self._reasoning_title()  # type: ignore[assignment]

    @on(Collapsible.Expanded, "#reasoning")
    def reasoning_opened(self) -> None:
        """Show the reasoning as it stands when it is opened."""
        self.query_one(".reasoning-text", Static).update(self.reasoning)

    async def finish(self, content: str | None = None) -> None:
        """End the stream; `content` replaces the text when the client cleaned tool calls out of it."""
        await self.body.finish(content)

    def record(self) -> Record:
        """Rebuild, finished, with the text and the reasoning count so far."""
        return functools.partial(AssistantReply, self.origin, self.content, self.reasoning,
                                 reasoning_tokens=self.reasoning_tokens)


def call_summary(name: str, arguments: dict[str, Any]) -> str:
    """The one-line form of a tool call: `read_file app.py`, `$ ls -la`."""
    if name == "run_shell":
        return f"$ {arguments.get('command', '')}"
    if name == "edit_file":
        count = len(arguments.get("edits") or [])
        return f"edit_file {arguments.get('path', '')} ({count} edit{'s' if count != 1 else ''})"
    if name == "todo":
        return f"todo ({len(arguments.get('items') or [])} items)"
    if name == "delegate_local":
        task = str(arguments.get("task", "")).strip().splitlines()
        return f"delegate_local: {task[0][:80] if task else ''}"
    key = next((k for k in ("path", "pattern", "query") if k in arguments), None)
    return f"{name} {arguments[key]}" if key else name


class ToolCard(Collapsible):
    """A tool call as one compact line that expands to arguments, decision, diff and result."""

    DEFAULT_CSS = """
    ToolCard { border: none; padding: 0; margin: 0; background: transparent; }
    ToolCard.-error CollapsibleTitle { color: $text-error; }
    ToolCard Contents { padding: 0 0 0 3; }
    ToolCard .card-detail { color: $text-muted; }
    """

    def __init__(self, call_id: str, name: str, arguments: dict[str, Any], origin: str = "local",
                 state: dict[str, Any] | None = None):
        super().__init__(title="", collapsed=True)
        self.call_id, self.tool_name, self.arguments, self.origin = call_id, name, arguments, origin
        self.state: dict[str, Any] = dict(state or {})  # result, is_error, decision, proposal, status
        self.title = self._card_title()  # type: ignore[assignment]

    def _card_title(self) -> Content:
        status = self.state.get("status")
        if status is None and "result" in self.state:
            status = "error" if self.state.get("is_error") else "done"
        elif status is None:  # these may wait for the person before anything runs
            status = "pending" if self.tool_name in APPROVAL_TOOLS else "running"
        style = STATUS_STYLES.get(status.replace(":", " ").split()[0], "$text-success")
        origin = " ☁" if self.origin == "cloud" else ""
        return Content.assemble((call_summary(self.tool_name, self.arguments), "bold"), (origin, "$text-error"),
                                ("  ", ""), (status, style))

    def update_state(self, **changes: Any) -> None:
        """Record a decision, a proposal or the result, and redraw what is shown."""
        self.state.update(changes)
        self.set_class(self.state.get("is_error", False), "-error")
        self.title = self._card_title()  # type: ignore[assignment]
        if not self.collapsed:
            self._fill()

    @on(Collapsible.Expanded)
    def card_opened(self, event: Collapsible.Expanded) -> None:
        """Build the details only when someone opens the card."""
        if event.collapsible is self:
            self._fill()

    def _fill(self) -> None:
        contents = self.query_one(Collapsible.Contents)
        contents.remove_children()
        contents.mount_all(self._details())

    def _details(self) -> list[Widget]:
        state, widgets = self.state, []
        arguments = json.dumps(self.arguments, indent=2, ensure_ascii=False)
        widgets.append(Static(Content.styled(arguments, "$text-muted"), classes="card-detail"))
        if state.get("decision"):
            widgets.append(Static(Content.styled(state["decision"], "italic"), classes="card-detail"))
        proposal: Proposal | None = state.get("proposal")
        if proposal is not None:
            sides = HighlightedSides(proposal)
            widgets.append(Static(Content.from_markup("[b]$path[/b] $stats", path=proposal.rel_path,
                                                      stats=diff_stats(proposal))))
            widgets += [HunkView(hunk, sides) for hunk in proposal.hunks]
        if "result" in state:
            lines = str(state["result"]).splitlines() or ["(empty)"]
            if len(lines) > MAX_RESULT_LINES:
                lines = lines[:MAX_RESULT_LINES] + [f"[... {len(lines) - MAX_RESULT_LINES} more lines]"]
            widgets.append(Static("\n".join(lines), markup=False, classes="card-result"))
        return widgets

    def record(self) -> Record:
        """Rebuild in the current state (collapsed)."""
        return functools.partial(ToolCard, self.call_id, self.tool_name, self.arguments, self.origin, self.state)


class NoticeLine(Static):
    """A notice, warning or error from the agent or the app."""

    DEFAULT_CSS = """
    NoticeLine { color: $text-muted; margin: 1 0 0 0; }
    NoticeLine.-warning { color: $text-warning; }
    NoticeLine.-error { color: $text-error; text-style: bold; }
    """

    def __init__(self, message: str, level: str = "info"):
        marks = {"error": "✗ ", "warning": "! "}
        super().__init__(marks.get(level, "· ") + message, markup=False, classes=f"-{level}")
        self.message, self.level = message, level

    def record(self) -> Record:
        """Rebuild as is."""
        return functools.partial(NoticeLine, self.message, self.level)


class TodoCard(Static):
    """The agent's plan as it stands."""

    DEFAULT_CSS = """
    TodoCard { border: round $panel-lighten-2; padding: 0 1; margin: 1 0 0 0; height: auto; }
    """
    MARKS = {"pending": "☐", "in_progress": "◐", "done": "☑"}

    def __init__(self, items: list[dict[str, str]]):
        lines = [f"{self.MARKS.get(i.get('status', 'pending'), '☐')} {i.get('content', '')}" for i in items]
        super().__init__("\n".join(lines) or "(empty plan)", markup=False)
        self.border_title = "plan"
        self.items = items

    def record(self) -> Record:
        """Rebuild as is."""
        return functools.partial(TodoCard, self.items)
