"""The keys and commands, one screen."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from openjet_tui.ui.commands import COMMANDS

SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Anywhere", (("esc", "cancel the running turn"), ("f1", "this help"), ("f2", "engine panel"),
                  ("f3", "Slipstream on/off"), ("f4", "resume a session"), ("ctrl+p", "command palette"),
                  ("pageup/pagedown", "scroll the conversation"), ("ctrl+q", "quit"))),
    ("Editor", (("enter", "send"), ("ctrl+j / shift+enter", "new line"), ("↑ / ↓", "history (first/last line)"),
                ("@path", "complete a workspace path"), ("/", "complete a command"),
                ("tab", "accept the completion"))),
    ("Edit review", (("y", "accept the current hunk"), ("n", "reject it (with a reason)"), ("A", "accept all"),
                     ("R", "reject all (with a reason)"), ("↑ / ↓", "previous / next hunk"),
                     ("v", "unified or side by side"), ("e", "open the file at the hunk in $EDITOR"))),
    ("Command approval", (("y", "allow once"), ("a", "allow always (stores the prefix rule shown)"),
                          ("n", "deny (with a reason)"))),
)


def help_text() -> Content:
    """Every key and command as aligned lines."""
    lines: list[Content] = []
    for title, keys in SECTIONS:
        lines.append(Content.styled(title, "bold $text-accent"))
        lines += [Content.assemble((f"  {key:<24}", "bold"), what) for key, what in keys]
        lines.append(Content(""))
    lines.append(Content.styled("Commands", "bold $text-accent"))
    lines += [Content.assemble((f"  {c.usage:<24}", "bold"), c.help) for c in COMMANDS]
    return Content("\n").join(lines)


class HelpScreen(ModalScreen[None]):
    """Lists every key and slash command."""

    CSS_PATH = "help.tcss"
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        """The key table in a scrollable box."""
        with VerticalScroll(id="help-box") as box:
            box.border_title = "keys (esc closes)"
            yield Static(help_text(), id="help-text")
