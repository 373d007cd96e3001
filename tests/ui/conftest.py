"""UI test fixtures: an isolated user directory, the agent engineer's scripted model server, and an app factory."""

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
def isolated_user_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME, XDG folders and the keyring point at a temporary folder; no OPENJET_* settings leak in."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    for name in [n for n in os.environ if n.startswith("OPENJET_") or n in ("OPENAI_API_KEY", "EDITOR", "VISUAL")]:
        monkeypatch.delenv(name)
    return home


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A running scripted model server with an empty reply queue."""
    with ScriptedServer(context_window=32768) as running:
        yield running


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty workspace folder."""
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def make_app(workspace: Path):
    """Factory: the real OpenJetApp pointed at a scripted server and the workspace (no NVML polling)."""
    from openjet_tui.ui.app import OpenJetApp
    from openjet_tui.ui.controller import LaunchOptions

    def factory(server: ScriptedServer, mode: str = "ask", root: Path | None = None, *, watch: bool = False,
                editor: str | None = None, **options) -> OpenJetApp:
        launch = LaunchOptions(provider="llama-server", base_url=server.base_url, mode=mode,
                               workspace=root or workspace, **options)
        return OpenJetApp(launch, editor=editor, gpu_sampler=None, poll_metrics=False, watch_workspace=watch)

    return factory
