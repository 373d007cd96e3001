"""`openjet run` in-process against the scripted server: JSON Lines, exit codes, ask mode without a terminal,
probing problems, airgapped refusals, sessions commands."""

import io
import json
import socket

import pytest

from openjet_tui.cli import main
from tests.agent.scripted_server import ScriptedServer, call, reply


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def records(out):
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def no_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))


def edit_script():
    return [reply(tool_calls=[call("edit_file", path="a.txt", edits=[{"old_text": "old", "new_text": "new"}])]),
            reply("Replaced old with new.")]


def test_auto_edit_json_lines_and_exit_zero(capsys, workspace):
    (workspace / "a.txt").write_text("old\n")
    with ScriptedServer(edit_script(), context_window=8192, supports_tools=True) as server:
        code, out, _ = run_cli(capsys, "run", "--provider", "llama-server", "--base-url", server.base_url,
                               "--mode", "auto-edit", "--workspace", str(workspace), "--json", "fix a.txt")
    assert code == 0 and (workspace / "a.txt").read_text() == "new\n"
    events = records(out)
    types = [e["type"] for e in events]
    assert types[0] == "turn_started" and types[-1] == "turn_finished" and events[-1]["status"] == "done"
    created = next(e for e in events if e["type"] == "proposal_created")
    assert created["proposal"]["path"] == "a.txt" and created["proposal"]["hunks"][0]["lines"] == ["-old", "+new"]
    assert next(e for e in events if e["type"] == "proposal_resolved")["status"] == "applied"
    assert next(e for e in events if e["type"] == "usage")["context_window"] == 8192


def test_ask_mode_without_terminal_denies_and_says_so(capsys, workspace):
    (workspace / "a.txt").write_text("old\n")
    with ScriptedServer(edit_script()) as server:
        code, out, err = run_cli(capsys, "--mode", "ask", "run", "--provider", "llama-server", "--base-url",
                                 server.base_url, "--workspace", str(workspace), "fix a.txt")
        model_saw = [m["content"] for m in server.chat_bodies[1]["messages"] if m["role"] == "tool"][0]
    assert code == 0 and (workspace / "a.txt").read_text() == "old\n"
    assert "ask mode without a terminal" in err and "rejected" in err
    assert "there is no terminal" in model_saw and out.strip() == "Replaced old with new."


def test_unreachable_server_exits_3(capsys, workspace):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = run_cli(capsys, "run", "--provider", "ollama", "--base-url", f"http://127.0.0.1:{port}/v1",
                           "--workspace", str(workspace), "hello")
    assert code == 3 and "cannot reach ollama" in err


def test_server_without_tools_or_room_exits_3_and_says_why(capsys, workspace):
    with ScriptedServer(supports_tools=False, context_window=65536) as server:
        code, out, _ = run_cli(capsys, "run", "--provider", "llama-server", "--base-url", server.base_url,
                               "--workspace", str(workspace), "--json", "hello")
        assert server.chat_bodies == []
    assert code == 3 and "cannot do tool calls" in records(out)[-1]["message"]
    with ScriptedServer(supports_tools=True, context_window=512) as server:
        code, _, err = run_cli(capsys, "run", "--provider", "llama-server", "--base-url", server.base_url,
                               "--workspace", str(workspace), "hello")
    assert code == 3 and "smaller than the system prompt plus tool schemas" in err


@pytest.mark.parametrize("status, error, code, said", [
    (400, "tools param requires --jinja flag", 3, "cannot do tool calls"),
    (400, "the request exceeds the available context size", 3, "does not fit the model's context window"),
    (401, "invalid api key", 2, "rejected the request (HTTP 401)"),
    (500, "model crashed", 1, "answered HTTP 500"),
])
def test_a_server_failing_mid_turn_exits_with_the_documented_code(capsys, workspace, status, error, code, said):
    (workspace / "a.txt").write_text("old\n")
    script = [reply(tool_calls=[call("read_file", path="a.txt")]), reply(status=status, error=error)]
    with ScriptedServer(script) as server:  # the probe finds nothing wrong: the trouble starts on step 2
        got, out, _ = run_cli(capsys, "run", "--provider", "llama-server", "--base-url", server.base_url,
                              "--mode", "auto", "--workspace", str(workspace), "--json", "read a.txt")
        assert len(server.chat_bodies) == 2
    events = records(out)
    assert got == code and events[-1] == {**events[-1], "type": "turn_finished", "status": "error"}
    assert said in next(e for e in events if e["type"] == "error")["message"]


