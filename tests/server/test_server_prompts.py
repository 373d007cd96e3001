"""Chat prompts and the message boundaries the session checkpoints at."""

from __future__ import annotations

import pytest

from engine.gguf.reader import GGUFFile
from engine.server.prompts import chat_prompt, text_prompt
from engine.text.chat import ChatTemplate
from engine.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def text_parts(tiny_qwen2) -> tuple[Tokenizer, ChatTemplate]:
    f = GGUFFile.open(tiny_qwen2)
    return Tokenizer.from_gguf(f), ChatTemplate.from_gguf(f)


def test_boundaries_are_where_each_message_ends(text_parts) -> None:
    tokenizer, template = text_parts
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there."},
                {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye."}]
    prompt = chat_prompt(template, tokenizer, messages)
    assert prompt.ids == tokenizer.encode(prompt.text)
    expected = [len(tokenizer.encode(template.render(messages[:k], add_generation_prompt=False)))
                for k in range(1, 5)]
    assert prompt.boundaries == expected
    for boundary in prompt.boundaries:  # each is a message end: the next token starts a turn
        assert tokenizer.decode(prompt.ids[boundary : boundary + 1]) == "<|im_start|>"


def test_long_histories_keep_the_first_and_last_boundaries(text_parts) -> None:
    tokenizer, template = text_parts
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(15):
        messages += [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]
    prompt = chat_prompt(template, tokenizer, messages)
    counts = [len(tokenizer.encode(template.render(messages[:k], add_generation_prompt=False)))
              for k in range(1, len(messages) + 1)]
    assert prompt.boundaries == counts[:2] + counts[-9:]


def test_text_prompts(text_parts) -> None:
    tokenizer, _ = text_parts
    assert text_prompt(tokenizer, "def f():").ids == tokenizer.encode("def f():", add_special=True)
    ids = tokenizer.encode("x = 1")
    assert text_prompt(tokenizer, ids).text == "x = 1"


def test_tools_with_a_template_that_cannot_render_them(text_parts, tiny_qwen2) -> None:
    from engine.server.chat import render
    from engine.server.loader import LoadedModel
    from engine.server.schemas import RequestError, parse_chat_request

    tokenizer, _ = text_parts
    plain = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    model = LoadedModel(None, tokenizer, plain, "m", str(tiny_qwen2), "reference", "")
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "tools": tools}, 151936)
    with pytest.raises(RequestError, match="does not render tools") as caught:
        render(model, request)
    assert caught.value.param == "tools"
    request.tools = None
    assert render(model, request).text == "<|im_start|>user\nhi<|im_end|>\n"
