"""Slash commands: the table the editor completes from, the help screen lists and the command palette offers.
The app implements each one as `cmd_<name>(argument)`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from openjet_tui.agent.shellpolicy import Mode


@dataclass(frozen=True, slots=True)
class SlashCommand:
    """One command: its name, how to call it, what it does, and its key (if any)."""

    name: str
    usage: str
    help: str
    key: str = ""

    @property
    def slash(self) -> str:
        """The name with its slash, e.g. `/help`."""
        return f"/{self.name}"


COMMANDS: tuple[SlashCommand, ...] = (
    SlashCommand("help", "/help", "show the keys and commands", "f1"),
    SlashCommand("model", "/model [NAME]", "choose the model the server runs (lists them without NAME)"),
    SlashCommand("mode", "/mode [MODE]", "approval mode: read-only, ask, auto-edit or auto"),
    SlashCommand("resume", "/resume [ID]", "continue a stored session of this workspace (picker without ID)", "f4"),
    SlashCommand("compact", "/compact", "summarise older turns now to free context"),
    SlashCommand("undo", "/undo", "restore the file changed by the newest applied edit"),
    SlashCommand("diff", "/diff", "show every change this session applied"),
    SlashCommand("clear", "/clear", "start a new conversation"),
    SlashCommand("slipstream", "/slipstream", "turn the cloud orchestrator on (with confirmation) or off", "f3"),
    SlashCommand("engine", "/engine", "show or hide the engine panel", "f2"),
    SlashCommand("quit", "/quit", "leave OpenJet", "ctrl+q"),
)
BY_NAME = {command.name: command for command in COMMANDS}


class UnknownCommandError(ValueError):
    """A slash command that does not exist; the message suggests the closest ones."""


def parse_command(text: str) -> tuple[SlashCommand, str]:
    """Split `/name argument` into the command and its argument."""
    name, _, argument = text.strip()[1:].partition(" ")
    command = BY_NAME.get(name.lower())
    if command is None:
        close = difflib.get_close_matches(name.lower(), list(BY_NAME), n=3)
        hint = f"; did you mean {', '.join('/' + c for c in close)}?" if close else "; /help lists them"
        raise UnknownCommandError(f"unknown command /{name}{hint}")
    return command, argument.strip()


def mode_candidates(partial: str) -> list[tuple[str, str]]:
    """The approval modes, for `/mode ` completion."""
    notes = {Mode.READ_ONLY: "no edits; only read-only commands run", Mode.ASK: "edits and commands ask",
             Mode.AUTO_EDIT: "edits apply; commands ask", Mode.AUTO: "edits apply, commands run"}
    return [(mode.value, notes[mode]) for mode in Mode if mode.value.startswith(partial)]
