"""Must show: Slipstream with two scripted servers (cloud and local); traffic recorded; airgapped refuses it."""

import socket

import pytest

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import ScriptedApprover
from openjet_tui.agent.loop import AgentConfig
from openjet_tui.agent.sessions import SessionStore
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.agent.slipstream import Slipstream
from openjet_tui.agent.workspace import Workspace
from openjet_tui.errors import AirgappedError
from openjet_tui.llm.client import ChatClient
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


async def test_airgapped_refuses_slipstream_and_opens_no_connection(monkeypatch):
    connects = []
    real_connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", lambda self, a: connects.append(a) or real_connect(self, a))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: connects.append(a) or [])
    with pytest.raises(AirgappedError, match=r"impossible while airgapped = true.*api\.example\.com.*Nothing was sent"):
        Slipstream.create(Endpoint("slipstream", "https://api.example.com/v1", "big", "sk-x"),
                          ChatClient(Endpoint("llama-server", "http://127.0.0.1:9/v1")), airgapped=True)
    assert connects == []
