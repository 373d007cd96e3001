"""Real uvicorn servers on loopback, in a thread, for the server tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engine.server.loader import load_model
from engine.server.main import bind, make_server
from engine.server.state import ServerConfig, ServerState


@dataclass
class RunningServer:
    """A server on 127.0.0.1 and its state."""

    url: str
    state: ServerState

    def metric(self, name: str, labels: str = "") -> float:
        """The value of one Prometheus sample from /metrics."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        wanted = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.split()[-1])
        raise KeyError(f"{wanted} not in /metrics")


@contextmanager
def running_server(state: ServerState, load: Callable[[], object] | None = None) -> Iterator[RunningServer]:
    """Serve state on a free loopback port; load (if given) runs in the background as `serve` does."""
    sock = bind("127.0.0.1", 0)
    server = make_server(state, "warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    loader = threading.Thread(target=load, daemon=True) if load is not None else None
    if loader is not None:
        loader.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield RunningServer(f"http://127.0.0.1:{sock.getsockname()[1]}", state)
    finally:
        server.should_exit = True
        thread.join(15)
        state.shutdown()
        if loader is not None:
            loader.join(30)
        sock.close()


def loaded_state(path: Path, **config) -> ServerState:
    """A ServerState with its model loaded on the reference backend."""
    state = ServerState(ServerConfig(model_path=str(path), backend="reference", **config))
    context_size = config.get("context_size")
    state.attach(load_model(path, "reference", context_size))
    return state


SMALL = dict(hidden_size=64, ffn_size=128, num_heads=2, num_kv_heads=1, head_dim=32)


@pytest.fixture(scope="module")
def tiny_qwen2(tiny_model_path) -> Path:
    """A small attention-only model with the real Qwen2.5 tokenizer and chat template (fast to serve)."""
    return tiny_model_path("qwen2", **SMALL)


@pytest.fixture(scope="module")
def tiny_qwen35(tiny_model_path) -> Path:
    """A small hybrid DeltaNet + attention model with an MTP head, tokenizer and chat template."""
    return tiny_model_path("qwen35", **SMALL)


@pytest.fixture(scope="module")
def qwen2_server(tiny_qwen2) -> Iterator[RunningServer]:
    """One tiny qwen2 server shared by a test module (n-gram drafts, context 512)."""
    with running_server(loaded_state(tiny_qwen2, context_size=512)) as server:
        yield server