def test_airgapped_refuses_remote_server_and_slipstream_without_connecting(capsys, workspace, monkeypatch):
    connects = []
    real = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", lambda self, a: connects.append(a) or real(self, a))
    monkeypatch.setenv("OPENJET_AIRGAPPED", "true")
    code, _, err = run_cli(capsys, "run", "--provider", "openai-compatible", "--base-url",
                           "http://198.51.100.20:8000/v1", "--workspace", str(workspace), "hello")
    assert code == 3 and "refusing to connect to '198.51.100.20'" in err
    monkeypatch.setenv("OPENJET_SLIPSTREAM__MODEL", "big")
    code, _, err = run_cli(capsys, "run", "--slipstream", "--workspace", str(workspace), "hello")
    assert code == 3 and "Slipstream is impossible while airgapped = true" in err
    assert connects == []


def test_bad_settings_exit_2(capsys, workspace):
    (workspace / ".openjet").mkdir()
    (workspace / ".openjet" / "config.toml").write_text("max_steps = 0\n")
    code, _, err = run_cli(capsys, "run", "--workspace", str(workspace), "hello")
    assert code == 2 and "max_steps" in err and ".openjet/config.toml" in err


def test_continue_and_sessions_commands(capsys, workspace):
    (workspace / "a.txt").write_text("old\n")
    with ScriptedServer(edit_script() + [reply("It says new now.")]) as server:
        base = ["--provider", "llama-server", "--base-url", server.base_url, "--workspace", str(workspace)]
        assert run_cli(capsys, "run", *base, "--mode", "auto", "fix a.txt")[0] == 0
        assert run_cli(capsys, "run", *base, "--continue", "what does a.txt say?")[0] == 0
        history = server.chat_bodies[-1]["messages"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool", "assistant", "user"]
    code, out, _ = run_cli(capsys, "sessions", "list")
    session_id = out.split()[0]
    assert code == 0 and "fix a.txt" in out and str(workspace.resolve()) in out
    code, out, _ = run_cli(capsys, "sessions", "show", session_id[:6])
    assert code == 0 and "edit a.txt: applied (1 applied, 0 rejected)" in out
    code, out, _ = run_cli(capsys, "sessions", "export", session_id, "--markdown")
    assert code == 0 and out.startswith(f"# Session {session_id}: fix a.txt")
    assert "**Tool call** `edit_file`" in out and "```diff\n--- a/a.txt\n+++ b/a.txt" in out
    assert "## User\n\nwhat does a.txt say?" in out
    assert run_cli(capsys, "sessions", "show", "nope")[0] == 2


def test_resume_id_continues_that_session_in_its_own_workspace(capsys, tmp_path, monkeypatch):
    from openjet_tui.agent.sessions import SessionStore

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    (first / "a.txt").write_text("old\n")
    script = [*edit_script(), reply("Nothing to do here."),
              reply(tool_calls=[call("read_file", path="a.txt")]), reply("It says new.")]
    with ScriptedServer(script) as server:
        base = ["--provider", "llama-server", "--base-url", server.base_url, "--mode", "auto"]
        assert run_cli(capsys, "run", *base, "--workspace", str(first), "fix a.txt")[0] == 0
        assert run_cli(capsys, "run", *base, "--workspace", str(second), "anything?")[0] == 0  # the latest one
        store = SessionStore()
        session = store.latest(first.resolve())
        monkeypatch.chdir(second)  # neither the current folder nor the latest session: the one named
        code, out, _ = run_cli(capsys, "--resume", session.id[:8], "run", *base, "what does a.txt say now?")
        resumed = server.chat_bodies[3]["messages"]
    assert code == 0 and out.strip() == "It says new."
    assert [(m["role"], m.get("content")) for m in resumed if m["role"] in ("user", "assistant")] == [
        ("user", "fix a.txt"), ("assistant", ""), ("assistant", "Replaced old with new."),
        ("user", "what does a.txt say now?")]
    read_result = [m for m in server.chat_bodies[4]["messages"] if m["role"] == "tool"][-1]["content"]
    assert "new" in read_result and "Error" not in read_result  # a.txt was read from the session's workspace
    assert len(store.list()) == 2  # no new session was made
    assert [m["content"] for m in store.messages(session.id) if m["role"] == "user"] == [
        "fix a.txt", "what does a.txt say now?"]
    store.close()
    code, _, err = run_cli(capsys, "run", *base, "--resume", "nope", "hello")
    assert code == 2 and "no session with id 'nope'" in err


def test_plain_openjet_explains_when_the_app_is_missing(capsys, monkeypatch):
    monkeypatch.setattr("openjet_tui.cli.APP_MODULE", "openjet_tui.ui.no_such_app")
    code, _, err = run_cli(capsys)
    assert code == 2 and "openjet run" in err
