"""Output shaping without a model: stop strings across token boundaries, logprob alignment, chat deltas with
reasoning and tool calls (tagged and text-form)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.server.responses import ChatOutput
from engine.server.textstream import TextStream, token_logprob
from engine.text.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path) -> Tokenizer:
    from engine.gguf.reader import GGUFFile

    return Tokenizer.from_gguf(GGUFFile.open(tiny_model_path("qwen2", hidden_size=64, ffn_size=128, num_heads=2,
                                                             num_kv_heads=1, head_dim=32)))


def run(stream: TextStream, ids: list[int]) -> tuple[str, int]:
    text, fed = "", 0
    for token in ids:
        fed += 1
        out, _ = stream.feed(token)
        text += out
        if stream.is_stopped:
            return text, fed
    return text + stream.finish()[0], fed


def test_stop_string_split_over_tokens(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("alpha beta gamma delta epsilon")
    pieces = [tokenizer.decode([i]) for i in ids]
    assert pieces[:4] == ["alpha", " beta", " gamma", " delta"]
    text, fed = run(TextStream(tokenizer, ["ta gam"]), ids)  # starts inside " beta", ends inside " gamma"
    assert (text, fed) == ("alpha be", 3)
    text, fed = run(TextStream(tokenizer, ["zzz", "epsilon!"]), ids)  # a prefix that never completes
    assert text == "alpha beta gamma delta epsilon" and fed == len(ids)


def test_held_text_is_released_as_soon_as_it_cannot_be_a_stop(tokenizer: Tokenizer) -> None:
    stream = TextStream(tokenizer, ["gamma ray"])
    ids = tokenizer.encode("alpha beta gamma delta")
    outputs = [stream.feed(i)[0] for i in ids]
    assert outputs == ["alpha", " beta", " ", "gamma delta"]  # " gamma" waited one token for " ray"


def test_utf8_is_never_split(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("日本語")
    assert len(ids) > 1
    stream = TextStream(tokenizer, [])
    assert "".join(stream.feed(i)[0] for i in ids) + stream.finish()[0] == "日本語"
    assert "\ufffd" not in "".join(TextStream(tokenizer, []).feed(i)[0] for i in ids)


def test_logprobs_travel_with_their_text(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("alpha beta gamma")
    logits = np.zeros(tokenizer.vocab_size, np.float32)
    stream = TextStream(tokenizer, ["ta gam"])
    released = []
    for token in ids:
        logits[:] = 0
        logits[token] = 5.0
        _, entries = stream.feed(token, token_logprob(tokenizer, logits, token, 2))
        released.extend(entries)
        if stream.is_stopped:
            break
    # " beta" is cut by the stop string but part of it went out, so its logprob did; none of " gamma" did
    assert [e.text for e in released] == ["alpha", " beta"]
    assert released[0].top[0][0] == ids[0] and released[0].logprob == pytest.approx(released[0].top[0][3])
    expected = 5.0 - np.log(np.exp(5.0) + tokenizer.vocab_size - 1)
    assert released[0].logprob == pytest.approx(expected, rel=1e-6)


def feed_all(output: ChatOutput, parts: list[str]) -> list[dict]:
    deltas = []
    for part in parts:
        deltas.extend(output.feed(part))
    return deltas + output.finish()


def test_tagged_tool_call_streams_whole_with_id_type_name() -> None:
    output = ChatOutput(TOOLS, starts_in_reasoning=False)
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py", "limit": 5}}\n</tool_call>'
    deltas = feed_all(output, [text[i : i + 7] for i in range(0, len(text), 7)])
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["type"] == "function"
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "read_file"
    assert json.loads(calls[0]["function"]["arguments"]) == {"path": "a.py", "limit": 5}
    assert "".join(d.get("content", "") for d in deltas) == "Let me look."
    assert output.message()["tool_calls"][0]["id"] == calls[0]["id"]


@pytest.mark.parametrize("text", [
    '{"name": "read_file", "arguments": {"path": "main.py"}}\n',
    '```json\n{\n  "name": "read_file",\n  "arguments": {\n    "path": "main.py"\n  }\n}\n```',
])
def test_text_form_tool_call_of_an_offered_tool(text: str) -> None:
    output = ChatOutput(TOOLS, starts_in_reasoning=False)
    deltas = feed_all(output, [text[i : i + 3] for i in range(0, len(text), 3)])
    assert [list(d) for d in deltas] == [["tool_calls"]]
    assert json.loads(deltas[0]["tool_calls"][0]["function"]["arguments"]) == {"path": "main.py"}
    assert output.message()["content"] is None


@pytest.mark.parametrize(("tools", "text"), [
    (TOOLS, '{"name": "delete_everything", "arguments": {}}'),  # not an offered tool
    (TOOLS, '{"name": "read_file", "arguments": {"path": "a"}} and then some prose'),
    (TOOLS, "```python\nprint('hi')\n```"),
    (None, '{"name": "read_file", "arguments": {"path": "a"}}'),  # no tools offered: plain content
])
def test_other_content_is_released_unchanged(tools: list | None, text: str) -> None:
    output = ChatOutput(tools, starts_in_reasoning=False)
    deltas = feed_all(output, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert "".join(d["content"] for d in deltas) == text and output.tool_calls == []


def test_code_answers_stream_without_waiting_for_the_end() -> None:
    output = ChatOutput(TOOLS, starts_in_reasoning=False)
    assert output.feed("```") == []
    assert output.feed("python\n") == [{"content": "```python"}]  # (the parser holds trailing whitespace)


def test_reasoning_is_split_out() -> None:
    output = ChatOutput(None, starts_in_reasoning=True)
    deltas = feed_all(output, ["Think", "ing hard.</th", "ink>\n\nThe answer."])
    assert output.reasoning == "Thinking hard." and output.content == "The answer."
    assert deltas[0] == {"reasoning_content": "Think"}
