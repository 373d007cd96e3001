"""The official openai client against the server on the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M (slow)."""

from __future__ import annotations

import json

import openai
import pytest
from tests.server.conftest import loaded_state, running_server

pytestmark = pytest.mark.slow

READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file from the workspace",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "path of the file"}},
                   "required": ["path"]}}}


@pytest.fixture(scope="module")
def real_server(real_model_path):
    with running_server(loaded_state(real_model_path, context_size=2048)) as server:
        yield server


@pytest.fixture(scope="module")
def client(real_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real_server.url}/v1", api_key="unused", max_retries=0, timeout=600)


def test_streamed_then_whole_second_turn(client: openai.OpenAI) -> None:
    first = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]
    stream = client.chat.completions.create(model="qwen", messages=first, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant" and text.strip()
    first_usage = chunks[-1].usage
    assert first_usage.completion_tokens == 8
    second = [*first, {"role": "assistant", "content": text}, {"role": "user", "content": "Now the cube instead."}]
    reply = client.chat.completions.create(model="qwen", messages=second, max_tokens=6, temperature=0)
    assert reply.choices[0].message.content and reply.choices[0].finish_reason == "length"
    timings = reply.model_extra["timings"]
    # the first turn's prompt and reply were reused: only the new turn was prefilled
    assert timings["cache_n"] >= first_usage.prompt_tokens
    assert timings["prompt_n"] == reply.usage.prompt_tokens - timings["cache_n"]
    assert timings["prompt_n"] < reply.usage.prompt_tokens - first_usage.prompt_tokens


def test_tool_call_arrives_assembled(client: openai.OpenAI) -> None:
    messages = [
        {"role": "user", "content": "Read the file README.md."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "read_file", "arguments": json.dumps({"path": "README.md"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "# Demo\nRun main.py to start."},
        {"role": "user", "content": "Now read the file main.py."},
    ]
    stream = client.chat.completions.create(model="qwen", messages=messages, tools=[READ_FILE], temperature=0,
                                            max_tokens=40, stream=True)
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        choice = chunk.choices[0]
        reasons.append(choice.finish_reason)
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:  # the first chunk of an index carries id, type and name
                assert delta.id and delta.type == "function" and delta.function.name
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            calls[delta.index]["arguments"] += delta.function.arguments or ""
    assert [c["name"] for c in calls.values()] == ["read_file"]
    assert json.loads(calls[0]["arguments"]) == {"path": "main.py"}
    assert reasons[-1] == "tool_calls"
