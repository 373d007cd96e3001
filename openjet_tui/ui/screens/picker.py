"""Choosing one item from a list: sessions for /resume, models for /model, modes for /mode."""

from __future__ import annotations

from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

Choice = tuple[str, Content | str]  # (value returned, what is shown)


class PickerScreen(ModalScreen[str | None]):
    """A filterable list; Enter picks, Esc cancels (None)."""

    CSS_PATH = "picker.tcss"
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, title: str, choices: list[Choice], empty: str = "nothing to choose from", **kwargs: Any):
        super().__init__(**kwargs)
        self.title_text, self.choices, self.empty = title, choices, empty

    def compose(self) -> ComposeResult:
        """Filter field over the list."""
        with Vertical(id="picker-box") as box:
            box.border_title = self.title_text
            yield Input(placeholder="type to filter, enter to choose, esc to cancel", id="picker-filter")
            yield OptionList(*self._options(""), id="picker-list")

    def _options(self, text: str) -> list[Option]:
        needle = text.lower()
        options = [Option(shown, id=value) for value, shown in self.choices
                   if needle in (value + " " + str(shown)).lower()]
        return options or [Option(Content.styled(self.empty, "$text-muted"), disabled=True)]

    @property
    def option_list(self) -> OptionList:
        """The choices."""
        return self.query_one("#picker-list", OptionList)

    @on(Input.Changed, "#picker-filter")
    def filter_changed(self, event: Input.Changed) -> None:
        """Keep only the choices containing the text."""
        self.option_list.set_options(self._options(event.value))
        self.option_list.highlighted = 0

    @on(Input.Submitted, "#picker-filter")
    def filter_submitted(self) -> None:
        """Enter in the filter picks the highlighted choice."""
        self._pick(self.option_list.highlighted)

    @on(OptionList.OptionSelected, "#picker-list")
    def option_chosen(self, event: OptionList.OptionSelected) -> None:
        """Enter or a click on a choice picks it."""
        self._pick(event.option_index)

    def _pick(self, index: int | None) -> None:
        if index is None:
            return
        option = self.option_list.get_option_at_index(index)
        if not option.disabled:
            self.dismiss(option.id)

    def on_key(self, event: Any) -> None:
        """Up and down move through the list while typing in the filter."""
        if event.key in ("up", "down"):
            options = self.option_list
            if options.option_count:
                step = 1 if event.key == "down" else -1
                options.highlighted = ((options.highlighted or 0) + step) % options.option_count
            event.stop()


def session_choices(sessions: list[Any], current: str | None = None) -> list[Choice]:
    """One line per stored session: id, when, model, mode, title (the current one marked)."""
    import datetime

    choices: list[Choice] = []
    for info in sessions:
        when = datetime.datetime.fromtimestamp(info.updated_at).strftime("%Y-%m-%d %H:%M")
        mark = "● " if info.id == current else "  "
        shown = Content.assemble(mark, (info.id, "bold"), f"  {when}  ", (f"{info.model or '-'}", "$text-accent"),
                                 f"  {info.mode or '-':9}  ", info.title or "(untitled)")
        choices.append((info.id, shown))
    return choices
