"""Benchmark-harness fixtures: the scripted model server importable, and a user directory that is not yours."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `from tests.agent.scripted_server import ...` whatever the working directory
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in a temporary folder, no OS keyring, none of the caller's OPENJET_* settings."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    for name in [n for n in os.environ if n.startswith("OPENJET_")]:
        monkeypatch.delenv(name)
    return home
