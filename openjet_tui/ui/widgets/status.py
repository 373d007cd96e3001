"""The always-visible lines: the Slipstream banner (while it is on) and the status bar."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from openjet_tui.ui.figures import format_bytes, format_tokens


class SlipstreamBanner(Static):
    """High contrast, shown only while Slipstream is on: the endpoint, the model, and what was sent so far."""

    DEFAULT_CSS = """
    SlipstreamBanner {
        display: none; dock: top; height: 1; background: $error; color: $text; text-style: bold; padding: 0 1;
    }
    SlipstreamBanner.-on { display: block; }
    """
    is_on: reactive[bool] = reactive(False)
    endpoint: reactive[str] = reactive("")
    model: reactive[str] = reactive("")
    num_requests: reactive[int] = reactive(0)
    bytes_sent: reactive[int] = reactive(0)
    tokens_sent: reactive[int] = reactive(0)

    def watch_is_on(self, is_on: bool) -> None:
        """Show or hide the banner."""
        self.set_class(is_on, "-on")

    def render(self) -> Content:
        """'☁ SLIPSTREAM ON → endpoint (model) · sent …'."""
        return Content(f"☁ SLIPSTREAM ON → {self.endpoint} ({self.model}) · sent {format_bytes(self.bytes_sent)}, "
                       f"{self.tokens_sent:,} tokens in {self.num_requests} request"
                       f"{'s' if self.num_requests != 1 else ''} · f3 turns it off")


class StatusBar(Static):
    """Mode, model, session, context use and whether a turn is running."""

    DEFAULT_CSS = """
    StatusBar { dock: bottom; height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    StatusBar.-busy { color: $text; }
    """
    mode: reactive[str] = reactive("ask")
    model: reactive[str] = reactive("-")
    session_id: reactive[str] = reactive("new")
    workspace: reactive[str] = reactive("")
    context_used: reactive[int | None] = reactive(None)
    context_window: reactive[int | None] = reactive(None)
    activity: reactive[str] = reactive("")  # "" when idle

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)

    def watch_activity(self, activity: str) -> None:
        """Highlight while a turn runs."""
        self.set_class(bool(activity), "-busy")

    def render(self) -> Content:
        """One line of facts; the activity (with how to cancel) at the end."""
        context = ""
        if self.context_used is not None:
            context = f" · ctx {format_tokens(self.context_used)}/{format_tokens(self.context_window)}"
        busy = Content.styled(f"● {self.activity} (esc cancels)", "bold $text-warning") if self.activity \
            else Content("f1 keys · ctrl+p commands")
        # the workspace goes last: a long path is what gets cut on a narrow terminal
        return Content.assemble((self.mode, "bold $text-accent"), f" · {self.model} · session {self.session_id}",
                                f"{context} · ", busy, ("  " + self.workspace, "$text-muted"))
