"""Must show: a session interrupted mid-turn (process killed) resumes with nothing lost that had been approved."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from openjet_tui.agent.proposals import EditDecision, make_proposal
from openjet_tui.agent.resume import recover_session
from openjet_tui.agent.sessions import SessionStore
from openjet_tui.cli import main
from tests.agent.scripted_server import ScriptedServer, call, reply

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def test_killed_mid_turn_then_continued(workspace, capsys):
    (workspace / "a.txt").write_text("alpha\nbeta\n")
    first = reply("Editing, then testing.", tool_calls=[
        call("edit_file", path="a.txt", edits=[{"old_text": "beta", "new_text": "BETA"}]),
        call("run_shell", command="echo $$ > shell.pid; sleep 30")])
    with ScriptedServer([first, reply("All good now.")]) as server:
        argv = ["run", "--provider", "llama-server", "--base-url", server.base_url, "--mode", "auto",
                "--workspace", str(workspace), "--json", "uppercase beta and run the tests"]
        process = subprocess.Popen([sys.executable, "-m", "openjet_tui.cli", *argv], cwd=ROOT,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        shell_pid = workspace / "shell.pid"
        try:
            wait_for(lambda: shell_pid.exists() and shell_pid.read_text().strip() or process.poll() is not None)
            assert process.poll() is None, process.communicate()
            process.kill()  # SIGKILL: no cleanup code runs
            process.wait(timeout=10)
        finally:
            if shell_pid.exists():
                try:
                    os.killpg(int(shell_pid.read_text()), signal.SIGKILL)  # the orphaned command
                except ProcessLookupError:
                    pass
            process.stdout.close()
            process.stderr.close()
        assert (workspace / "a.txt").read_text() == "alpha\nBETA\n"  # the approved edit is on disk

        code = main(["run", "--provider", "llama-server", "--base-url", server.base_url, "--mode", "auto",
                     "--workspace", str(workspace), "--continue", "is it done?"])
        resumed = server.chat_bodies[-1]["messages"]
    assert code == 0 and len(server.chat_bodies) == 2
    assert [m["role"] for m in resumed] == ["system", "user", "assistant", "tool", "tool", "user"]
    calls = resumed[2]["tool_calls"]
    results = {m["tool_call_id"]: m["content"] for m in resumed if m["role"] == "tool"}
    assert results[calls[0]["id"]] == "Applied: all 1 hunk of the edit to a.txt."
    assert "interrupted before it finished" in results[calls[1]["id"]]
    assert resumed[-1]["content"] == "is it done?"
    store = SessionStore()
    (session,) = store.list()
    assert [(p["rel_path"], p["status"]) for p in store.proposals(session.id)] == [("a.txt", "applied")]
    assert len(store.checkpoints(session.id)) == 1  # undo still works after the crash
    assert "All good now." in capsys.readouterr().out


def test_approved_edit_whose_write_never_happened_is_finished_on_resume(workspace, tmp_path):
    target = workspace / "m.py"
    target.write_text("x = 1\n" + "pass\n" * 20 + "y = 2\n")
    store = SessionStore(tmp_path / "s.db")
    session = store.create(workspace, "p", "m", "ask")
    proposal = make_proposal(target, "m.py", target.read_bytes(),
                             target.read_text().replace("x = 1", "x = 10").replace("y = 2", "y = 20"), call_id="c1")
    store.add_message(session.id, {"role": "user", "content": "bump"})
    store.add_message(session.id, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "edit_file", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "run_shell", "arguments": "{}"}}]})
    store.save_proposal(session.id, proposal)
    decision = EditDecision(frozenset({0}), None, {1: "leave y"})
    expected = proposal.result_text(decision.accepted)
    from openjet_tui.agent.proposals import digest
    store.save_decision(proposal, [0], [1], None, {1: "leave y"}, digest(expected.encode()))
    # the process died here: decision stored, file not yet written
    notes = recover_session(store, session.id)
    assert target.read_text() == expected
    assert any("finished writing the approved edit to m.py" in n for n in notes)
    messages = store.messages(session.id)
    assert "Partly applied: 1 of 2 hunks" in messages[2]["content"] and "leave y" in messages[2]["content"]
    assert messages[3]["content"] == "Not run: the session was interrupted before this tool call ran."
    assert recover_session(store, session.id) == []  # idempotent
    assert store.proposals(session.id)[0]["status"] == "partial"


def test_undecided_and_stale_edits_are_not_forced_through(workspace, tmp_path):
    target = workspace / "n.txt"
    target.write_text("one\n")
    store = SessionStore(tmp_path / "s.db")
    session = store.create(workspace, "p", "m", "ask")
    pending = make_proposal(target, "n.txt", target.read_bytes(), "two\n", call_id="p1")
    store.save_proposal(session.id, pending)
    approved = make_proposal(target, "n.txt", target.read_bytes(), "three\n", call_id="p2")
    store.save_proposal(session.id, approved)
    store.save_decision(approved, [0], [], None, {}, "digest-of-three")
    target.write_text("changed by hand\n")
    notes = recover_session(store, session.id)
    assert target.read_text() == "changed by hand\n"
    statuses = {p["call_id"]: p["status"] for p in store.proposals(session.id)}
    assert statuses == {"p1": "abandoned", "p2": "stale"}
    assert any("could not be finished" in n for n in notes)
    assert json.loads(store.proposals(session.id)[1]["applied"]) == [0]
