"""A server whose drafter does not use the MTP head (--draft ngram or none) on a model that has one: the backend
stops feeding the head (ServerState.attach, Backend.drop_draft_head), and greedy replies are unchanged."""

from __future__ import annotations

import httpx
from tests.server.conftest import loaded_state, running_server

MESSAGES = [{"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "Name a colour."}]


def reply(server) -> str:
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_a_drafter_without_the_head_stops_feeding_it(tiny_qwen35) -> None:
    with running_server(loaded_state(tiny_qwen35, context_size=512, n_draft=3)) as server:
        backend = server.state.load_state.model.backend
        assert server.state.drafter_kind == "mtp" and backend.can_draft
        want = reply(server)
        assert backend.state.mtp is not None  # the head's cache, fed by every pass
    for draft in ("ngram", "none"):
        with running_server(loaded_state(tiny_qwen35, context_size=512, draft=draft)) as server:
            backend = server.state.load_state.model.backend
            assert server.state.drafter_kind == draft and not backend.can_draft
            assert reply(server) == want
            assert backend.state.mtp is None and not backend.model.has_mtp
