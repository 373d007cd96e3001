"""Must show: allow and deny shell commands, store an always-allow rule; the prompt names the folder and which part
of a compound command matched which rule."""

from __future__ import annotations

from openjet_tui.agent.sessions import SessionStore
from openjet_tui.ui.widgets.prompts import PathPrompt, ShellPrompt
from tests.agent.scripted_server import call, reply
from tests.ui.support import send, tool_results, wait_for_prompt, wait_idle


async def test_allow_once_then_deny_with_a_reason(server, workspace, make_app):
    (workspace / "notes.txt").write_text("a\nb\n")
    server.push(reply(tool_calls=[call("run_shell", command="ls && sort -r notes.txt")]),
                reply(tool_calls=[call("run_shell", command="touch made-by-agent.txt")]), reply("done"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "sort the notes")
        prompt = await wait_for_prompt(pilot, ShellPrompt)
        parts = str(prompt.query_one("#shell-parts").render())
        assert "ls  allowed by rule `ls`" in parts and "sort -r notes.txt  no allow rule matches" in parts
        assert str(workspace.resolve()) in str(prompt.query_one("#shell-cwd").render())
        assert "allow `sort`" in str(prompt.query_one("#shell-always").render())
        await pilot.press("y")
        await wait_for_prompt(pilot, ShellPrompt)
        await pilot.press("n", *"do not create files", "enter")
        await wait_idle(pilot)
    assert tool_results(server.chat_bodies[1])[-1] == "exit code 0\nnotes.txt\nb\na\n"
    denied = tool_results(server.chat_bodies[2])[-1]
    assert denied == "Error: Not run: the command was denied (do not create files)."
    assert not (workspace / "made-by-agent.txt").exists()


async def test_allow_always_stores_the_prefix_rule_and_stops_asking(server, workspace, make_app,
                                                                   isolated_user_dirs):
    server.push(reply(tool_calls=[call("run_shell", command="python3 -m json.tool --help")]),
                reply(tool_calls=[call("run_shell", command="python3 -m json.tool --sort-keys --help")]), reply("done"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "check json.tool")
        prompt = await wait_for_prompt(pilot, ShellPrompt)
        assert "allow `python3 -m json.tool`" in str(prompt.query_one("#shell-always").render())
        await pilot.press("a")
        await wait_idle(pilot)
        assert not app.chat.prompt_area.children  # the second command ran without asking
    store = SessionStore()
    try:
        assert [str(rule) for rule in store.rules(workspace.resolve())] == ["python3 -m json.tool"]
    finally:
        store.close()
    assert tool_results(server.chat_bodies[2])[-1].startswith("exit code 0")


async def test_a_command_that_cannot_be_remembered_offers_no_always(server, workspace, make_app):
    server.push(reply(tool_calls=[call("run_shell", command="echo hi > out.txt")]), reply("done"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "write a file")
        prompt = await wait_for_prompt(pilot, ShellPrompt)
        assert "cannot be remembered" in str(prompt.query_one("#shell-always").render())
        await pilot.press("a")  # refused: the prompt stays
        assert not prompt.is_answered
        await pilot.press("y")
        await wait_idle(pilot)
    assert (workspace / "out.txt").read_text() == "hi\n"


async def test_reading_outside_the_workspace_asks_first(server, workspace, make_app, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret-ish\n")
    server.push(reply(tool_calls=[call("read_file", path=str(outside))]),
                reply(tool_calls=[call("read_file", path=str(outside))]), reply("done"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "read it twice")
        prompt = await wait_for_prompt(pilot, PathPrompt)
        assert prompt.request.action == "read" and prompt.request.path == outside.resolve()
        await pilot.press("y")
        await wait_for_prompt(pilot, PathPrompt)
        await pilot.press("n", *"stay in the project", "enter")
        await wait_idle(pilot)
    assert "secret-ish" in tool_results(server.chat_bodies[1])[-1]
    refused = tool_results(server.chat_bodies[2])[-1]
    assert "leaving it was not approved: stay in the project" in refused
