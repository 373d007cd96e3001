"""`openjet sessions list|show|export`: stored sessions as a table, a summary, or a Markdown transcript."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from openjet_tui.agent.sessions import SessionInfo, SessionStore
from openjet_tui.errors import SessionError

MAX_RESULT_CHARS = 4000


def _when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")


def list_sessions(store: SessionStore, workspace: Path | None) -> str:
    """One line per session, newest first."""
    sessions = store.list(workspace)
    if not sessions:
        return "no sessions" + (f" for {workspace}" if workspace else "")
    rows = [f"{s.id}  {_when(s.updated_at)}  {s.mode or '-':9}  {s.workspace}  {s.title[:50]}" for s in sessions]
    return "\n".join(rows)


def _header(info: SessionInfo) -> list[str]:
    return [f"# Session {info.id}: {info.title or '(untitled)'}", "",
            f"- Workspace: `{info.workspace}`",
            f"- Provider: {info.provider or '-'}, model: {info.model or '-'}, mode: {info.mode or '-'}",
            f"- Started {_when(info.created_at)}, last used {_when(info.updated_at)}", ""]


def _message_lines(message: dict[str, Any]) -> list[str]:
    role, content = message["role"], message.get("content") or ""
    origin = message.get("_origin", "local")
    tag = "" if origin == "local" else f" ({origin})"
    if role == "tool":
        if len(content) > MAX_RESULT_CHARS:
            content = content[:MAX_RESULT_CHARS] + f"\n[... {len(content) - MAX_RESULT_CHARS} more characters]"
        return [f"**Tool result**{tag} `{message.get('tool_call_id')}`", "", "````text", content, "````", ""]
    lines = [f"## {role.capitalize()}{tag}", ""]
    if content:
        lines += [content, ""]
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        lines += [f"**Tool call** `{fn.get('name')}` `{call.get('id')}`", "", "```json",
                  json.dumps(json.loads(fn.get("arguments") or "{}"), indent=2, ensure_ascii=False), "```", ""]
    return lines


def _proposal_lines(row: dict[str, Any]) -> list[str]:
    applied = [i + 1 for i in json.loads(row["applied"] or "[]")]
    rejected = [i + 1 for i in json.loads(row["rejected"] or "[]")]
    reasons = {int(k) + 1: v for k, v in json.loads(row["hunk_reasons"] or "{}").items() if v}
    lines = [f"### `{row['rel_path']}` ({row['tool']}): {row['status']}", "",
             f"Hunks applied: {applied or 'none'}; rejected: {rejected or 'none'}"
             + (f"; reason: {row['reason']}" if row["reason"] else ""), ""]
    lines += [f"- hunk {number}: {reason}" for number, reason in sorted(reasons.items())]
    return lines + ["", "```diff", row["diff"].rstrip("\n"), "```", ""]


def export_markdown(store: SessionStore, session_id: str) -> str:
    """The whole session as Markdown: conversation (compacted turns included), edits with decisions, commands."""
    info = store.get(session_id)
    lines = _header(info)
    if info.summary:
        lines += ["## Summary of compacted turns", "", info.summary, ""]
    for message in store.messages(info.id, include_compacted=True):
        lines += _message_lines(message)
    proposals = store.proposals(info.id)
    if proposals:
        lines += ["## Edit proposals", ""]
        for row in proposals:
            lines += _proposal_lines(row)
    commands = store.shell_commands(info.id)
    if commands:
        lines += ["## Shell commands", ""]
        for row in commands:
            outcome = f"exit {row['exit_code']}" if row["exit_code"] is not None else "no exit code"
            verdict = f"allowed by {row['decided_by']}, {outcome}" if row["allowed"] else \
                f"denied by {row['decided_by']}: {row['reason']}"
            lines.append(f"- `{row['command']}`: {verdict}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def show_session(store: SessionStore, session_id: str) -> str:
    """A short overview: header, counts, and each proposal's decision."""
    info = store.get(session_id)
    messages = store.messages(info.id, include_compacted=True)
    lines = [line.lstrip("#- ").rstrip() for line in _header(info) if line]
    lines.append(f"{len(messages)} messages, {sum(1 for m in messages if m['role'] == 'user')} from you")
    for row in store.proposals(info.id):
        applied, rejected = json.loads(row["applied"] or "[]"), json.loads(row["rejected"] or "[]")
        lines.append(f"edit {row['rel_path']}: {row['status']} ({len(applied)} applied, {len(rejected)} rejected)")
    for row in store.shell_commands(info.id):
        lines.append(f"command `{row['command']}`: {'allowed' if row['allowed'] else 'denied'}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`openjet sessions list|show|export`."""
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="list sessions, newest first")
    listing.add_argument("--workspace", type=Path, help="only sessions of this folder")
    show = actions.add_parser("show", help="summarise one session")
    show.add_argument("id")
    export = actions.add_parser("export", help="export one session")
    export.add_argument("id")
    export.add_argument("--markdown", action="store_true", default=True, help="as Markdown (the default)")
    export.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    """Carry out the sessions action."""
    store = SessionStore()
    try:
        if args.action == "list":
            text = list_sessions(store, args.workspace.resolve() if args.workspace else None)
        elif args.action == "show":
            text = show_session(store, args.id)
        else:
            text = export_markdown(store, args.id)
            if args.output:
                args.output.write_text(text, encoding="utf-8")
                return 0
    except SessionError as exc:
        print(f"openjet: error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(text.rstrip("\n"))
    return 0
