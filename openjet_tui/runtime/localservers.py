"""Probing OpenAI-compatible servers another program already runs on this machine: Ollama and LM Studio."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import httpx

from openjet_tui.errors import AirgappedError
from openjet_tui.llm.network import NetworkGuard

PROBE_TIMEOUT_S = 0.5


@dataclass(slots=True)
class LocalServer:
    """A known local server kind and what a probe found there."""

    engine: str  # "ollama" or "lmstudio": also the agent's provider name
    label: str
    base_url: str  # the OpenAI-compatible root, ending in /v1
    is_running: bool = False
    models: list[str] = field(default_factory=list)
    error: str = ""

    def preferred_model(self) -> str | None:
        """A Qwen model if the server has one (the agent is tuned for them), else its first model."""
        qwen = [name for name in self.models if "qwen" in name.lower()]
        return (qwen or self.models or [None])[0]


def _ollama_url() -> str:
    host = os.environ.get("OLLAMA_HOST", "127.0.0.1:11434")
    return (host if host.startswith("http") else f"http://{host}").rstrip("/")


def _probe(server: LocalServer, listing_url: str, key: str, name_field: str,
           guard: NetworkGuard | None) -> LocalServer:
    try:
        (guard or NetworkGuard()).check(listing_url)  # e.g. OLLAMA_HOST on another machine while airgapped
    except AirgappedError as error:
        server.error = f"not probed: {error}"
        return server
    try:
        response = httpx.get(listing_url, timeout=PROBE_TIMEOUT_S)
        response.raise_for_status()
        server.models = [str(item.get(name_field, "")) for item in response.json().get(key, [])]
        server.is_running = True
    except (httpx.HTTPError, ValueError, AttributeError) as error:
        server.error = "not running" if isinstance(error, httpx.ConnectError) else f"no usable answer ({error})"
    return server


def probe_ollama(root: str | None = None, guard: NetworkGuard | None = None) -> LocalServer:
    """Ollama at $OLLAMA_HOST or its default port 11434, with the models it has pulled (not asked when `guard`
    refuses its address)."""
    root = (root or _ollama_url()).rstrip("/")
    server = LocalServer("ollama", "Ollama", f"{root}/v1")
    return _probe(server, f"{root}/api/tags", "models", "name", guard)


def probe_lmstudio(root: str | None = None, guard: NetworkGuard | None = None) -> LocalServer:
    """LM Studio's local server at its default port 1234, with the models it offers."""
    root = (root or "http://127.0.0.1:1234").rstrip("/")
    server = LocalServer("lmstudio", "LM Studio", f"{root}/v1")
    return _probe(server, f"{root}/v1/models", "data", "id", guard)
