"""usage.completion_tokens_details.reasoning_tokens: how many tokens a chat reply's reasoning took, streamed and
whole, on a tiny model whose chat template opens a <think> block (so everything it generates is reasoning)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx

from engine.server.loader import load_model
from engine.server.state import ServerConfig, ServerState
from engine.text.chat import ChatTemplate
from tests.server.conftest import running_server

THINKING_TEMPLATE = """\
{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"""
MESSAGES = [{"role": "user", "content": "Say something."}]


def thinking_state(path: Path) -> ServerState:
    """The tiny model on the reference backend, behind a template whose generation prompt opens <think>."""
    state = ServerState(ServerConfig(model_path=str(path), backend="reference", context_size=512))
    model = load_model(path, "reference", 512)
    state.attach(dataclasses.replace(model, template=ChatTemplate(THINKING_TEMPLATE)))
    return state


def streamed(url: str, body: dict) -> tuple[str, dict]:
    """The joined reasoning deltas and the usage chunk of one streamed reply."""
    reasoning, usage = "", {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=120,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                reasoning += choice["delta"].get("reasoning_content") or ""
    return reasoning, usage


def test_reasoning_tokens_are_reported_streamed_and_whole(tiny_qwen2) -> None:
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    with running_server(thinking_state(tiny_qwen2)) as server:
        tokenizer = server.state.ready_model()[0].tokenizer
        reasoning, usage = streamed(server.url, body)
        whole = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()
    num_tokens = len(tokenizer.encode(reasoning, parse_special=False))
    assert reasoning and usage["completion_tokens"] == 8
    assert usage["completion_tokens_details"] == {"reasoning_tokens": num_tokens} and num_tokens > 0
    assert whole["choices"][0]["message"]["reasoning_content"] == reasoning  # greedy: the same reply
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": num_tokens}


def test_a_reply_without_reasoning_reports_zero(qwen2_server) -> None:
    reasoning, usage = streamed(qwen2_server.url, {"messages": MESSAGES, "max_tokens": 4, "temperature": 0})
    assert reasoning == "" and usage["completion_tokens_details"] == {"reasoning_tokens": 0}
