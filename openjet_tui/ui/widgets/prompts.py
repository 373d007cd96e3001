"""Inline prompts that answer the agent's questions: the base class, the shell prompt and the path prompt."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input, Static

from openjet_tui.agent.approver import PathDecision, PathRequest, ShellDecision, ShellRequest

T = TypeVar("T")
ACTION_MARKS = {"allow": ("✓", "$text-success"), "ask": ("?", "$text-warning"), "deny": ("✗", "$text-error")}


class ReasonInput(Input):
    """A one-line reason typed inside a prompt: Enter confirms (empty is allowed), Esc goes back."""

    DEFAULT_CSS = """
    ReasonInput { margin: 1 0 0 0; border: tall $warning; }
    """
    BINDINGS = [Binding("escape", "back", "Back", show=False)]

    def __init__(self, placeholder: str, on_done: Callable[[str], None], **kwargs: Any):
        super().__init__(placeholder=placeholder, **kwargs)
        self.on_done = on_done

    @on(Input.Submitted)
    def reason_confirmed(self, event: Input.Submitted) -> None:
        """Hand the reason to the prompt and go away."""
        event.stop()
        reason = event.value.strip()
        self._close()
        self.on_done(reason)

    def action_back(self) -> None:
        """Drop the reason and return to the prompt."""
        self._close()

    def _close(self) -> None:
        parent = self.parent
        self.remove()
        if isinstance(parent, Widget):
            for keys in parent.query(".prompt-keys"):
                keys.display = True
            parent.focus()


class AnswerPrompt(Widget, Generic[T], can_focus=True):
    """A question in the conversation, answered once with keys; the agent awaits `wait()`."""

    KIND = "prompt"  # what the command palette calls it

    DEFAULT_CSS = """
    AnswerPrompt {
        height: auto; max-height: 70vh; border: round $warning; padding: 0 1; margin: 0 0 1 0;
        background: $surface;
    }
    AnswerPrompt:focus-within { border: round $accent; }
    AnswerPrompt .prompt-title { text-style: bold; color: $text-warning; }
    AnswerPrompt .prompt-keys { color: $text-muted; margin-top: 1; }
    """

    @dataclass
    class Answered(Message):
        """The person answered the prompt."""

        prompt: AnswerPrompt[Any]
        answer: Any

        @property
        def control(self) -> AnswerPrompt[Any]:
            """The prompt that was answered."""
            return self.prompt

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._answer: asyncio.Future[T] | None = None

    def _future(self) -> asyncio.Future[T]:
        if self._answer is None:
            self._answer = asyncio.get_running_loop().create_future()
        return self._answer

    @property
    def is_answered(self) -> bool:
        """True once an answer was given."""
        return self._answer is not None and self._answer.done()

    def resolve(self, answer: T) -> None:
        """Give the answer (only the first one counts)."""
        future = self._future()
        if not future.done():
            future.set_result(answer)
            self.post_message(self.Answered(self, answer))

    async def wait(self) -> T:
        """The answer, once given."""
        return await self._future()

    def palette_actions(self) -> list[Binding]:
        """The shown key bindings, for the command palette (none once answered)."""
        if self.is_answered:
            return []
        return [b for b in self.BINDINGS if isinstance(b, Binding) and b.show]

    def ask_reason(self, placeholder: str, on_done: Callable[[str], None]) -> None:
        """Show a reason field in place of the key help (it says which keys apply) and focus it."""
        for old in self.query(ReasonInput):
            old.remove()
        field = ReasonInput(placeholder, on_done)
        keys = self.query(".prompt-keys")
        if keys:
            self.mount(field, before=keys.first())
            keys.first().display = False
        else:
            self.mount(field)
        field.focus()


class ShellPrompt(AnswerPrompt[ShellDecision]):
    """A command waiting to run: where, which part matched which rule, and what "always" would store."""

    KIND = "shell prompt"

    BINDINGS = [Binding("y", "allow_once", "Allow once"), Binding("a", "allow_always", "Allow always"),
                Binding("n", "deny", "Deny")]

    def __init__(self, request: ShellRequest, **kwargs: Any):
        super().__init__(**kwargs)
        self.request = request

    def compose(self) -> ComposeResult:
        """Title, command, folder, the parts with their verdicts, the rule "always" stores, the keys."""
        request, verdict = self.request, self.request.verdict
        yield Static("Run this command?", classes="prompt-title")
        yield Static(Content.from_markup("[b]$ $command[/b]", command=request.command), id="shell-command")
        yield Static(Content.from_markup("[dim]in[/dim] $cwd", cwd=str(request.cwd)), id="shell-cwd")
        yield Static(self._parts(), id="shell-parts")
        if verdict.can_remember:
            rules = ", ".join(f"`{rule}`" for rule in verdict.suggested_rules)
            yield Static(Content.from_markup("Always stores the prefix rule [b]allow $rules[/b] for this "
                                             "workspace", rules=rules), id="shell-always")
            keys = "[y] allow once   [a] allow always   [n] deny with a reason   [esc] cancel the turn"
        else:
            yield Static("Always is not offered: this command cannot be remembered safely as a prefix rule",
                         id="shell-always")
            keys = "[y] allow once   [n] deny with a reason   [esc] cancel the turn"
        yield Static(keys, classes="prompt-keys", markup=False)

    def _parts(self) -> Content:
        lines = []
        for part in self.request.verdict.parts:
            mark, style = ACTION_MARKS.get(part.action, ("?", "$text-warning"))
            lines.append(Content.assemble((f" {mark} ", style), (part.part.text, "bold"), ("  ", ""),
                                          (part.why, "$text-muted")))
        return Content("\n").join(lines)

    def action_allow_once(self) -> None:
        """Run it this once."""
        self.resolve(ShellDecision(True))

    def action_allow_always(self) -> None:
        """Run it and store the shown prefix rule (only when one is offered)."""
        if self.request.verdict.can_remember:
            self.resolve(ShellDecision(True, always=True))
        else:
            self.notify("This command cannot be remembered as a rule; [y] allows it once", severity="warning")

    def action_deny(self) -> None:
        """Ask why, then deny."""
        self.ask_reason("Why deny it? The model reads this (Enter to confirm, Esc to go back)",
                        lambda reason: self.resolve(ShellDecision(False, reason=reason or None)))


class PathPrompt(AnswerPrompt[PathDecision]):
    """A tool asks to use a path outside the workspace."""

    KIND = "path prompt"

    BINDINGS = [Binding("y", "allow", "Allow"), Binding("n", "deny", "Deny")]

    def __init__(self, request: PathRequest, **kwargs: Any):
        super().__init__(**kwargs)
        self.request = request

    def compose(self) -> ComposeResult:
        """Which tool, what it wants to do, where."""
        request = self.request
        yield Static("Leave the workspace?", classes="prompt-title")
        yield Static(Content.from_markup("[b]$tool[/b] wants to $action [b]$path[/b], outside the workspace",
                                         tool=request.tool, action=request.action, path=str(request.path)))
        yield Static("[y] allow this once   [n] refuse with a reason   [esc] cancel the turn",
                     classes="prompt-keys", markup=False)

    def action_allow(self) -> None:
        """Allow this one use."""
        self.resolve(PathDecision(True))

    def action_deny(self) -> None:
        """Ask why, then refuse."""
        self.ask_reason("Why refuse? (Enter to confirm, Esc to go back)",
                        lambda reason: self.resolve(PathDecision(False, reason or None)))
