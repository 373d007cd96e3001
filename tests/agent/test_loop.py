"""The turn loop: text tool calls, bad calls, cancellation, compaction, failures, undo, always-rules."""

import asyncio

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import ScriptedApprover, ShellDecision
from openjet_tui.agent.proposals import EditDecision
from openjet_tui.agent.sessions import SessionStore
from openjet_tui.agent.shellpolicy import Mode
from tests.agent.scripted_server import call, reply


def tools_of(body):
    return [m for m in body["messages"] if m["role"] == "tool"]


async def test_text_tool_calls_from_a_small_model_drive_the_loop(server, workspace, make_agent):
    (workspace / "main.py").write_text("print(1)\n")
    server.push(reply('```json\n{"name": "read_file", "arguments": {"path": "main.py"}}\n```'),
                reply('<tool_call>\n{"name": "read_file", "arguments": {"path": "main.py"}}\n</tool_call>'),
                reply("It prints 1."))
    agent, events = make_agent(server, workspace, ScriptedApprover())
    result = await agent.run_turn("what does main.py print?")
    assert result.status == "done" and result.final_text == "It prints 1."
    third = server.chat_bodies[2]["messages"]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    ids = [m["tool_calls"][0]["id"] for m in third if m.get("tool_calls")]
    assert len(set(ids)) == 2  # text calls get fresh ids each step
    assert third[2]["content"] == "" and "print(1)" in third[3]["content"]


async def test_unknown_tools_and_bad_arguments_are_reported_to_the_model(server, workspace, make_agent):
    server.push(reply(tool_calls=[call("delete_everything"), call("read_file", path=5),
                                  call("edit_file", path="x", edits=[{"old_text": "a"}])]),
                reply("Sorry."))
    agent, _ = make_agent(server, workspace, ScriptedApprover())
    await agent.run_turn("go")
    results = [m["content"] for m in tools_of(server.chat_bodies[1])]
    assert results[0].startswith("Error: unknown tool 'delete_everything'; available tools: read_file")
    assert results[1] == "Error: read_file: argument 'path' must be string, got int"
    assert results[2] == "Error: edit_file: missing required argument edits[0].'new_text'"


async def test_cancel_mid_stream_and_mid_command_keeps_history_valid(server, workspace, make_agent):
    server.push(reply("thinking " * 50, chunk_chars=3, hang_after_chunks=4))
    agent, events = make_agent(server, workspace, ScriptedApprover(), Mode.AUTO)
    task = asyncio.create_task(agent.run_turn("first"))
    while not any(isinstance(e, ev.TextDelta) for e in events):
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert isinstance(events[-1], ev.TurnFinished) and events[-1].status == "cancelled"

    server.push(reply(tool_calls=[call("run_shell", command="sleep 30"), call("read_file", path="x")]),
                reply("ok"))
    task = asyncio.create_task(agent.run_turn("second"))
    while not any(isinstance(e, ev.ShellResolved) for e in events):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    roles = [m["role"] for m in agent.history]
    assert roles == ["user", "user", "assistant", "tool", "tool"]  # both calls answered, none left open
    assert all("cancelled by the person" in m["content"] for m in agent.history[3:])
    await agent.run_turn("third")
    assert [m["role"] for m in server.chat_bodies[-1]["messages"]][-1] == "user"


async def test_compaction_summarises_old_turns_and_keeps_recent_ones_whole(server, workspace, make_agent):
    agent, events = make_agent(server, workspace, ScriptedApprover(), context_window=2600, keep_recent_turns=1)
    for number in range(3):
        server.push(reply(f"answer {number} " + "x" * 1200))
        await agent.run_turn(f"question {number}")
    assert not any(isinstance(e, ev.Compacted) for e in events)
    server.push(reply("SUMMARY: three questions were asked."), reply("answer 3"))
    await agent.run_turn("question 3")
    compacted = [e for e in events if isinstance(e, ev.Compacted)]
    assert len(compacted) == 1 and compacted[0].num_messages == 6
    summary_request, next_request = server.chat_bodies[-2], server.chat_bodies[-1]
    assert "question 0" in summary_request["messages"][1]["content"] and "tools" not in summary_request
    assert [m["role"] for m in next_request["messages"]] == ["system", "user"]
    assert "SUMMARY: three questions were asked." in next_request["messages"][0]["content"]
    stored = agent.store.messages(agent.session.id)
    assert [m["content"] for m in stored if m["role"] == "user"] == ["question 3"]
    assert agent.store.get(agent.session.id).summary == "SUMMARY: three questions were asked."


async def test_server_failure_ends_the_turn_with_an_error_event(server, workspace, make_agent):
    server.push(reply(status=400, error="request exceeds the available context size"))
    agent, events = make_agent(server, workspace, ScriptedApprover())
    result = await agent.run_turn("hello")
    assert result.status == "error" and "context window" in result.error
    assert isinstance(events[-2], ev.ErrorEvent) and events[-2].kind == "ContextWindowError"


async def test_max_steps_stops_a_looping_model(server, workspace, make_agent):
    server.push(*[reply(tool_calls=[call("list_dir")]) for _ in range(3)])
    agent, events = make_agent(server, workspace, ScriptedApprover(), max_steps=3)
    result = await agent.run_turn("loop")
    assert (result.status, result.num_steps) == ("max_steps", 3)
    assert any(isinstance(e, ev.Notice) and "stopped after 3 steps" in e.message for e in events)


async def test_undo_and_always_rule_survive_into_a_new_agent(server, workspace, make_agent, tmp_path):
    (workspace / "a.txt").write_text("one\n")
    server.push(reply(tool_calls=[call("write_file", path="a.txt", content="two\n"),
                                  call("run_shell", command="touch made.txt")]), reply("done"))
    approver = ScriptedApprover.of(edits=[EditDecision.accept_all], shells=[ShellDecision(True, always=True)])
    store = SessionStore(tmp_path / "sessions.db")
    agent, _ = make_agent(server, workspace, approver, store=store)
    await agent.run_turn("change it")
    assert (workspace / "a.txt").read_text() == "two\n" and (workspace / "made.txt").exists()
    assert [str(r) for r in approver.seen_shells[0].verdict.suggested_rules] == ["touch"]
    server.push(reply(tool_calls=[call("run_shell", command="touch made.txt")]), reply("again"))
    again, _ = make_agent(server, workspace, ScriptedApprover(), store=store, session=agent.session)
    again.resume()
    await again.run_turn("do it again")
    assert "exit code 0" in tools_of(server.chat_bodies[-1])[-1]["content"]  # remembered rule: no asking
    assert again.undo() == "restored a.txt as it was before the edit"
    assert (workspace / "a.txt").read_text() == "one\n"
