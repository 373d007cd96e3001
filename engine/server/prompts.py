"""Prompt token ids for a request, with the message boundaries the session checkpoints at.

A boundary is the number of prompt tokens that render messages[:k]. Finding it means rendering each prefix of the
conversation; a prefix counts only when its text starts the full prompt and its tokens start the full token list
(templates that rewrite earlier turns, or BPE merges across a boundary, rule a boundary out). Only the first
FIRST_BOUNDARIES and the last LAST_BOUNDARIES messages are tried, so long histories stay cheap to prepare: the early
ones survive compaction of the middle, the late ones serve the next turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.text.chat import ChatTemplate, ChatTemplateError
from engine.text.tokenizer import Tokenizer

FIRST_BOUNDARIES = 2
LAST_BOUNDARIES = 8


@dataclass(slots=True)
class Prompt:
    """Rendered prompt text, its token ids, and token counts at message boundaries (ascending)."""

    text: str
    ids: list[int]
    boundaries: list[int] = field(default_factory=list)


def chat_prompt(template: ChatTemplate, tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None,
                template_kwargs: Mapping[str, Any] | None = None) -> Prompt:
    """Render and tokenize a conversation with its generation prompt (ChatTemplateError for a failing template)."""
    kwargs = dict(template_kwargs or {})
    enable_thinking = kwargs.pop("enable_thinking", None)
    text = template.render(messages, tools=tools, add_generation_prompt=True, enable_thinking=enable_thinking,
                           **kwargs)
    # rendered templates carry their own BOS text, so no special tokens are added
    ids = tokenizer.encode(text, parse_special=True, add_special=False)
    boundaries = []
    count = len(messages)
    tried = set(range(1, min(FIRST_BOUNDARIES, count) + 1)) | set(range(max(1, count - LAST_BOUNDARIES), count + 1))
    for k in sorted(tried):
        try:
            prefix = template.render(messages[:k], tools=tools, add_generation_prompt=False,
                                     enable_thinking=enable_thinking, **kwargs)
        except ChatTemplateError:
            continue  # some templates refuse a conversation that does not end with a user turn
        if not prefix or not text.startswith(prefix):
            continue
        prefix_ids = tokenizer.encode(prefix, parse_special=True, add_special=False)
        if 0 < len(prefix_ids) < len(ids) and ids[: len(prefix_ids)] == prefix_ids:
            boundaries.append(len(prefix_ids))
    return Prompt(text, ids, sorted(set(boundaries)))


def text_prompt(tokenizer: Tokenizer, prompt: str | list[int]) -> Prompt:
    """A raw completion prompt: text tokenized with the model's BOS where it wants one, or ids as given."""
    if isinstance(prompt, list):
        return Prompt(tokenizer.decode(prompt), list(prompt))
    return Prompt(prompt, tokenizer.encode(prompt, parse_special=True, add_special=True))
