"""The main screen: conversation, inline prompts, the editor, the engine panel, the banner and the status bar.

It only draws: the app hands it event batches and prompts, and it posts what the person typed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen

from openjet_tui.agent import events as ev
from openjet_tui.ui.figures import ChunkTiming, EngineFigures, is_local
from openjet_tui.ui.render import CONVERSATION_EVENTS, EventRenderer, history_records
from openjet_tui.ui.widgets.chat_items import NoticeLine, UserMessage
from openjet_tui.ui.widgets.conversation import Conversation
from openjet_tui.ui.widgets.diff_review import DiffReview
from openjet_tui.ui.widgets.engine_panel import EnginePanel
from openjet_tui.ui.widgets.prompt_box import CompletionSources, PromptBox, PromptInput
from openjet_tui.ui.widgets.prompts import AnswerPrompt
from openjet_tui.ui.widgets.status import SlipstreamBanner, StatusBar

T = TypeVar("T")
NARROW_WIDTH = 100
HISTORY_SIZE = 100  # sent messages the editor recalls with up/down


class ChatScreen(Screen[None]):
    """Everything a person sees while working with the agent."""

    CSS_PATH = "chat.tcss"
    BINDINGS = [Binding("pageup", "scroll_conversation(-1)", "Scroll up", show=False, priority=True),
                Binding("pagedown", "scroll_conversation(1)", "Scroll down", show=False, priority=True)]

    def __init__(self, sources: CompletionSources, **kwargs: Any):
        super().__init__(**kwargs)
        self.sources = sources
        self.figures = EngineFigures()
        self.renderer: EventRenderer | None = None
        self.timing = ChunkTiming()  # decode estimates for servers that report no timings

    def compose(self) -> ComposeResult:
        """Banner on top, conversation and prompts beside the engine panel, editor, status bar."""
        yield SlipstreamBanner(id="slipstream-banner")
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield Conversation(id="conversation")
                yield Vertical(id="prompt-area")
                yield PromptBox(self.sources, id="prompt-box")
            yield EnginePanel(id="engine-panel")
        yield StatusBar(id="status-bar")

    def on_mount(self) -> None:
        """Start with the cursor in the editor."""
        self.renderer = EventRenderer(self.conversation)
        self.prompt_input.focus()

    def on_resize(self) -> None:
        """Below NARROW_WIDTH columns the engine panel hides unless asked for (f2)."""
        self.set_class(self.size.width < NARROW_WIDTH, "-narrow")

    def toggle_engine_panel(self) -> None:
        """Show or hide the engine panel."""
        self.toggle_class("-engine-shown" if self.has_class("-narrow") else "-engine-hidden")

    # ---- typed access to the parts ---------------------------------------------------------------------------
    @property
    def conversation(self) -> Conversation:
        """The scrolling conversation."""
        return self.query_one("#conversation", Conversation)

    @property
    def prompt_area(self) -> Vertical:
        """Where approval prompts appear."""
        return self.query_one("#prompt-area", Vertical)

    @property
    def prompt_box(self) -> PromptBox:
        """The editor with its completion menu."""
        return self.query_one("#prompt-box", PromptBox)

    @property
    def prompt_input(self) -> PromptInput:
        """The editor."""
        return self.query_one("#prompt-input", PromptInput)

    @property
    def engine_panel(self) -> EnginePanel:
        """The engine panel."""
        return self.query_one("#engine-panel", EnginePanel)

    @property
    def status_bar(self) -> StatusBar:
        """The status bar."""
        return self.query_one("#status-bar", StatusBar)

    @property
    def banner(self) -> SlipstreamBanner:
        """The Slipstream banner."""
        return self.query_one("#slipstream-banner", SlipstreamBanner)

    # ---- drawing -------------------------------------------------------------------------------------------
    async def add_user_message(self, text: str) -> None:
        """Show what the person sent, marked when Slipstream sends it to the cloud."""
        await self.conversation.add(UserMessage(text, to_cloud=self.banner.is_on))
        self.conversation.anchor()

    async def notice(self, message: str, level: str = "info") -> None:
        """A line from the app itself (errors at its edge, command results)."""
        await self.conversation.add(NoticeLine(message, level))

    def remember_sent(self, messages: list[dict[str, Any]]) -> None:
        """The editor's history (up/down) from a stored session's user messages."""
        sent = [m["content"] for m in messages if m["role"] == "user" and m.get("_origin") != "delegate"]
        self.prompt_input.sent_history = sent[-HISTORY_SIZE:]

    async def show_history(self, messages: list[dict[str, Any]]) -> None:
        """Replace the conversation with a stored session's messages."""
        assert self.renderer is not None
        self.renderer.reply = None
        await self.conversation.show_history(history_records(messages))

    async def show_events(self, events: Iterable[ev.Event]) -> None:
        """Draw a batch of agent events: conversation items, engine figures, Slipstream counts."""
        assert self.renderer is not None
        batch = list(events)
        await self.renderer.apply([e for e in batch if isinstance(e, CONVERSATION_EVENTS)])
        for event in batch:
            self._apply_state(event)

    def clock(self, event: ev.Event) -> None:
        """Note when requests start and end as events are emitted (drawing happens later, in batches)."""
        self.timing.clock(event, time.monotonic())

    def _apply_state(self, event: ev.Event) -> None:
        figures = self.figures
        changed = self.timing.settle(event, figures)
        if isinstance(event, ev.UsageReported) and is_local(event):  # the orchestrator's window is not ours
            figures.context_used = event.prompt_tokens + event.completion_tokens
            figures.context_window = event.context_window or figures.context_window
            self.status_bar.context_used, self.status_bar.context_window = figures.context_used, \
                figures.context_window
            changed = True
        elif isinstance(event, ev.TurnStarted):
            self.status_bar.session_id = event.session_id or self.status_bar.session_id
        elif isinstance(event, ev.EngineStats) and is_local(event):
            figures.apply_timings(event.prompt_per_second, event.predicted_n, event.predicted_per_second,
                                  event.draft_n, event.draft_n_accepted)
            changed = True
        elif isinstance(event, ev.SlipstreamTraffic):
            banner = self.banner
            banner.num_requests, banner.bytes_sent = event.total_requests, event.total_bytes_sent
            banner.tokens_sent = event.total_tokens_sent
        elif isinstance(event, ev.ProposalStale):
            for review in self.prompt_area.query(DiffReview):
                if review.proposal.id == event.proposal_id:
                    review.is_stale = True
        if changed:
            self.engine_panel.figures = figures

    def show_figures(self) -> None:
        """Redraw the engine figures after the app changed them (a /metrics scrape)."""
        self.engine_panel.figures = self.figures
        self.status_bar.context_used = self.figures.context_used
        self.status_bar.context_window = self.figures.context_window

    # ---- prompts -------------------------------------------------------------------------------------------
    async def ask(self, prompt: AnswerPrompt[T]) -> T:
        """Show an approval prompt above the editor, focus it, and return the answer once given."""
        await self.prompt_area.mount(prompt)
        prompt.focus()
        prompt.scroll_visible(animate=False)
        try:
            return await prompt.wait()
        finally:
            if prompt.is_attached:
                await prompt.remove()
            if not self.prompt_area.children:
                self.prompt_input.focus()

    def action_scroll_conversation(self, direction: int) -> None:
        """Page the conversation up or down, wherever the focus is."""
        conversation = self.conversation
        if direction < 0:
            conversation.scroll_page_up(animate=False)
        else:
            conversation.scroll_page_down(animate=False)

    def set_workspace(self, root: Path) -> None:
        """Show the workspace in the status bar, with ~ for the home folder."""
        home = Path.home()
        shown = f"~/{root.relative_to(home)}" if root != home and home in root.parents else str(root)
        self.status_bar.workspace = shown
