"""Agent-core fixtures: an isolated user directory, no OS keyring, and the scripted model server."""

from __future__ import annotations

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
    """Point HOME and the XDG directories at a temporary folder and switch the OS keyring off."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    for name in [n for n in __import__("os").environ if n.startswith("OPENJET_") or n == "OPENAI_API_KEY"]:
        monkeypatch.delenv(name)
    return home


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A running scripted server with an empty reply queue."""
    with ScriptedServer() as running:
        yield running


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty workspace folder."""
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def make_agent(tmp_path: Path):
    """Build an Agent wired to a scripted server: real client, real tools, a session store in tmp_path.
    Returns (agent, events); the clients are closed after the test."""
    from openjet_tui.agent.loop import Agent, AgentConfig
    from openjet_tui.agent.sessions import SessionStore
    from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
    from openjet_tui.agent.workspace import Workspace
    from openjet_tui.llm.client import ChatClient, RetryPolicy
    from openjet_tui.llm.providers import Endpoint

    clients = []

    def factory(server: ScriptedServer, root: Path, approver, mode: Mode = Mode.ASK, *,
                allow=("ls", "cat", "wc", "git status"), deny=("rm -rf", "sudo"), store=None, session=None, **config):
        client = ChatClient(Endpoint("llama-server", server.base_url, "scripted"),
                            retry=RetryPolicy(attempts=2, base_delay_s=0.01))
        clients.append(client)
        store = store or SessionStore(tmp_path / "sessions.db")
        session = session or store.create(root, "llama-server", "scripted", mode.value)
        events = []
        agent = Agent(client, Workspace(root), approver, config=AgentConfig(mode=mode, **config),
                      policy=ShellPolicy(list(allow), list(deny), store.rules(Workspace(root).root)), store=store,
                      session=session, on_event=events.append)
        return agent, events

    yield factory
    import asyncio

    async def close_all():
        for client in clients:
            await client.aclose()

    asyncio.run(close_all())
