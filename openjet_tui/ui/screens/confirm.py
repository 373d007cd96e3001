"""Enabling Slipstream: the person must see and accept where their work will be sent."""

from __future__ import annotations

from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from openjet_tui.ui.controller import SlipstreamPlan


def plan_text(plan: SlipstreamPlan) -> Content:
    """The endpoint, the model, the key's source, and the list of what is sent."""
    endpoint = plan.endpoint
    key = endpoint.key_source or "none (a loopback endpoint)"
    lines = [Content.from_markup("Planning and review will go to [b]$url[/b]", url=endpoint.base_url),
             Content.from_markup("model [b]$model[/b] · API key from $key", model=endpoint.model or "-", key=key),
             Content(""), Content.styled("What is sent there:", "bold")]
    lines += [Content(f"  • {item}") for item in plan.sends]
    lines += [Content(""), Content("Edits and commands still run only on this machine, with your approval; a "
                                   "banner stays on top while Slipstream is on.")]
    return Content("\n").join(lines)


class SlipstreamConfirm(ModalScreen[bool]):
    """Enable (y) or cancel (n, esc)."""

    CSS_PATH = "confirm.tcss"
    BINDINGS = [Binding("y", "dismiss(True)", "Enable"), Binding("n,escape", "dismiss(False)", "Cancel")]

    def __init__(self, plan: SlipstreamPlan, **kwargs: Any):
        super().__init__(**kwargs)
        self.plan = plan

    def compose(self) -> ComposeResult:
        """The plan and two buttons."""
        with Vertical(id="confirm-box") as box:
            box.border_title = "Turn Slipstream on?"
            yield Static(plan_text(self.plan), id="confirm-text")
            with Horizontal(id="confirm-buttons"):
                yield Button("Enable [y]", variant="error", id="confirm-yes")
                yield Button("Cancel [n]", variant="primary", id="confirm-no")

    def on_mount(self) -> None:
        """Cancel is the default."""
        self.query_one("#confirm-no", Button).focus()

    @on(Button.Pressed, "#confirm-yes")
    def enable_pressed(self) -> None:
        """The person accepted."""
        self.dismiss(True)

    @on(Button.Pressed, "#confirm-no")
    def cancel_pressed(self) -> None:
        """The person declined."""
        self.dismiss(False)
