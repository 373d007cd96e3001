"""Printing agent events for headless runs: readable progress, or one JSON object per line."""

from __future__ import annotations

import json
from typing import TextIO

from openjet_tui.agent import events as ev


class JsonPrinter:
    """Every event as one JSON Lines record on stdout."""

    def __init__(self, out: TextIO):
        self.out = out

    def __call__(self, event: ev.Event) -> None:
        """Write one record and flush (a reader may be waiting on it)."""
        self.out.write(json.dumps(event.to_json(), ensure_ascii=False) + "\n")
        self.out.flush()


class HumanPrinter:
    """Reply text on stdout; tool activity, diffs, decisions and problems on stderr."""

    def __init__(self, out: TextIO, err: TextIO):
        self.out, self.err = out, err
        self._mid_line = False

    def _note(self, text: str) -> None:
        if self._mid_line:
            self.out.write("\n")
            self.out.flush()
            self._mid_line = False
        self.err.write(text + "\n")
        self.err.flush()

    def __call__(self, event: ev.Event) -> None:
        """Render one event."""
        if isinstance(event, ev.TextDelta):
            self.out.write(event.text)
            self.out.flush()
            self._mid_line = not event.text.endswith("\n")
            return
        text = self.describe(event)
        if text is not None:
            self._note(text)
        elif isinstance(event, ev.TurnFinished) and self._mid_line:  # end the reply's last line
            self.out.write("\n")
            self.out.flush()
            self._mid_line = False

    def describe(self, event: ev.Event) -> str | None:
        """The progress line(s) for an event, or None for events not shown."""
        if isinstance(event, ev.ToolRequested):
            args = ", ".join(f"{k}={_short(v)}" for k, v in event.arguments.items())
            return f"-> {event.name}({args})"
        if isinstance(event, ev.ProposalCreated):
            return event.proposal.diff().rstrip("\n")
        if isinstance(event, ev.ProposalResolved):
            total = len(event.applied) + len(event.rejected)
            why = f" ({event.reason})" if event.reason else ""
            return f"   {event.path}: {event.status}, {len(event.applied)} of {total} hunks applied{why}"
        if isinstance(event, ev.ShellResolved):
            if event.allowed:
                return f"   $ {event.command}  [running; {event.decided_by}: {event.reason}]"
            return f"   $ {event.command}  [not run; {event.reason}]"
        if isinstance(event, ev.ToolResult) and event.is_error:
            return "   " + event.content.splitlines()[0]
        if isinstance(event, ev.SlipstreamTraffic):
            return f"   [cloud] {event.request_bytes} bytes sent to {event.endpoint} " \
                   f"({event.total_requests} requests, {event.total_bytes_sent} bytes in all)"
        if isinstance(event, ev.Compacted):
            return f"   [compacted {event.num_messages} older messages into a summary]"
        if isinstance(event, ev.Notice):
            return f"{event.level}: {event.message}"
        if isinstance(event, ev.ErrorEvent):
            return f"error: {event.message}"
        if isinstance(event, ev.TurnFinished):
            return None if event.status == "done" else f"[turn {event.status} after {event.num_steps} steps]"
        return None


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit - 3] + "..."
