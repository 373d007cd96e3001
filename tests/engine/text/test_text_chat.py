"""Chat templates: the real Qwen2.5 template renders exactly, HF's template environment, fallback, clear errors."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from engine.gguf.reader import GGUFFile
from engine.text.chat import ChatTemplate, ChatTemplateError, normalize_messages, prompt_opens_reasoning
from engine.text.tokenizer import Tokenizer

READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file <from> the workspace",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["path"]}}}

CONVERSATION = [
    {"role": "system", "content": "You are a coding agent. Be brief."},
    {"role": "user", "content": "Read README.md and tell me the title — «quickly» 🚀"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "read_file", "arguments": {"path": "README.md", "limit": 20}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "# OpenJet\nA local coding agent."},
    {"role": "assistant", "content": "The title is \"OpenJet\"."},
    {"role": "user", "content": "Thanks"},
]

# What transformers' apply_chat_template produces for CONVERSATION with the Qwen2.5-Coder template (checked with
# transformers 5.17): tool schema as HF's tojson (no HTML escaping of "<"), call arguments as a JSON object.
QWEN25_EXPECTED = """\
<|im_start|>system
You are a coding agent. Be brief.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "read_file", "description": "Read a file <from> the workspace", \
"parameters": {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}, \
"required": ["path"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Read README.md and tell me the title — «quickly» 🚀<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "read_file", "arguments": {"path": "README.md", "limit": 20}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
# OpenJet
A local coding agent.
</tool_response><|im_end|>
<|im_start|>assistant
The title is "OpenJet".<|im_end|>
<|im_start|>user
Thanks<|im_end|>
<|im_start|>assistant
"""


@pytest.fixture(scope="module")
def qwen_template(qwen_vocab_path) -> ChatTemplate:
    return ChatTemplate.from_gguf(GGUFFile.open(qwen_vocab_path))


# ---- the real Qwen2.5 template -------------------------------------------------------------------------------------


def test_qwen25_renders_system_tools_tool_call_and_tool_response_exactly(qwen_template: ChatTemplate) -> None:
    assert not qwen_template.is_fallback and qwen_template.supports_tools
    assert qwen_template.eos_token == "<|im_end|>" and qwen_template.bos_token == "<|endoftext|>"
    assert qwen_template.render(CONVERSATION, tools=[READ_FILE]) == QWEN25_EXPECTED


def test_openai_string_arguments_render_like_objects(qwen_template: ChatTemplate) -> None:
    messages = json.loads(json.dumps(CONVERSATION))
    messages[2]["tool_calls"][0]["function"]["arguments"] = '{"path": "README.md", "limit": 20}'
    assert qwen_template.render(messages, tools=[READ_FILE]) == QWEN25_EXPECTED
    assert isinstance(messages[2]["tool_calls"][0]["function"]["arguments"], str)  # the caller's list is untouched


def test_qwen25_without_tools_uses_its_default_system_prompt(qwen_template: ChatTemplate) -> None:
    prompt = qwen_template.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert prompt == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                      "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")


def test_rendered_prompt_tokenizes_with_whole_control_tokens(qwen_template: ChatTemplate,
                                                             qwen_tokenizer: Tokenizer) -> None:
    ids = qwen_tokenizer.encode(qwen_template.render(CONVERSATION, tools=[READ_FILE]))
    assert ids.count(qwen_tokenizer.token_to_id("<|im_start|>")) == 7
    assert ids.count(qwen_tokenizer.token_to_id("<tool_call>")) == 3  # twice in the instructions, once the call
    assert qwen_tokenizer.decode(ids) == QWEN25_EXPECTED


# ---- message normalisation ---------------------------------------------------------------------------------------


def test_text_parts_are_joined_and_null_content_becomes_empty() -> None:
    messages = normalize_messages([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]},
                                   {"role": "assistant", "content": None}])
    assert [m["content"] for m in messages] == ["a\nb", ""]


@pytest.mark.parametrize(("messages", "message"), [
    ("hello", "messages must be a list"),
    ([{"content": "no role"}], r"messages\[0\] must be an object with a string 'role'"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], r"'image_url' part"),
    ([{"role": "user", "content": 3}], "must be a string or a list of text parts"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
     r"messages\[0\].tool_calls\[0\] arguments are not valid JSON"),
])
def test_bad_messages_are_refused_clearly(qwen_template: ChatTemplate, messages: Any, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        qwen_template.render(messages)


# ---- the HF template environment ---------------------------------------------------------------------------------


def test_enable_thinking_is_undefined_unless_given() -> None:
    template = ChatTemplate("{% if enable_thinking is defined %}{{ enable_thinking }}{% else %}unset{% endif %}")
    assert template.supports_thinking_switch
    assert template.render([]) == "unset"
    assert template.render([], enable_thinking=False) == "False"
    assert template.render([], enable_thinking=True, extra="x") == "True"


def test_extra_keyword_arguments_and_special_tokens_reach_the_template() -> None:
    template = ChatTemplate("{{ bos_token }}|{{ reasoning_effort }}|{{ eos_token }}", "<s>", "</s>")
    assert template.render([], reasoning_effort="high") == "<s>|high|</s>"


def test_tojson_matches_hf_not_jinja() -> None:
    template = ChatTemplate("{{ x | tojson }}\n{{ x | tojson(indent=2, sort_keys=true) }}")
    value = {"b": "<tag> & 'quote' é", "a": [1]}
    assert template.render([], x=value) == (json.dumps(value, ensure_ascii=False) + "\n"
                                            + json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True))


def test_loop_controls_generation_block_and_whitespace_control() -> None:
    source = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
              "{% if m.role == 'stop' %}{% break %}{% endif %}\n"
              "  {% generation %}[{{ m.content }}]{% endgeneration %}\n{% endfor %}")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"}, {"role": "stop", "content": ""}, {"role": "user", "content": "x"}]
    # trim_blocks and lstrip_blocks remove the newline after a block tag and the indentation before one
    assert ChatTemplate(source).render(messages) == "[u][a]"


def test_strftime_now() -> None:
    rendered = ChatTemplate("{{ strftime_now('%Y') }}").render([])
    assert rendered == str(datetime.now().year)


def test_raise_exception_becomes_a_clear_error() -> None:
    template = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('First message must be from "
                            "the user') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="First message must be from the user"):
        template.render([{"role": "system", "content": "s"}])


def test_syntax_errors_name_the_line() -> None:
    with pytest.raises(ChatTemplateError, match=r"does not compile.*template line 2"):
        ChatTemplate("ok\n{% if %}")


def test_runtime_errors_name_the_line() -> None:
    with pytest.raises(ChatTemplateError, match=r"template line 3.*TypeError"):
        ChatTemplate("a\nb\n{{ messages[0].content + 1 }}").render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("source", [
    "{{ messages.append(1) }}",  # the immutable sandbox refuses to modify the messages
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # and refuses to reach Python internals
])
def test_the_sandbox_holds(source: str) -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


# ---- fallback ----------------------------------------------------------------------------------------------------


def test_chatml_fallback_when_the_file_has_no_template(qwen_metadata: dict) -> None:
    metadata = {k: v for k, v in qwen_metadata.items() if k != "tokenizer.chat_template"}
    template = ChatTemplate.from_metadata(metadata)
    assert template.is_fallback
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "f", "arguments": '{"x": 1}'}}]},
                {"role": "tool", "content": "R1"}, {"role": "tool", "content": "R2"}]
    assert template.render(messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    with_tools = template.render(messages[:2], tools=[READ_FILE])
    assert with_tools.startswith("<|im_start|>system\nS\n\n# Tools\n")
    assert json.dumps(READ_FILE, ensure_ascii=False) in with_tools


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
