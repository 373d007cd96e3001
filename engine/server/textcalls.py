"""Tool calls small models write as plain text: a reply that is only `{"name": ..., "arguments": {...}}`, bare or in
a ```json fence, instead of inside <tool_call> tags.

Qwen2.5-Coder-0.5B answers a tool-offering prompt this way more often than not. When tools are offered and the
content begins like such a call (`{` or a ```json fence), it is held back to the end of the reply; if the whole
content then reads as a call of an offered tool, it becomes a tool call, otherwise it is released unchanged.
Content that begins any other way streams at once, as usual.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any

from engine.text.toolargs import ToolCallSyntaxError, parse_tool_call_body

_FENCE = re.compile(r"^```(?:json)?[ \t]*\n(.*)\n```$", re.DOTALL)
_OPENINGS = ("{", "```json", "```\n{")


class TextCallDetector:
    """Holds content that may be a text-form tool call; see the module docstring."""

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]]):
        self._schemas = schemas
        self._held = ""
        self._is_candidate = bool(schemas)  # until the content shows it is not a call
        self._id_prefix = f"call_{secrets.token_hex(6)}_t"

    def feed(self, content: str) -> str:
        """Content to release now ("" while it may still be a call)."""
        if not self._is_candidate:
            return content
        self._held += content
        start = self._held.lstrip()
        if not start or any(o.startswith(start) or start.startswith(o) for o in _OPENINGS):
            return ""
        self._is_candidate = False
        released, self._held = self._held, ""
        return released

    def finish(self) -> tuple[str, tuple[str, str, dict[str, Any]] | None]:
        """(content to release, (id, name, arguments) if the held content was a call of an offered tool)."""
        held, self._held = self._held, ""
        if not self._is_candidate or not held.strip():
            return held, None
        text = held.strip()
        fenced = _FENCE.match(text)
        try:
            name, arguments = parse_tool_call_body(fenced.group(1) if fenced else text, self._schemas)
        except ToolCallSyntaxError:
            return held, None
        if name not in self._schemas:
            return held, None
        return "", (f"{self._id_prefix}0", name, arguments)
