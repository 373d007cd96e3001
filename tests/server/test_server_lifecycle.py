"""Loading (/health with progress), load failure, API keys, and backend failures the server survives."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest
from tests.server.conftest import loaded_state, running_server

from engine.reference.backend import ReferenceBackend
from engine.server.loader import load_model
from engine.server.state import ServerConfig, ServerState

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


def test_health_reports_progress_while_loading(tiny_qwen2) -> None:
    gate = threading.Event()

    def slow_loader(path, backend, context_size, progress, alias=None):
        progress("loading weights", 0.2)
        assert gate.wait(30)
        return load_model(path, backend, context_size, progress, alias)

    state = ServerState(ServerConfig(model_path=str(tiny_qwen2), backend="reference"))
    with running_server(state, load=lambda: state.load(slow_loader)) as server:
        deadline = time.monotonic() + 60  # generous: the deadlines only stop a hang on a machine busy with tests
        while (response := httpx.get(f"{server.url}/health")).json().get("progress") != 0.2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert response.status_code == 503
        assert response.json()["status"] == "loading" and response.json()["stage"] == "loading weights"
        assert httpx.post(f"{server.url}/v1/chat/completions", json=CHAT).status_code == 503
        gate.set()
        deadline = time.monotonic() + 60  # the rest of the load
        while (response := httpx.get(f"{server.url}/health")).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert response.json()["backend"] == "reference" and response.json()["draft"] == "ngram"
        assert httpx.post(f"{server.url}/v1/chat/completions", json=CHAT).status_code == 200


def test_load_failure_is_reported(tmp_path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 12)
    state = ServerState(ServerConfig(model_path=str(broken), backend="reference"))
    assert state.load() is False
    with running_server(state) as server:
        response = httpx.get(f"{server.url}/health")
        assert response.status_code == 500 and "broken.gguf" in response.json()["error"]["message"]
        assert httpx.post(f"{server.url}/v1/chat/completions", json=CHAT).status_code == 500


def test_cuda_backend_request_fails_with_a_reason_or_serves(tiny_qwen2) -> None:
    from engine.server.loader import BackendUnavailable

    try:
        model = load_model(tiny_qwen2, "cuda")
    except BackendUnavailable as exc:
        assert "CUDA backend cannot serve" in str(exc) and len(str(exc)) > 60  # with the underlying reason
        fallback = load_model(tiny_qwen2, "auto")
        assert fallback.backend_name == "reference" and "CUDA" in fallback.backend_reason
    else:  # a machine with a working CUDA backend
        assert model.backend_name != "reference"


def test_api_key_is_required_everywhere(tiny_qwen2) -> None:
    with running_server(loaded_state(tiny_qwen2, api_key="s3cret")) as server:
        for method, path in [("GET", "/health"), ("GET", "/v1/models"), ("GET", "/metrics"),
                             ("POST", "/v1/chat/completions")]:
            response = httpx.request(method, f"{server.url}{path}", json=CHAT)
            assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
            wrong = httpx.request(method, f"{server.url}{path}", json=CHAT, headers={"Authorization": "Bearer no"})
            assert wrong.status_code == 401
        good = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT,
                          headers={"Authorization": "Bearer s3cret"})
        assert good.status_code == 200


class FailingBackend(ReferenceBackend):
    """The reference backend with a fault switch: the next verify() raises after `fail_after` more calls."""

    fail_after: int | None = None

    def verify(self, tokens: list[int]) -> np.ndarray:
        """Verify, or fail when the switch says so."""
        if self.fail_after is not None:
            if self.fail_after == 0:
                self.fail_after = None
                raise FloatingPointError("simulated device fault")
            self.fail_after -= 1
        return super().verify(tokens)


@pytest.fixture
def failing_server(tiny_qwen2):
    model = load_model(tiny_qwen2, "reference")
    backend = FailingBackend(model.backend.model, model.backend.context_size)
    model.backend = backend
    state = ServerState(ServerConfig(model_path=str(tiny_qwen2), backend="reference", n_draft=0))
    state.attach(model)
    with running_server(state) as server:
        yield server, backend


def test_backend_failure_is_a_500_and_the_server_goes_on(failing_server) -> None:
    server, backend = failing_server
    backend.fail_after = 0
    response = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert response.status_code == 500
    assert "simulated device fault" in response.json()["error"]["message"]
    assert server.metric("openjet_requests_total", 'outcome="error"') == 1
    again = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 4
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the state was reset


def test_failure_mid_stream_is_reported_in_band(failing_server) -> None:
    server, backend = failing_server
    backend.fail_after = 2  # two cycles stream, the third fails
    body = {**CHAT, "max_tokens": 10, "stream": True}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200
    lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert "simulated device fault" in lines[-1] and "[DONE]" not in response.text
    assert sum('"content"' in line for line in lines) >= 3  # the role chunk and two tokens came first
