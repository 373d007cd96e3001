"""The inside of one `<tool_call>` block, in either Qwen form, turned into a name and an arguments object.

JSON form (Qwen2.5 / Qwen3, Hermes style):   {"name": "read_file", "arguments": {"path": "a.py"}}
XML form (Qwen3-Coder / Qwen3.5 and later):  <function=read_file><parameter=path>a.py</parameter></function>

XML parameter values are text. With the tool's JSON schema they are converted to the declared types (integer,
number, boolean, null, object, array); a value that does not fit its declared type is an error, so the model hears
about it instead of the tool receiving a string it did not expect.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any


class ToolCallSyntaxError(ValueError):
    """A tool-call body that cannot be read; the message says what is wrong."""


_FUNCTION_OPEN = re.compile(r"<function=([^>\n]*)>")
_FUNCTION_CLOSE = "</function>"
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {"object": dict, "array": list}


def tool_parameter_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> its parameters' property schemas, from OpenAI-style tool definitions (or bare functions)."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"tool definition without a function name: {tool!r}")
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        schemas[function["name"]] = dict(properties) if isinstance(properties, Mapping) else {}
    return schemas


def parse_tool_call_body(body: str, schemas: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of the text between <tool_call> and </tool_call>; raises ToolCallSyntaxError."""
    text = body.strip()
    if not text:
        raise ToolCallSyntaxError("empty tool call")
    if text.startswith("<function="):
        return _parse_xml(text, schemas)
    return _parse_json(text)


def _parse_json(text: str) -> tuple[str, dict[str, Any]]:
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise ToolCallSyntaxError(f"invalid JSON: {exc}") from None
    if text[end:].strip():
        raise ToolCallSyntaxError(f"unexpected text after the JSON object: {text[end:].strip()[:40]!r}")
    if not isinstance(value, dict):
        raise ToolCallSyntaxError(f"expected a JSON object with \"name\" and \"arguments\", got {type(value).__name__}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallSyntaxError("the JSON object has no \"name\" string")
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolCallSyntaxError(f"\"arguments\" is a string that is not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ToolCallSyntaxError(f"\"arguments\" must be a JSON object, got {type(arguments).__name__}")
    return name, arguments


def _parse_xml(text: str, schemas: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    opening = _FUNCTION_OPEN.match(text)
    name = opening.group(1).strip() if opening else ""
    if not name:
        raise ToolCallSyntaxError("<function=...> has no function name")
    if not text.endswith(_FUNCTION_CLOSE):
        raise ToolCallSyntaxError(f"<function={name}> is not closed by </function>")
    inner = text[opening.end():len(text) - len(_FUNCTION_CLOSE)]
    properties = schemas.get(name, {})
    arguments: dict[str, Any] = {}
    position = 0
    while (match := _PARAMETER.match(inner, position)) is not None:
        key = match.group(1).strip()
        if not key:
            raise ToolCallSyntaxError(f"<function={name}> has a <parameter=> without a name")
        if key in arguments:
            raise ToolCallSyntaxError(f"<function={name}> sets parameter {key!r} twice")
        arguments[key] = _convert(_strip_one_newline(match.group(2)), properties.get(key), name, key)
        position = match.end()
    rest = inner[position:].strip()
    if rest:
        raise ToolCallSyntaxError(f"unexpected text in <function={name}>: {rest[:40]!r} (parameters are written "
                                  "<parameter=NAME>value</parameter>)")
    return name, arguments


def _strip_one_newline(value: str) -> str:
    """Values are written on their own lines: drop the newline after the opening and before the closing tag."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _declared_types(schema: Mapping[str, Any] | None) -> list[str]:
    """The JSON types a property schema allows ([] when it does not say), including anyOf / oneOf branches."""
    if not isinstance(schema, Mapping):
        return []
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared or () if isinstance(t, str)]
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or ():
            types.extend(t for t in _declared_types(branch) if t not in types)
    return types


def _convert(value: str, schema: Mapping[str, Any] | None, name: str, key: str) -> Any:
    """The XML text value as the JSON type the schema declares; strings when it declares none (or string)."""
    types = _declared_types(schema)
    if not types or types == ["string"]:
        return value
    # Typed readings first, so ["integer", "string"] reads "3" as 3; a declared string is the catch-all.
    for kind in sorted(types, key=lambda t: t == "string"):
        converted = _as_type(value, kind)
        if converted is not _NO_MATCH:
            return converted
    expected = " or ".join(types)
    raise ToolCallSyntaxError(f"parameter {key!r} of {name}: expected {expected}, got {value!r}")


_NO_MATCH = object()


def _as_type(value: str, kind: str) -> Any:
    """value read as one JSON type, or _NO_MATCH."""
    text = value.strip()
    if kind == "string":
        return value
    if kind == "null":
        return None if text == "null" else _NO_MATCH
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), _NO_MATCH)
    if kind == "integer":
        return int(text) if re.fullmatch(r"[-+]?\d+", text) else _NO_MATCH
    if kind == "number":
        try:
            number = json.loads(text)
        except json.JSONDecodeError:
            return _NO_MATCH
        return number if isinstance(number, (int, float)) and not isinstance(number, bool) else _NO_MATCH
    if kind in _JSON_TYPES:
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            return _NO_MATCH
        return parsed if isinstance(parsed, _JSON_TYPES[kind]) else _NO_MATCH
    return _NO_MATCH  # unknown type names never match; a declared string still catches the value
