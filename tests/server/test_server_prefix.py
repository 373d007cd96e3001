"""Prefix reuse through HTTP on a hybrid DeltaNet model: a second turn prefills only its new tokens, an edited
history restores from the checkpoint at the last message boundary before the edit."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from tests.server.conftest import loaded_state, running_server

from engine.server.prompts import chat_prompt
from engine.session import common_prefix

SYSTEM = {"role": "system", "content": "You are a careful assistant."}


@pytest.fixture(scope="module")
def hybrid_server(tiny_qwen35):
    with running_server(loaded_state(tiny_qwen35, context_size=1024, n_draft=3)) as server:
        yield server


def chat(server, messages: list[dict], max_tokens: int = 6) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def prompt_ids(server, messages: list[dict]) -> tuple[list[int], list[int]]:
    model = server.state.load_state.model
    prompt = chat_prompt(model.template, model.tokenizer, messages)
    return prompt.ids, prompt.boundaries


def common_prefix_list(a: list[int], b: list[int]) -> int:
    return common_prefix(np.asarray(a), np.asarray(b))


def committed(server) -> list[int]:
    return server.state.worker.generator.session.tokens


def test_second_turn_prefills_only_its_new_tokens(hybrid_server) -> None:
    assert hybrid_server.state.drafter_kind == "mtp"
    first = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    reply = chat(hybrid_server, first)
    assert reply["timings"]["draft_n"] > 0  # the MTP head drafted
    held = committed(hybrid_server)
    second = [*first, reply["choices"][0]["message"], {"role": "user", "content": "And another one?"}]
    ids, _ = prompt_ids(hybrid_server, second)
    reused = common_prefix_list(ids[:-1], held)
    # everything the first request left committed: its prompt and its reply but the last (pending) token
    assert reused == len(held) == reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"] - 1
    timings = chat(hybrid_server, second)["timings"]
    assert timings["cache_n"] == reused
    assert timings["prompt_n"] == len(ids) - reused  # only the tokens the previous request did not hold


def test_edited_history_restores_from_a_checkpoint(hybrid_server) -> None:
    history = [SYSTEM, {"role": "user", "content": "Write a haiku about rain."},
               {"role": "assistant", "content": "Rain taps the window."},
               {"role": "user", "content": "Now one about snow."}]
    chat(hybrid_server, history)
    edited = [*history]
    edited[2] = {"role": "assistant", "content": "Grey clouds drift and weep."}  # an edit in the middle
    ids, boundaries = prompt_ids(hybrid_server, edited)
    original_ids, _ = prompt_ids(hybrid_server, history)
    diverge = common_prefix_list(ids, original_ids)
    nearest = max(b for b in boundaries if b <= diverge)
    assert 0 < nearest < diverge  # a checkpoint strictly before the edit, not a restart from zero
    timings = chat(hybrid_server, edited)["timings"]
    assert timings["cache_n"] == nearest and timings["prompt_n"] == len(ids) - nearest

