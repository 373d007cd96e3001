"""Must show: Slipstream with two scripted servers (cloud and local); traffic recorded; airgapped refuses it."""

import io
import json
import socket
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import ScriptedApprover
from openjet_tui.agent.loop import AgentConfig
from openjet_tui.agent.sessions import SessionStore
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.agent.slipstream import Slipstream
from openjet_tui.agent.workspace import Workspace
from openjet_tui.cli import main
from openjet_tui.errors import AirgappedError
from openjet_tui.llm.client import ChatClient
from openjet_tui.llm.network import NetworkGuard, TrafficLog, is_loopback_host
from openjet_tui.llm.providers import Endpoint
from tests.agent.scripted_server import ScriptedServer, call, reply


async def test_orchestrator_delegates_to_local_and_every_cloud_request_is_recorded(workspace, tmp_path):
    (workspace / "hello.py").write_text('print("hello")\n')
    task = "In hello.py, change the greeting to hi."
    cloud_replies = [reply("Delegating.", tool_calls=[call("delegate_local", task=task)]),
                     reply(tool_calls=[call("read_file", path="hello.py")]),
                     reply("Reviewed: hello.py now greets with hi.")]
    local_replies = [reply(tool_calls=[call("edit_file", path="hello.py",
                                            edits=[{"old_text": '"hello"', "new_text": '"hi"'}])]),
                     reply("Changed the greeting in hello.py.")]
    store = SessionStore(tmp_path / "s.db")
    session = store.create(workspace, "slipstream", "big-cloud", "auto-edit")
    events = []
    with ScriptedServer(cloud_replies, model="big-cloud") as cloud, ScriptedServer(local_replies) as local:
        local_client = ChatClient(Endpoint("llama-server", local.base_url, "small"))
        slipstream = Slipstream.create(Endpoint("slipstream", cloud.base_url, "big-cloud"), local_client,
                                       airgapped=False)
        agent = slipstream.build_agent(Workspace(workspace), ScriptedApprover(), AgentConfig(mode=Mode.AUTO_EDIT),
                                       policy=ShellPolicy(), store=store, session=session, on_event=events.append)
        result = await agent.run_turn("Make hello.py say hi.")
        await slipstream.aclose()
        await local_client.aclose()
        cloud_url = cloud.base_url
        cloud_requests = [r for r in cloud.requests if r.path.endswith("/chat/completions")]
        local_bodies = local.chat_bodies

    assert result.status == "done" and result.final_text == "Reviewed: hello.py now greets with hi."
    assert (workspace / "hello.py").read_text() == 'print("hi")\n'
    # the local model got the task (not the cloud conversation), and did the edit
    assert task in local_bodies[0]["messages"][-1]["content"]
    assert all("Make hello.py say hi." not in str(b["messages"]) for b in local_bodies)
    assert {t["function"]["name"] for t in local_bodies[0]["tools"]} >= {"edit_file", "run_shell"}
    # the orchestrator only reads and delegates
    assert {t["function"]["name"] for t in cloud_requests[0].body["tools"]} == {
        "read_file", "list_dir", "glob", "grep", "todo", "delegate_local"}
    delegated = [m for m in cloud_requests[1].body["messages"] if m["role"] == "tool"][0]["content"]
    assert "Changed the greeting in hello.py." in delegated and "- edit hello.py: applied" in delegated
    # every cloud request recorded with its exact size; none of the local ones
    traffic = [e for e in events if isinstance(e, ev.SlipstreamTraffic)]
    assert [e.request_bytes for e in traffic] == [r.num_bytes for r in cloud_requests]
    assert [e.total_requests for e in traffic] == [1, 2, 3]
    assert traffic[-1].total_bytes_sent == sum(r.num_bytes for r in cloud_requests)
    assert {e.endpoint for e in traffic} == {cloud_url + "/chat/completions"}
    assert [row["request_bytes"] for row in store.traffic(session.id)] == [r.num_bytes for r in cloud_requests]
    origins = {e.origin for e in events if isinstance(e, ev.AssistantMessage)}
    assert origins == {"cloud", "delegate"}


CLOUD_HOST = "198.51.100.7"  # TEST-NET-2: never routed; the guard below sends it to a loopback server instead


