"""Tool calls that arrive as plain text: Hermes `<tool_call>{json}</tool_call>`, Qwen3-Coder
`<function=NAME><parameter=K>v</parameter></function>`, and a bare JSON object or ```json block naming an offered
tool (what small Qwen2.5 models answer through servers that do not parse tool calls)."""

from __future__ import annotations

import json
import re
from typing import Any

from openjet_tui.llm.types import ToolCall, decode_arguments

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_FENCE = re.compile(r"```(?:json|tool_call|JSON)?[ \t]*\n(.*?)\n?```", re.DOTALL)
_ARGUMENT_KEYS = ("arguments", "parameters")


def offered_tools(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Map each offered tool name to its JSON-schema parameters."""
    offered: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function") or {}
        if fn.get("name"):
            offered[fn["name"]] = fn.get("parameters") or {}
    return offered


def extract_text_tool_calls(text: str, tools: list[dict[str, Any]] | None) -> tuple[str, list[ToolCall]]:
    """Find tool calls written as text; returns (text with the calls removed, calls). Only offered names count."""
    offered = offered_tools(tools)
    if not offered or not text.strip():
        return text, []
    for extract in (_tagged_calls, _fenced_calls, _bare_calls):
        remaining, calls = extract(text, offered)
        if calls:
            for number, call in enumerate(calls):
                call.id, call.source = f"call_text_{number}", "text"
            return remaining.strip(), calls
    return text, []


def _tagged_calls(text: str, offered: dict[str, dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """Both Qwen forms: JSON inside <tool_call>, or <function=...> (with or without the <tool_call> wrapper)."""
    calls: list[ToolCall] = []
    spans: list[tuple[int, int]] = []
    for match in _TOOL_CALL.finditer(text):
        body = match.group(1)
        found = _function_calls(body, offered) if "<function=" in body else _json_calls(body, offered)
        if found:
            calls += found
            spans.append(match.span())
    if not calls and "<function=" in text:
        for match in _FUNCTION.finditer(text):
            found = _function_calls(match.group(0), offered)
            if found:
                calls += found
                spans.append(match.span())
    return _cut(text, spans), calls


def _function_calls(body: str, offered: dict[str, dict[str, Any]]) -> list[ToolCall]:
    calls = []
    for match in _FUNCTION.finditer(body):
        name = match.group(1).strip()
        if name not in offered:
            continue
        properties = offered[name].get("properties") or {}
        arguments = {key.strip(): _typed_value(_strip_one_newline(value), properties.get(key.strip()))
                     for key, value in _PARAMETER.findall(match.group(2))}
        calls.append(ToolCall("", name, arguments))
    return calls


def _strip_one_newline(value: str) -> str:
    """Qwen3-Coder puts the value on its own line; strip exactly that framing, keep the rest verbatim."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _typed_value(value: str, schema: dict[str, Any] | None) -> Any:
    """Values arrive as text; decode them when the tool's schema says they are not strings."""
    kind = (schema or {}).get("type")
    if kind in (None, "string"):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _json_calls(body: str, offered: dict[str, dict[str, Any]]) -> list[ToolCall]:
    try:
        value = json.loads(body.strip())
    except json.JSONDecodeError:
        return []
    return _calls_from_value(value, offered)


def _calls_from_value(value: Any, offered: dict[str, dict[str, Any]]) -> list[ToolCall]:
    """A call object ({"name", "arguments"|"parameters"}) or a list of them, naming offered tools only."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return []
        if isinstance(item.get("function"), dict):  # OpenAI-shaped object written as text
            item = item["function"]
        name = item.get("name")
        if name not in offered:
            return []
        raw = next((item[key] for key in _ARGUMENT_KEYS if key in item), {})
        arguments, error = decode_arguments(raw)
        calls.append(ToolCall("", name, arguments, error))
    return calls


def _fenced_calls(text: str, offered: dict[str, dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    calls: list[ToolCall] = []
    spans = []
    for match in _FENCE.finditer(text):
        try:
            value = json.loads(match.group(1).strip())
        except json.JSONDecodeError:
            continue
        found = _calls_from_value(value, offered)
        if found and _has_argument_key(value):
            calls += found
            spans.append(match.span())
    return _cut(text, spans), calls


def _bare_calls(text: str, offered: dict[str, dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """JSON objects (or arrays of them) that start a line and name an offered tool."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    spans = []
    for match in re.finditer(r"(?m)^[ \t]*([\[{])", text):
        start = match.start(1)
        if spans and start < spans[-1][1]:
            continue
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        found = _calls_from_value(value, offered)
        if found and _has_argument_key(value):
            calls += found
            spans.append((start, end))
    return _cut(text, spans), calls


def _has_argument_key(value: Any) -> bool:
    """A bare object must look like a call, not merely contain a "name" field that happens to match."""
    items = value if isinstance(value, list) else [value]
    return all(isinstance(item, dict) and any(key in (item.get("function") or item) for key in _ARGUMENT_KEYS)
               for item in items)


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    for start, end in reversed(spans):
        text = text[:start] + text[end:]
    return text
