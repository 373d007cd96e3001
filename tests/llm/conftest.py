"""Chat-client fixtures: an isolated user directory, no OS keyring, and the scripted model server."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `from tests.agent.scripted_server import ...` whatever the working directory
    sys.path.insert(0, str(ROOT))

from tests.agent.scripted_server import ScriptedServer  # noqa: E402


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No OpenJet variables or real keyring leak into these tests."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    for name in [n for n in os.environ if n.startswith("OPENJET_") or n in ("OPENAI_API_KEY", "LLAMA_API_KEY")]:
        monkeypatch.delenv(name)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A running scripted server with an empty reply queue."""
    with ScriptedServer() as running:
        yield running
