"""The message editor: multi-line, with history, `@path` and slash-command completion."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import OptionList, TextArea
from textual.widgets.option_list import Option

Candidate = tuple[str, str]  # (text to insert, description shown beside it)
NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


@dataclass(slots=True)
class CompletionSources:
    """Where completions come from: slash commands, their arguments, and workspace paths."""

    commands: list[Candidate]
    arguments: Callable[[str, str], list[Candidate]] = lambda command, partial: []
    paths: Callable[[str], list[str]] = lambda query: []


def completion_context(before_cursor: str, sources: CompletionSources) -> tuple[int, list[Candidate]] | None:
    """Where the word being completed starts and its candidates, or None when nothing is being completed."""
    line = before_cursor.rsplit("\n", 1)[-1]
    line_start = len(before_cursor) - len(line)
    if before_cursor.startswith("/") and "\n" not in before_cursor:
        if " " not in line:  # the command name itself
            return 0, [c for c in sources.commands if c[0].startswith(line)]
        command, partial = line.split(" ", 1)
        if " " not in partial:
            found = [c for c in sources.arguments(command, partial) if c[0].startswith(partial)]
            return len(command) + 1, found
    word_start = max(line.rfind(" "), line.rfind("\t")) + 1
    word = line[word_start:]
    if word.startswith("@"):
        return line_start + word_start, [(f"@{path}", "") for path in sources.paths(word[1:])]
    return None


class PromptInput(TextArea):
    """TextArea where Enter sends, ctrl+j (or shift/alt+enter) breaks the line, and up/down walk the history at
    the first and last line."""

    DEFAULT_CSS = """
    PromptInput { height: auto; min-height: 3; max-height: 12; border: tall $primary; }
    PromptInput:focus { border: tall $accent; }
    """

    @dataclass
    class Submitted(Message):
        """The person sent the text."""

        input: PromptInput
        text: str

        @property
        def control(self) -> PromptInput:
            """The editor that sent it."""
            return self.input

    def __init__(self, **kwargs: Any):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.sent_history: list[str] = []
        self.history_index: int | None = None  # None: editing a new message
        self.draft = ""

    async def _on_key(self, event: events.Key) -> None:
        """Sending, line breaks, completion keys and history before the TextArea's own keys."""
        box = self.parent if isinstance(self.parent, PromptBox) else None
        menu_open = box is not None and box.menu.display
        handled = True
        if event.key == "enter":
            if box is not None and menu_open and not box.completion_is_typed():
                box.accept_completion()
            else:
                self.submit()
        elif event.key in NEWLINE_KEYS:
            self.insert("\n")
        elif menu_open and event.key in ("up", "down", "tab", "escape") and box is not None:
            box.menu_key(event.key)
        elif event.key == "up" and self.cursor_location[0] == 0 and self.sent_history:
            self.recall(-1)
        elif event.key == "down" and self.cursor_location[0] == self.document.line_count - 1 \
                and self.history_index is not None:
            self.recall(1)
        else:
            handled = False
        if handled:
            event.stop()
            event.prevent_default()
            return
        await super()._on_key(event)

    def submit(self) -> None:
        """Send the text (not when empty), remember it, clear the editor."""
        if isinstance(self.parent, PromptBox):
            self.parent.close_menu()
        text = self.text.strip()
        if not text:
            return
        if not self.sent_history or self.sent_history[-1] != text:
            self.sent_history.append(text)
        self.history_index, self.draft = None, ""
        self.clear()
        self.post_message(self.Submitted(self, text))

    def recall(self, step: int) -> None:
        """Show the previous (-1) or next (+1) sent message; past the newest, the unsent draft returns."""
        if self.history_index is None:
            self.draft, index = self.text, len(self.sent_history) - 1
        else:
            index = self.history_index + step
        if index >= len(self.sent_history):
            self.history_index, text = None, self.draft
        else:
            self.history_index = max(0, index)
            text = self.sent_history[self.history_index]
        self.load_text(text)
        self.move_cursor(self.document.end)


class CompletionMenu(OptionList):
    """Candidates for the word being typed, above the editor."""

    DEFAULT_CSS = """
    CompletionMenu { display: none; height: auto; max-height: 8; border: round $accent; background: $surface; }
    """


class PromptBox(Vertical):
    """The editor and its completion menu."""

    DEFAULT_CSS = """
    PromptBox { height: auto; }
    """

    def __init__(self, sources: CompletionSources, **kwargs: Any):
        super().__init__(**kwargs)
        self.sources = sources
        self._span: tuple[int, int] | None = None  # offsets replaced by the chosen candidate

    def compose(self) -> ComposeResult:
        """Menu above, editor below."""
        yield CompletionMenu(id="completions")
        yield PromptInput(id="prompt-input")

    @property
    def menu(self) -> CompletionMenu:
        """The completion menu."""
        return self.query_one("#completions", CompletionMenu)

    @property
    def input(self) -> PromptInput:
        """The editor."""
        return self.query_one("#prompt-input", PromptInput)

    @on(TextArea.Changed, "#prompt-input")
    def text_changed(self) -> None:
        """Offer completions for the word at the cursor."""
        editor = self.input
        document = editor.document
        offset = _offset(document.text, editor.cursor_location)
        context = completion_context(document.text[:offset], self.sources)
        if not context or not context[1]:
            self.close_menu()
            return
        start, candidates = context
        self._span = (start, offset)
        menu = self.menu
        menu.set_options([Option(Content.assemble(value, (f"  {help_text}", "$text-muted")), id=value)
                          for value, help_text in candidates[:50]])
        menu.highlighted = 0
        menu.display = True

    def close_menu(self) -> None:
        """Hide the menu."""
        self.menu.display = False
        self._span = None

    def menu_key(self, key: str) -> None:
        """Up/down move, tab accepts, escape closes."""
        menu = self.menu
        if key == "escape":
            self.close_menu()
        elif key == "tab":
            self.accept_completion()
        elif menu.option_count:
            menu.highlighted = ((menu.highlighted or 0) + (1 if key == "down" else -1)) % menu.option_count

    def completion_is_typed(self) -> bool:
        """True when the word at the cursor already is the highlighted candidate (Enter then sends)."""
        menu, span = self.menu, self._span
        if span is None or menu.highlighted is None:
            return True
        return self.input.text[span[0]:span[1]] == menu.get_option_at_index(menu.highlighted).id

    def accept_completion(self) -> None:
        """Replace the word being typed with the highlighted candidate."""
        menu, span = self.menu, self._span
        if span is None or menu.highlighted is None:
            self.close_menu()
            return
        value = menu.get_option_at_index(menu.highlighted).id or ""
        editor = self.input
        text = editor.text
        new_text = text[:span[0]] + value + " " + text[span[1]:]
        editor.load_text(new_text)
        editor.move_cursor(_location(new_text, span[0] + len(value) + 1))
        self.close_menu()

    @on(OptionList.OptionSelected, "#completions")
    def completion_clicked(self, event: OptionList.OptionSelected) -> None:
        """A click on a candidate accepts it."""
        event.stop()
        self.accept_completion()
        self.input.focus()


def _offset(text: str, location: tuple[int, int]) -> int:
    """Character offset of a (row, column) location."""
    lines = text.split("\n")
    row, column = location
    return sum(len(line) + 1 for line in lines[:row]) + column


def _location(text: str, offset: int) -> tuple[int, int]:
    """(row, column) of a character offset."""
    before = text[:offset]
    return before.count("\n"), len(before.rsplit("\n", 1)[-1])
