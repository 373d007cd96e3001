"""OpenAI response bodies: chat completions (whole and as stream chunks) and legacy completions.

ChatOutput turns generated text into chat deltas through the OutputParser (engine.text): reasoning becomes
`reasoning_content`, `<tool_call>` blocks become `tool_calls` (each streamed whole in one delta that carries index,
id, type, name and the JSON arguments, OpenAI's first-chunk-of-an-index form), a tool call the parser could not read
is passed on as content, so nothing the model wrote is lost. A reply that is only a JSON call of an offered tool
(the form small models often use instead of the tags) becomes a tool call too (engine.server.textcalls).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

from engine.server.generation import Finished
from engine.server.textcalls import TextCallDetector
from engine.server.textstream import TokenLogprob
from engine.text.toolargs import tool_parameter_schemas
from engine.text.toolcalls import ContentDelta, Event, MalformedToolCall, OutputParser, ReasoningDelta, ToolCall


def new_id(prefix: str) -> str:
    """A response id like OpenAI's (chatcmpl-..., cmpl-...)."""
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(finished: Finished, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object, with the prefix-cache hit as prompt_tokens_details.cached_tokens and, for chat
    replies, completion_tokens_details.reasoning_tokens."""
    body: dict[str, Any] = {"prompt_tokens": finished.num_prompt_tokens, "completion_tokens": finished.num_generated,
                            "total_tokens": finished.num_prompt_tokens + finished.num_generated,
                            "prompt_tokens_details": {"cached_tokens": finished.num_cached_tokens}}
    if reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """Chat-format logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    return {"content": [
        {"token": e.text, "logprob": e.logprob, "bytes": list(e.raw),
         "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(raw)} for _, t, raw, lp in e.top]}
        for e in entries
    ]}


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """Legacy logprobs: parallel lists of tokens, logprobs, top alternatives and text offsets (from offset)."""
    offsets, position = [], offset
    for e in entries:
        offsets.append(position)
        position += len(e.text)
    return {"tokens": [e.text for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t: lp for _, t, _, lp in e.top} for e in entries], "text_offset": offsets}


class ChatOutput:
    """Generated text -> chat deltas; accumulates the whole message for non-streamed replies."""

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None, starts_in_reasoning: bool):
        self._parser = OutputParser(starts_in_reasoning=starts_in_reasoning, tools=tools,
                                    parse_tool_calls=bool(tools))
        self._text_calls = TextCallDetector(tool_parameter_schemas(tools))
        self.content, self.reasoning = "", ""
        self.tool_calls: list[dict[str, Any]] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas completed by this text."""
        return self._deltas(self._parser.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        """Deltas for the rest of the output."""
        out = self._deltas(self._parser.finish())
        held, call = self._text_calls.finish()
        if held:
            out.append(self._content(held))
        if call is not None:
            out.append(self._tool_call(*call))
        return out

    def _deltas(self, events: list[Event]) -> list[dict[str, Any]]:
        out = []
        for event in events:
            if isinstance(event, ReasoningDelta):
                self.reasoning += event.text
                out.append({"reasoning_content": event.text})
            elif isinstance(event, ContentDelta):
                released = self._text_calls.feed(event.text)
                if released:
                    out.append(self._content(released))
            elif isinstance(event, ToolCall):
                out.append(self._tool_call(event.id, event.name, event.arguments))
            elif isinstance(event, MalformedToolCall):
                out.append(self._content(event.raw))
        return out

    def _content(self, text: str) -> dict[str, Any]:
        self.content += text
        return {"content": text}

    def _tool_call(self, call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        call = {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
        self.tool_calls.append(call)
        return {"tool_calls": [{"index": len(self.tool_calls) - 1, **call}]}

    def finish_reason(self, finished: Finished) -> str:
        """OpenAI's finish_reason: tool_calls when the model called a tool and stopped on its own."""
        return "tool_calls" if self.tool_calls and finished.finish_reason == "stop" else finished.finish_reason

    def message(self) -> dict[str, Any]:
        """The whole assistant message."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


class ChatChunks:
    """Builds chat.completion.chunk objects sharing one id, model and creation time."""

    def __init__(self, model: str):
        self.id, self.model, self.created = new_id("chatcmpl"), model, int(time.time())

    def chunk(self, delta: dict[str, Any] | None, finish_reason: str | None = None,
              logprobs: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        """One chunk; delta None gives a chunk with no choices (the usage chunk)."""
        choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": logprobs,
                                             "finish_reason": finish_reason}]
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices, **extra}


def chat_completion(model: str, output: ChatOutput, finished: Finished, finish_reason: str,
                    logprobs: list[TokenLogprob] | None, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """The non-streamed chat.completion object."""
    return {
        "id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": output.message(), "finish_reason": finish_reason,
                     "logprobs": None if logprobs is None else chat_logprobs(logprobs)}],
        "usage": usage(finished, reasoning_tokens), "timings": finished.timings(),
    }


def completion_chunk(response_id: str, model: str, created: int, text: str, finish_reason: str | None,
                     logprobs: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """One legacy text_completion object (whole reply, or one streamed piece of it)."""
    return {"id": response_id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}], **extra}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()