@pytest.fixture
def socket_guard(monkeypatch):
    """Record every connect(); one to CLOUD_HOST is recorded and sent to the scripted cloud server on loopback
    (`guard.cloud = (host, port)`), so nothing leaves the machine, and any other non-loopback one is refused."""
    guard = SimpleNamespace(connects=[], cloud=None)
    real_connect = socket.socket.connect

    def connect(sock, address):
        """Record, then connect to loopback only."""
        guard.connects.append(address)
        if address[0] == CLOUD_HOST and guard.cloud is not None:
            return real_connect(sock, guard.cloud)
        if not is_loopback_host(str(address[0])):
            raise ConnectionRefusedError(f"test guard: no connection to {address}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return guard


def address_of(server):
    """(host, port) a scripted server listens on."""
    url = urlsplit(server.base_url)
    return url.hostname, url.port


def non_loopback(guard):
    """The non-loopback addresses something tried to connect to."""
    return [a for a in guard.connects if not is_loopback_host(str(a[0]))]


def slipstream_cli(capsys, monkeypatch, workspace, local, airgapped):
    """`openjet run --slipstream` with the cloud at CLOUD_HOST and the local model on the scripted server."""
    for name, value in {"OPENJET_AIRGAPPED": str(airgapped).lower(), "OPENJET_SLIPSTREAM__MODEL": "big-cloud",
                        "OPENJET_SLIPSTREAM__BASE_URL": f"http://{CLOUD_HOST}:8000/v1",
                        "OPENJET_SLIPSTREAM_API_KEY": "sk-test"}.items():
        monkeypatch.setenv(name, value)
    code = main(["run", "--slipstream", "--provider", "llama-server", "--base-url", local.base_url, "--mode",
                 "auto-edit", "--workspace", str(workspace), "--json", "Make hello.py say hi."])
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def slipstream_scripts():
    """Cloud: delegate, then review. Local: edit, then report."""
    cloud = [reply(tool_calls=[call("delegate_local", task="In hello.py, change hello to hi.")]), reply("Reviewed.")]
    local = [reply(tool_calls=[call("edit_file", path="hello.py", edits=[{"old_text": "hello", "new_text": "hi"}])]),
             reply("Changed it.")]
    return cloud, local


def test_airgapped_run_opens_no_non_loopback_connection_that_the_same_run_otherwise_opens(
        capsys, workspace, monkeypatch, socket_guard):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    cloud_replies, local_replies = slipstream_scripts()
    (workspace / "hello.py").write_text('print("hello")\n')
    with ScriptedServer(cloud_replies) as cloud, ScriptedServer(local_replies) as local:
        socket_guard.cloud = address_of(cloud)
        # not airgapped: the orchestrator really runs, and its requests go to the non-loopback address
        code, events = slipstream_cli(capsys, monkeypatch, workspace, local, airgapped=False)
        assert code == 0 and events[-1]["status"] == "done", events[-3:]
        assert (workspace / "hello.py").read_text() == 'print("hi")\n'
        assert len(cloud.chat_bodies) == 2 and {a[0] for a in non_loopback(socket_guard)} == {CLOUD_HOST}
        # airgapped: the same run is refused before anything connects anywhere
        socket_guard.connects.clear()
        code, events = slipstream_cli(capsys, monkeypatch, workspace, local, airgapped=True)
        assert code == 3 and "Slipstream is impossible while airgapped = true" in events[-1]["message"]
        assert socket_guard.connects == [] and len(cloud.chat_bodies) == 2 and len(local.chat_bodies) == 2


async def test_an_airgapped_orchestrator_refuses_every_cloud_request_at_the_transport(workspace, socket_guard):
    # Slipstream.create refuses first; this builds one past it to show the cloud client's own guard holds
    cloud_replies, local_replies = slipstream_scripts()
    (workspace / "hello.py").write_text('print("hello")\n')
    with ScriptedServer(cloud_replies) as cloud, ScriptedServer(local_replies) as local:
        socket_guard.cloud = address_of(cloud)
        local_client = ChatClient(Endpoint("llama-server", local.base_url, "small"))
        endpoint = Endpoint("slipstream", f"http://{CLOUD_HOST}:8000/v1", "big-cloud", "sk-test")
        with pytest.raises(AirgappedError, match=rf"impossible while airgapped = true.*{CLOUD_HOST}.*Nothing was sent"):
            Slipstream.create(endpoint, local_client, airgapped=True)
        traffic = TrafficLog()
        slipstream = Slipstream(ChatClient(endpoint, guard=NetworkGuard(True), traffic=traffic), local_client, traffic)
        agent = slipstream.build_agent(Workspace(workspace), ScriptedApprover(), AgentConfig(mode=Mode.AUTO_EDIT))
        result = await agent.run_turn("Make hello.py say hi.")
        await slipstream.aclose()
        await local_client.aclose()
        assert cloud.requests == [] and local.requests == []
    assert result.status == "error" and isinstance(result.failure, AirgappedError)
    assert socket_guard.connects == [] and slipstream.traffic.records == []
    assert (workspace / "hello.py").read_text() == 'print("hello")\n'
