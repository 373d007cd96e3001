"""Exiting the real app leaves no engine process: OpenJetApp (through Textual's Pilot) sets up and starts the engine
the runtime chooses (a stand-in llama-server on PATH, a real process serving the OpenAI routes), the person quits
with ctrl+q, and the engine and its process group are gone."""

from __future__ import annotations

import os

import httpx
import pytest

from engine.gguf.testmodel import write_test_model
from openjet_tui.runtime.hardware import probe_hardware
from openjet_tui.runtime.setup import SetupOptions, run_setup
from tests.runtime.procs import wait_gone
from tests.runtime.test_engines import stand_in_llama_server
from tests.ui.support import wait_for


@pytest.fixture
def app_environment(tmp_path, monkeypatch):
    """User folders, keyring and PATH of a fresh machine whose only engine besides the reference is the stand-in."""
    home = tmp_path / "home"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    for name in [n for n in os.environ if n.startswith("OPENJET_") and n != "OPENJET_CACHE_DIR"]:
        monkeypatch.delenv(name)
    script = stand_in_llama_server(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


async def test_quitting_the_app_stops_the_engine_it_started(app_environment, tmp_path):
    from openjet_tui.ui.app import OpenJetApp
    from openjet_tui.ui.controller import LaunchOptions

    if probe_hardware().best_gpu() is not None:
        pytest.skip("per-op CUDA comes before llama-server on a GPU machine (this test needs a CPU-only one)")
    model = write_test_model(tmp_path / "tiny.gguf", "qwen2", tokenizer=False)
    record = run_setup(SetupOptions(model=str(model), context=2048)).record
    assert record.engine == "llama-server"  # the app's own selection makes the same choice below
    # No provider or address given: the app starts the runtime's engine itself (provider "openjet").
    app = OpenJetApp(LaunchOptions(workspace=app_environment), gpu_sampler=None, poll_metrics=False,
                     watch_workspace=False)
    async with app.run_test() as pilot:
        session = await wait_for(pilot, lambda: app.engine_session, timeout=30, what="the engine to start")
        assert session.engine == "llama-server" and session.worker.is_running()
        pids = httpx.get(f"{session.worker.base_url}/pid", timeout=5).json()
        await wait_for(pilot, lambda: app.controller.endpoint.base_url == session.base_url, what="the app to use it")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, timeout=15, what="the app to exit")
    assert wait_gone(pids["pid"]) and not session.worker.is_running()
