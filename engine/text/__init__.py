"""Text around the model: the GGUF tokenizer, chat templates, and parsing of reasoning and tool calls."""

from engine.text.chat import ChatTemplate, ChatTemplateError, normalize_messages, prompt_opens_reasoning
from engine.text.tokenizer import StreamDecoder, Tokenizer
from engine.text.toolcalls import (ContentDelta, Event, MalformedToolCall, OutputParser, ReasoningDelta,
                                   ToolCall)

__all__ = [
    "ChatTemplate", "ChatTemplateError", "ContentDelta", "Event", "MalformedToolCall", "OutputParser",
    "ReasoningDelta", "StreamDecoder", "Tokenizer", "ToolCall", "normalize_messages", "prompt_opens_reasoning",
]
