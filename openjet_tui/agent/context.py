"""What the model sees: the system prompt (prompt file + AGENTS.md + summary) and compaction of old turns."""

from __future__ import annotations

import datetime
import json
import string
from pathlib import Path
from typing import Any

from openjet_tui.agent.shellpolicy import Mode
from openjet_tui.errors import ConfigError, LLMError
from openjet_tui.llm.client import ChatClient
from openjet_tui.llm.probe import estimate_tokens

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "assets" / "prompts"
AGENTS_FILE = "AGENTS.md"
MAX_AGENTS_CHARS = 20_000
MAX_TRANSCRIPT_RESULT_CHARS = 1500
MODE_NOTES = {
    Mode.READ_ONLY: ("You may read and search; edits are refused and only read-only commands run (ls, cat, grep, "
                     "git status/diff/log, ...); anything that writes files is refused."),
    Mode.ASK: "Edits and commands need the person's approval unless a rule allows the command.",
    Mode.AUTO_EDIT: "Edits are applied without asking; commands need approval unless a rule allows them.",
    Mode.AUTO: "Edits apply and commands run without asking, except those denied by policy.",
}


def load_prompt(name: str) -> str:
    """The text of assets/prompts/<name>.md."""
    path = PROMPTS_DIR / f"{name}.md"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"prompt file {path} is missing; the installation is incomplete") from None


def load_agents_md(root: Path) -> str | None:
    """The workspace's AGENTS.md (project instructions for agents), capped in size; None if there is none."""
    path = root / AGENTS_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if len(text) > MAX_AGENTS_CHARS:
        text = text[:MAX_AGENTS_CHARS] + f"\n[AGENTS.md truncated at {MAX_AGENTS_CHARS} characters]"
    return text or None


def build_system_prompt(root: Path, mode: Mode, agents_md: str | None, summary: str | None = None,
                        prompt: str = "system") -> str:
    """Fill the prompt template, then add project instructions and the summary of compacted turns."""
    text = string.Template(load_prompt(prompt)).safe_substitute(
        workspace=str(root), mode=mode.value, mode_note=MODE_NOTES[mode], date=datetime.date.today().isoformat())
    if agents_md:
        text += f"\n\n# Project instructions ({AGENTS_FILE})\n\n{agents_md}"
    if summary:
        text += f"\n\n# Summary of the earlier conversation\n\n{summary}"
    return text


def wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as sent to the server: private keys (`_id`, `_origin`) and stored reasoning removed."""
    return [{k: v for k, v in m.items() if not k.startswith("_") and k != "reasoning"} for m in messages]


def estimate_message_tokens(messages: list[dict[str, Any]]) -> int:
    """A conservative token estimate for messages the server has not counted yet."""
    return estimate_tokens(json.dumps(wire(messages), ensure_ascii=False))


def split_turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Group the history into turns, each starting at a user message (tool calls stay with their results)."""
    turns: list[list[dict[str, Any]]] = []
    for message in messages:
        if message["role"] == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def plan_compaction(messages: list[dict[str, Any]],
                    keep_recent_turns: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """Split into (old messages to summarise, recent turns kept whole); None if there is nothing old."""
    turns = split_turns(messages)
    keep = max(1, keep_recent_turns)
    if len(turns) <= keep:
        return None
    old = [m for turn in turns[:-keep] for m in turn]
    recent = [m for turn in turns[-keep:] for m in turn]
    return old, recent


def render_transcript(messages: list[dict[str, Any]]) -> str:
    """A plain-text transcript for the summariser; long tool results are cut."""
    lines = []
    for message in messages:
        role = message["role"]
        content = message.get("content") or ""
        if role == "tool":
            if len(content) > MAX_TRANSCRIPT_RESULT_CHARS:
                content = content[:MAX_TRANSCRIPT_RESULT_CHARS] + " [...]"
            lines.append(f"TOOL RESULT: {content}")
            continue
        if content:
            lines.append(f"{role.upper()}: {content}")
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            lines.append(f"TOOL CALL {fn.get('name')}: {fn.get('arguments')}")
    return "\n\n".join(lines)


async def summarise(client: ChatClient, old: list[dict[str, Any]], previous: str | None) -> str:
    """Ask the model for a summary of old messages (folding in an earlier summary)."""
    transcript = render_transcript(old)
    if previous:
        transcript = f"EARLIER SUMMARY:\n{previous}\n\n{transcript}"
    result = await client.complete([{"role": "system", "content": load_prompt("compact")},
                                    {"role": "user", "content": transcript}])
    summary = result.content.strip()
    if not summary:
        raise LLMError("the model returned an empty summary; the conversation was not compacted")
    return summary
