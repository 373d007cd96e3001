"""Must show: a multi-step task against the scripted server: read, a two-hunk edit with one hunk rejected, an
allowed command, a denied command; the workspace ends exactly as expected and the model hears of the rejection."""

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import ScriptedApprover
from openjet_tui.agent.proposals import EditDecision
from openjet_tui.agent.shellpolicy import Mode
from tests.agent.scripted_server import call, reply

SOURCE = "".join(f"line {i}\n" for i in range(1, 31))


def tree(root):
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def tool_messages(body):
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


async def test_multi_step_task_with_partial_edit_and_shell_policy(server, workspace, make_agent):
    (workspace / "app.py").write_text(SOURCE)
    (workspace / "notes.md").write_text("keep me\n")
    server.push(
        reply("Reading first.", tool_calls=[call("read_file", path="app.py")]),
        reply(tool_calls=[call("edit_file", path="app.py", edits=[
            {"old_text": "line 2\n", "new_text": "line two\n"},
            {"old_text": "line 25\n", "new_text": "line twenty-five\n"}])]),
        reply(tool_calls=[call("run_shell", command="ls && cat app.py | wc -l")]),
        reply(tool_calls=[call("run_shell", command="rm -rf notes.md")]),
        reply("Done: changed line 2; line 25 was kept as you asked."),
    )
    reject_second = EditDecision(frozenset({0}), None, {1: "keep line 25 as it is"})
    approver = ScriptedApprover.of(edits=[reject_second])
    agent, events = make_agent(server, workspace, approver, Mode.ASK)

    result = await agent.run_turn("Rename lines 2 and 25 to words, then check the line count and clean up.")

    assert result.status == "done" and result.num_steps == 5
    assert tree(workspace) == {"app.py": SOURCE.replace("line 2\n", "line two\n"), "notes.md": "keep me\n"}
    assert len(approver.seen_edits) == 1 and approver.seen_shells == []  # rule-allowed and rule-denied: no asking
    bodies = server.chat_bodies
    assert "     1\tline 1" in tool_messages(bodies[1])[0]
    edit_result = tool_messages(bodies[2])[-1]
    assert "Partly applied: 1 of 2 hunks" in edit_result
    assert "applied hunk 1 @@ -1,5 +1,5 @@" in edit_result
    assert "rejected hunk 2 @@ -22,7 +22,7 @@: keep line 25 as it is" in edit_result
    assert tool_messages(bodies[3])[-1].startswith("exit code 0\napp.py\nnotes.md\n30")
    denied = tool_messages(bodies[4])[-1]
    assert denied.startswith("Error: Not run: denied") and "rm -rf" in denied
    kinds = [type(e) for e in events]
    assert kinds[0] is ev.TurnStarted and kinds[-1] is ev.TurnFinished
    resolved = [e for e in events if isinstance(e, ev.ProposalResolved)]
    assert [(e.status, e.applied, e.rejected) for e in resolved] == [("partial", [0], [1])]
    shells = [(e.command, e.allowed, e.decided_by) for e in events if isinstance(e, ev.ShellResolved)]
    assert shells == [("ls && cat app.py | wc -l", True, "rule"), ("rm -rf notes.md", False, "policy")]
    assert "".join(e.text for e in events if isinstance(e, ev.TextDelta)).startswith("Reading first.Done")
