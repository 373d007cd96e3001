"""Chat templates: `tokenizer.chat_template` rendered in a jinja2 sandbox the way Hugging Face renders it.

The environment matches transformers' apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loop controls, a `{% generation %}` block, `tojson` without HTML escaping and with its keyword options,
`raise_exception`, `strftime_now`), so templates written for HF render the same text here. Messages arrive in OpenAI
shape and are normalised first, as OpenAI-compatible servers do: text parts are joined, null content becomes "", and
tool-call arguments sent as JSON strings become objects (templates apply `tojson` to them).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import EngineError

if TYPE_CHECKING:  # the reader is only a type here: these objects also build from plain metadata
    from engine.gguf.reader import GGUFFile

# Used when a file carries no template (llama.cpp falls back to ChatML as well). Tool use follows the Hermes
# convention: schemas listed in the system turn, calls as <tool_call> JSON, results as <tool_response> in a user turn.
CHATML_TEMPLATE = """\
{%- set has_system = messages and messages[0].role == 'system' %}
{%- if tools %}
{{- '<|im_start|>system\\n' + (messages[0].content + '\\n\\n' if has_system else '') }}
{{- '# Tools\\n\\nYou may call one or more functions. Their signatures, one JSON schema per line:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nTo call a function, reply with a JSON object inside <tool_call></tool_call> tags:\\n' }}
{{- '<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif has_system %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set turns = messages[1:] if has_system else messages %}
{%- for message in turns %}
{%- if message.role == 'tool' %}
{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content }}
{%- for call in message.tool_calls or [] %}
{%- set call = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n' + ({'name': call.name, 'arguments': call.arguments} | tojson) + '\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


class ChatTemplateError(EngineError):
    """A chat template that does not compile, or that fails or refuses (raise_exception) while rendering."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: HF marks assistant text for training masks; here it renders as is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        """Parses the block into a call that returns its body unchanged."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes <, >, & and ' for HTML; chat templates need the plain JSON that HF produces.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _template_line(tb: TracebackType | None) -> int | None:
    """The template line a render error came from (jinja maps template frames to the "<template>" file)."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _text_content(content: Any, where: str) -> str:
    """Message content as one string: None -> "", text parts joined by newlines (llama.cpp's server does this)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for number, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ChatTemplateError(f"{where}.content[{number}] is a {kind!r} part; only text parts are "
                                        "supported")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ChatTemplateError(f"{where}.content must be a string or a list of text parts, not "
                            f"{type(content).__name__}")


def _object_arguments(call: Any, where: str) -> Any:
    """A tool call with its arguments as an object (OpenAI sends them as a JSON string)."""
    if not isinstance(call, Mapping):
        raise ChatTemplateError(f"{where} must be an object, not {type(call).__name__}")
    call = target = dict(call)
    if isinstance(call.get("function"), Mapping):  # OpenAI shape {"id", "type", "function": {...}}
        call["function"] = target = dict(call["function"])
    arguments = target.get("arguments")
    if isinstance(arguments, str):
        try:
            target["arguments"] = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ChatTemplateError(f"{where} arguments are not valid JSON ({exc})") from None
    return call


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies OpenAI-style messages into the shape chat templates expect (see the module docstring)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of message objects")
    result = []
    for number, message in enumerate(messages):
        where = f"messages[{number}]"
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"{where} must be an object with a string 'role'")
        message = copy.deepcopy(dict(message))
        message["content"] = _text_content(message.get("content"), where)
        if message.get("tool_calls") is not None:
            calls = message["tool_calls"]
            if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
                raise ChatTemplateError(f"{where}.tool_calls must be a list")
            message["tool_calls"] = [_object_arguments(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
        result.append(message)
    return result


def _token_text(metadata: Mapping[str, Any], key: str) -> str:
    """The text of the token that tokenizer.ggml.<key> names ("" when absent)."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    token_id = metadata.get(f"tokenizer.ggml.{key}")
    return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else ""


class ChatTemplate:
    """A compiled chat template. render(messages, ...) returns the prompt text to tokenize (parse_special=True)."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.is_fallback = not source
        self.source: str = source or CHATML_TEMPLATE
        self.bos_token, self.eos_token = bos_token, eos_token
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc.message} (template line {exc.lineno})"
                                    ) from None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ChatTemplate:
        """The template in tokenizer.chat_template (ChatML when absent), with BOS/EOS texts from the vocabulary."""
        source = metadata.get("tokenizer.chat_template")
        if source is not None and not isinstance(source, str):
            raise ChatTemplateError(f"tokenizer.chat_template must be a string, not {type(source).__name__}")
        return cls(source, _token_text(metadata, "bos_token_id"), _token_text(metadata, "eos_token_id"))

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ChatTemplate:
        """The template of an open GGUFFile."""
        return cls.from_metadata(f.metadata)

    @property
    def supports_tools(self) -> bool:
        """Whether the template reads `tools` at all (if not, tool schemas never reach the model)."""
        return re.search(r"\btools\b", self.source) is not None

    @property
    def supports_thinking_switch(self) -> bool:
        """Whether the template reads `enable_thinking`."""
        return "enable_thinking" in self.source

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, enable_thinking: bool | None = None, **kwargs: Any) -> str:
        """The prompt for messages (and tool schemas); extra keyword arguments become template variables.

        enable_thinking=None leaves the variable undefined, so the template's own default applies.
        """
        context: dict[str, Any] = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
        if enable_thinking is not None:
            context["enable_thinking"] = enable_thinking
        context.update(messages=normalize_messages(messages), tools=list(tools) if tools else None,
                       documents=kwargs.get("documents"), add_generation_prompt=add_generation_prompt)
        try:
            return self._template.render(context)
        except jinja2.TemplateError as exc:
            line = _template_line(exc.__traceback__)
            where = f" (template line {line})" if line else ""
            raise ChatTemplateError(f"chat template error{where}: {exc.message or exc}") from None
        except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as exc:
            line = _template_line(exc.__traceback__)
            where = f" at template line {line}" if line else ""
            raise ChatTemplateError(f"chat template failed{where}: {type(exc).__name__}: {exc}") from None


def prompt_opens_reasoning(prompt: str) -> bool:
    """True when a rendered prompt ends inside an open <think> block (the model's output starts as reasoning)."""
    return prompt.rstrip().endswith("<think>")
