"""Incremental parsing of model output into reasoning, content and tool calls.

    parser = OutputParser(starts_in_reasoning=prompt_opens_reasoning(prompt), tools=tools)
    for delta in stream:  events = parser.feed(delta)
    events = parser.finish()

Recognised markup (Qwen families):
- `<think>...</think>` -> ReasoningDelta. `<think>` counts only at the start of the output (after whitespace);
  when the prompt already opened it, start with starts_in_reasoning=True.
- `<tool_call>...</tool_call>` -> ToolCall, in the JSON or the XML form (see toolargs.py), or MalformedToolCall
  when the body cannot be read or the output ends before `</tool_call>`. Nothing the model wrote is dropped.
- Everything else -> ContentDelta.

Streaming safety: text that could still become a tag (`<`, `<tool_`, `</thi`) is held back until the next delta
decides; if it is not a tag it is released as ordinary text. Whitespace next to a tag (the newlines around a tool
call or after `</think>`) is dropped, so deltas carry what a user reads. The events do not depend on how the output
was split into deltas, apart from how the text of consecutive deltas of one kind is divided.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.text.toolargs import ToolCallSyntaxError, parse_tool_call_body, tool_parameter_schemas

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Text of the model's reasoning (inside <think>)."""

    text: str


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Text of the answer shown to the user."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete, readable tool call. raw is the model's text from <tool_call> to </tool_call>."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass(frozen=True, slots=True)
class MalformedToolCall:
    """A tool call that could not be read (bad JSON, wrong types, unclosed); error says why."""

    raw: str
    error: str


Event = ReasoningDelta | ContentDelta | ToolCall | MalformedToolCall


def _partial_tag_length(text: str, tags: Sequence[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of one of tags (0 if none)."""
    longest = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


class OutputParser:
    """Splits streamed model output into typed events; feed() deltas, then finish() once."""

    def __init__(self, *, starts_in_reasoning: bool = False, tools: Sequence[Mapping[str, Any]] | None = None,
                 parse_reasoning: bool = True, parse_tool_calls: bool = True, call_id_prefix: str | None = None):
        self._schemas = tool_parameter_schemas(tools)
        self._parse_tool_calls = parse_tool_calls
        self._mode = "reasoning" if starts_in_reasoning else "content"
        self._think_allowed = parse_reasoning and not starts_in_reasoning
        self._skip_ws = starts_in_reasoning  # the prompt's "<think>\n" is a tag boundary too
        self._pending_ws = ""  # trailing whitespace of the current text, emitted once more text follows
        self._buf = ""  # text not yet turned into events
        self._scan_from = 0  # inside a tool call: where to resume looking for tags
        self._id_prefix = call_id_prefix if call_id_prefix is not None else f"call_{secrets.token_hex(6)}_"
        self._num_calls = 0
        self._events: list[Event] = []
        self._is_finished = False

    def feed(self, text: str) -> list[Event]:
        """Events completed by this delta of model output."""
        if self._is_finished:
            raise RuntimeError("OutputParser.feed() called after finish()")
        self._buf += text
        while self._step():
            pass
        return self._take_events()

    def finish(self) -> list[Event]:
        """Events for the rest of the output: held-back text, and an unclosed tool call as MalformedToolCall."""
        if self._is_finished:
            return []
        self._is_finished = True
        if self._mode == "tool_call":
            self._events.append(MalformedToolCall(CALL_OPEN + self._buf, "the output ended inside <tool_call> "
                                                                         "(no </tool_call>)"))
        else:
            self._emit_text(self._buf)
            self._flush_pending_ws()
        self._buf = ""
        return self._take_events()

    # ---- the state machine: each step consumes a tag or the text before one; False when it needs more input ----

    def _step(self) -> bool:
        if self._mode == "tool_call":
            return self._step_tool_call()
        if self._mode == "content" and self._think_allowed and not self._step_think_opening():
            return False
        close = THINK_CLOSE if self._mode == "reasoning" else None
        tags = [close] if close else ([CALL_OPEN] if self._parse_tool_calls else [])
        found = [(self._buf.find(tag), tag) for tag in tags]
        found = [(index, tag) for index, tag in found if index >= 0]
        if not found:
            keep = _partial_tag_length(self._buf, tags)
            self._emit_text(self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        index, tag = min(found)
        self._emit_text(self._buf[:index])
        self._buf = self._buf[index + len(tag):]
        self._enter("content" if tag == THINK_CLOSE else "tool_call")
        return True

    def _step_think_opening(self) -> bool:
        """At the start of the output: take `<think>`, wait while it may still come, else rule it out."""
        stripped = self._buf.lstrip()
        if stripped.startswith(THINK_OPEN):
            self._buf = stripped[len(THINK_OPEN):]
            self._enter("reasoning")
            return True
        if THINK_OPEN.startswith(stripped):  # only whitespace or a prefix of <think> so far
            return False
        self._think_allowed = False
        return True

    def _step_tool_call(self) -> bool:
        close = self._buf.find(CALL_CLOSE, self._scan_from)
        reopen = self._buf.find(CALL_OPEN, self._scan_from)
        if close < 0 and reopen < 0:
            # Resume the search where a tag could still begin, so long bodies are scanned once.
            self._scan_from = max(0, len(self._buf) - len(CALL_CLOSE) + 1)
            return False
        if reopen >= 0 and (close < 0 or reopen < close):
            # A new call opened before this one closed: report this one, then parse the new one.
            raw = CALL_OPEN + self._buf[:reopen]
            self._events.append(MalformedToolCall(raw, "<tool_call> not closed before the next <tool_call>"))
            self._buf = self._buf[reopen + len(CALL_OPEN):]
            self._scan_from = 0
            return True
        body = self._buf[:close]
        self._events.append(self._tool_call_event(body))
        self._buf = self._buf[close + len(CALL_CLOSE):]
        self._enter("content")
        return True

    def _tool_call_event(self, body: str) -> ToolCall | MalformedToolCall:
        raw = CALL_OPEN + body + CALL_CLOSE
        try:
            name, arguments = parse_tool_call_body(body, self._schemas)
        except ToolCallSyntaxError as exc:
            return MalformedToolCall(raw, str(exc))
        call_id = f"{self._id_prefix}{self._num_calls}"
        self._num_calls += 1
        return ToolCall(call_id, name, arguments, raw)

    def _enter(self, mode: str) -> None:
        """Switches mode at a tag: whitespace on both sides of the tag is dropped."""
        self._mode = mode
        self._pending_ws = ""
        self._skip_ws = True
        self._scan_from = 0
        self._think_allowed = False

    # ---- text emission ----------------------------------------------------------------------------------------

    def _emit_text(self, text: str) -> None:
        if self._skip_ws:
            text = text.lstrip()
            if not text:
                return
            self._skip_ws = False
        body = text.rstrip()
        if not body:
            self._pending_ws += text
            return
        self._push(self._pending_ws + body)
        self._pending_ws = text[len(body):]

    def _flush_pending_ws(self) -> None:
        if self._pending_ws:
            self._push(self._pending_ws)
            self._pending_ws = ""

    def _push(self, text: str) -> None:
        kind = ReasoningDelta if self._mode == "reasoning" else ContentDelta
        if self._mode == "content":
            self._think_allowed = False
        if self._events and type(self._events[-1]) is kind:
            self._events[-1] = kind(self._events[-1].text + text)
        else:
            self._events.append(kind(text))

    def _take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events
