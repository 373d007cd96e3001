"""The small value types every chat client speaks: tool calls, usage, engine timings, a finished reply."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCall:
    """One tool call asked for by the model; `arguments_error` says why arguments could not be decoded."""

    id: str
    name: str
    arguments: dict[str, Any]
    arguments_error: str | None = None
    source: str = "native"  # "native": structured delta; "text": parsed from plain content

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI wire form, with arguments as a JSON string."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }

    @classmethod
    def from_openai(cls, item: dict[str, Any]) -> ToolCall:
        """Rebuild a call from its wire form (as stored in a session)."""
        fn = item.get("function") or {}
        arguments, error = decode_arguments(fn.get("arguments"))
        return cls(id=str(item.get("id") or ""), name=str(fn.get("name") or ""), arguments=arguments,
                   arguments_error=error)


def decode_arguments(raw: object) -> tuple[dict[str, Any], str | None]:
    """Decode tool arguments sent as a JSON string or an object; returns (arguments, error or None)."""
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return {}, f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"arguments are not valid JSON ({exc.msg} at character {exc.pos}): {raw[:200]!r}"
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


@dataclass(slots=True)
class Usage:
    """Token counts the server reported for one request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int | None = None  # completion_tokens_details.reasoning_tokens, when the server counts them

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Usage:
        """Parse an OpenAI `usage` object, tolerating missing fields."""
        prompt = int(data.get("prompt_tokens") or 0)
        completion = int(data.get("completion_tokens") or 0)
        details = data.get("completion_tokens_details")
        reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
        return cls(prompt, completion, int(data.get("total_tokens") or prompt + completion),
                   int(reasoning) if isinstance(reasoning, (int, float)) else None)


@dataclass(slots=True)
class Timings:
    """Engine-side speed figures (llama.cpp's `timings` object; OpenJet's engine sends the same)."""

    prompt_n: int | None = None
    prompt_per_second: float | None = None
    predicted_n: int | None = None
    predicted_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timings:
        """Parse a `timings` object, keeping only the fields we know."""
        def num(key: str, kind: type) -> Any:
            """The field converted to kind, or None when missing or not a number."""
            value = data.get(key)
            return kind(value) if isinstance(value, (int, float)) else None

        return cls(num("prompt_n", int), num("prompt_per_second", float), num("predicted_n", int),
                   num("predicted_per_second", float), num("draft_n", int), num("draft_n_accepted", int))

    @property
    def acceptance_rate(self) -> float | None:
        """Share of drafted tokens the target model accepted, when the server drafted at all."""
        if not self.draft_n or self.draft_n_accepted is None:
            return None
        return self.draft_n_accepted / self.draft_n


@dataclass(slots=True)
class ContentDelta:
    """A piece of visible reply text as it streams in."""

    text: str


@dataclass(slots=True)
class ReasoningDelta:
    """A piece of reasoning ("thinking") text as it streams in."""

    text: str


@dataclass(slots=True)
class ChatResult:
    """One finished model reply: text, reasoning, tool calls and whatever figures the server reported."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    model: str | None = None

    def to_message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation history."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


StreamPart = ContentDelta | ReasoningDelta | ChatResult
