"""Decoding an OpenAI-compatible SSE stream: events from bytes, tool calls per index, reasoning, usage, timings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from openjet_tui.errors import LLMResponseError
from openjet_tui.llm.types import (ChatResult, ContentDelta, ReasoningDelta, StreamPart, Timings, ToolCall, Usage,
                                   decode_arguments)

DONE = "[DONE]"


class SSEDecoder:
    """Turns raw bytes into the `data` payloads of server-sent events (comments and other fields ignored)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """Add bytes; return the data payloads of every event completed by them."""
        self._buffer += chunk
        events: list[str] = []
        while (cut := self._buffer.find(b"\n")) >= 0:
            line = self._buffer[:cut].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[cut + 1:]
            self._line(line, events)
        return events

    def close(self) -> list[str]:
        """Flush an event the server did not end with a blank line."""
        events: list[str] = []
        if self._buffer:
            self._line(self._buffer.rstrip(b"\r").decode("utf-8", errors="replace"), events)
            self._buffer = b""
        self._line("", events)
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if line == "":  # a blank line ends the event
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):  # comment / keep-alive
            return
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)


@dataclass(slots=True)
class _PartialCall:
    id: str | None = None
    name: str = ""
    arguments: str = ""
    arguments_object: dict[str, Any] | None = None


class ToolCallAssembler:
    """Accumulates `delta.tool_calls` fragments per index; the first fragment of an index names the call."""

    def __init__(self) -> None:
        self._calls: dict[int, _PartialCall] = {}

    def add(self, fragments: list[dict[str, Any]]) -> None:
        """Merge one chunk's tool-call fragments."""
        for position, fragment in enumerate(fragments):
            index = fragment.get("index")
            if not isinstance(index, int):  # some servers omit the index: position in the chunk then
                index = position if fragment.get("id") is None else self._index_for_id(fragment["id"])
            call = self._calls.setdefault(index, _PartialCall())
            if fragment.get("id"):
                call.id = str(fragment["id"])
            fn = fragment.get("function") or {}
            if fn.get("name"):  # usually sent once; some servers repeat it, a few stream it in pieces
                name = str(fn["name"])
                call.name = name if not call.name or name.startswith(call.name) else call.name + name
            args = fn.get("arguments")
            if isinstance(args, dict):  # a whole object in one chunk (older Ollama)
                call.arguments_object = args
            elif isinstance(args, str):
                call.arguments += args

    def _index_for_id(self, call_id: object) -> int:
        for index, call in self._calls.items():
            if call.id == call_id:
                return index
        return len(self._calls)

    def finish(self) -> list[ToolCall]:
        """The completed calls in index order, arguments decoded (errors kept for the model to read)."""
        calls: list[ToolCall] = []
        for number, index in enumerate(sorted(self._calls)):
            part = self._calls[index]
            raw = part.arguments_object if part.arguments_object is not None else part.arguments
            arguments, error = decode_arguments(raw)
            calls.append(ToolCall(part.id or f"call_{number}", part.name, arguments, error))
        return calls


class ThinkSplitter:
    """Routes `<think>...</think>` inside content to reasoning, for servers that do not split it themselves."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self) -> None:
        self._inside = False
        self._pending = ""

    def feed(self, text: str) -> list[StreamPart]:
        """Split a content fragment; text that might be the start of a tag is held back."""
        self._pending += text
        parts: list[StreamPart] = []
        while self._pending:
            tag = self.CLOSE if self._inside else self.OPEN
            cut = self._pending.find(tag)
            if cut >= 0:
                self._emit(self._pending[:cut], parts)
                self._pending = self._pending[cut + len(tag):]
                self._inside = not self._inside
                continue
            keep = _partial_suffix(self._pending, tag)
            self._emit(self._pending[:len(self._pending) - keep], parts)
            self._pending = self._pending[len(self._pending) - keep:]
            break
        return parts

    def close(self) -> list[StreamPart]:
        """Flush held-back text."""
        parts: list[StreamPart] = []
        self._emit(self._pending, parts)
        self._pending = ""
        return parts

    def _emit(self, text: str, parts: list[StreamPart]) -> None:
        if text:
            parts.append(ReasoningDelta(text) if self._inside else ContentDelta(text))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


@dataclass(slots=True)
class ReplyBuilder:
    """Feeds decoded chunks in, yields stream parts out, and builds the final ChatResult."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    think: ThinkSplitter = field(default_factory=ThinkSplitter)
    result: ChatResult = field(default_factory=ChatResult)

    def feed_chunk(self, chunk: dict[str, Any]) -> list[StreamPart]:
        """Take one parsed SSE chunk (or a whole non-streaming response)."""
        if "error" in chunk:
            raise LLMResponseError(f"server error in stream: {_error_text(chunk['error'])}")
        if isinstance(chunk.get("usage"), dict):
            self.result.usage = Usage.from_json(chunk["usage"])
        if isinstance(chunk.get("timings"), dict):
            self.result.timings = Timings.from_json(chunk["timings"])
        self.result.model = chunk.get("model") or self.result.model
        parts: list[StreamPart] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or choice.get("message") or {}
            parts += self._delta(delta)
            if choice.get("finish_reason"):
                self.result.finish_reason = choice["finish_reason"]
        return parts

    def _delta(self, delta: dict[str, Any]) -> list[StreamPart]:
        parts: list[StreamPart] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            parts.append(ReasoningDelta(reasoning))
        if isinstance(delta.get("content"), str) and delta["content"]:
            parts += self.think.feed(delta["content"])
        if isinstance(delta.get("tool_calls"), list):
            self.calls.add(delta["tool_calls"])
        for part in parts:
            (self.content if isinstance(part, ContentDelta) else self.reasoning).append(part.text)
        return parts

    def finish(self) -> tuple[list[StreamPart], ChatResult]:
        """Flush held-back text and return it with the completed reply."""
        tail = self.think.close()
        for part in tail:
            (self.content if isinstance(part, ContentDelta) else self.reasoning).append(part.text)
        self.result.content = "".join(self.content)
        self.result.reasoning = "".join(self.reasoning)
        self.result.tool_calls = self.calls.finish()
        return tail, self.result


def parse_event(data: str) -> dict[str, Any] | None:
    """Decode one SSE data payload; None for the terminating `[DONE]`."""
    if data.strip() == DONE:
        return None
    try:
        value = json.loads(data)
    except json.JSONDecodeError as exc:
        raise LLMResponseError(f"malformed stream chunk ({exc.msg}): {data[:200]!r}") from exc
    if not isinstance(value, dict):
        raise LLMResponseError(f"stream chunk is not a JSON object: {data[:200]!r}")
    return value


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
