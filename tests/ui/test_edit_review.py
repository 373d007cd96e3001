"""Must show: approve one hunk and reject another with a reason (the file on disk matches); reject all with a typed
reason; accept all; a proposal whose file changed meanwhile is marked stale; unified/side by side; $EDITOR."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from openjet_tui.ui.widgets.diff_review import DiffReview, editor_command, HunkBlock
from openjet_tui.ui.widgets.diff_view import HunkView
from tests.agent.scripted_server import call, reply
from tests.ui.support import send, tool_results, wait_for, wait_for_prompt, wait_idle

SOURCE = "".join(f"line {i}\n" for i in range(1, 31))
TWO_HUNKS = [{"old_text": "line 2\n", "new_text": "line two\n"},
             {"old_text": "line 25\n", "new_text": "line twenty-five\n"}]


async def test_approve_one_hunk_reject_another_with_a_reason(server, workspace, make_app):
    (workspace / "app.py").write_text(SOURCE)
    server.push(reply("Renaming.", tool_calls=[call("edit_file", path="app.py", edits=TWO_HUNKS)]), reply("Done."))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "rename lines 2 and 25")
        review = await wait_for_prompt(pilot, DiffReview)
        assert (workspace / "app.py").read_text() == SOURCE  # shown before anything is written
        assert [b.has_class("-current") for b in review.query(HunkBlock)] == [True, False]
        await pilot.press("y")
        assert review.current == 1 and not review.is_answered
        await pilot.press("n", *"keep line 25 as it is", "enter")
        await wait_idle(pilot)
        assert not app.chat.prompt_area.children and app.focused is app.chat.prompt_input
    assert (workspace / "app.py").read_text() == SOURCE.replace("line 2\n", "line two\n")
    result = tool_results(server.chat_bodies[1])[-1]
    assert "Partly applied: 1 of 2 hunks" in result
    assert "rejected hunk 2 @@ -22,7 +22,7 @@: keep line 25 as it is" in result


async def test_reject_all_with_a_typed_reason_then_accept_all(server, workspace, make_app):
    (workspace / "app.py").write_text(SOURCE)
    server.push(reply(tool_calls=[call("edit_file", path="app.py", edits=TWO_HUNKS)]),
                reply(tool_calls=[call("write_file", path="new.txt", content="hello\n")]), reply("ok"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "edit")
        await wait_for_prompt(pilot, DiffReview)
        await pilot.press("R", *"use snake case instead", "enter")
        review = await wait_for_prompt(pilot, DiffReview)
        assert review.proposal.rel_path == "new.txt"
        await pilot.press("A")
        await wait_idle(pilot)
    assert (workspace / "app.py").read_text() == SOURCE
    assert (workspace / "new.txt").read_text() == "hello\n"
    rejected = tool_results(server.chat_bodies[1])[-1]
    assert rejected.startswith("Rejected: the whole edit to app.py (2 hunks)")
    assert "Reason: use snake case instead" in rejected
    assert tool_results(server.chat_bodies[2])[-1] == "Applied: all 1 hunk of the edit to new.txt."


async def test_changed_file_marks_the_open_review_stale_and_nothing_is_written(server, workspace, make_app):
    (workspace / "app.py").write_text(SOURCE)
    server.push(reply(tool_calls=[call("edit_file", path="app.py", edits=TWO_HUNKS)]), reply("ok"))
    app = make_app(server, watch=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.watcher is not None and app.watcher.ready.is_set(), what="the watcher")
        await send(pilot, "edit")
        review = await wait_for_prompt(pilot, DiffReview)
        assert not review.is_stale
        (workspace / "app.py").write_text(SOURCE + "line 31\n")  # someone else edits the file meanwhile
        await wait_for(pilot, lambda: review.has_class("-stale"), what="the stale marker")
        await pilot.press("A")
        await wait_idle(pilot)
    assert (workspace / "app.py").read_text() == SOURCE + "line 31\n"
    assert tool_results(server.chat_bodies[1])[-1].startswith("Error: Not applied: app.py changed on disk")


async def test_side_by_side_toggle_and_editor_at_the_hunk(server, workspace, make_app, tmp_path):
    (workspace / "app.py").write_text(SOURCE)
    log = tmp_path / "editor.log"
    editor = tmp_path / "fake-editor"
    editor.write_text(f"#!{sys.executable}\nimport sys\nopen({str(log)!r}, 'w').write(' '.join(sys.argv[1:]))\n")
    editor.chmod(editor.stat().st_mode | stat.S_IXUSR)
    server.push(reply(tool_calls=[call("edit_file", path="app.py", edits=TWO_HUNKS)]), reply("ok"))
    app = make_app(server, editor=str(editor))
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "edit")
        review = await wait_for_prompt(pilot, DiffReview)
        await pilot.press("v")
        await wait_for(pilot, lambda: all(v.side_by_side for v in review.query(HunkView)), what="side by side")
        assert len(review.query(".old-side")) == 2
        await pilot.press("down", "e")
        await wait_for(pilot, log.exists, what="the editor to run")
        assert log.read_text() == f"+25 {workspace.resolve() / 'app.py'}"
        await pilot.press("A")
        await wait_idle(pilot)


def test_editor_command_forms():
    path = Path("/w/a.py")
    assert editor_command("vim", path, 7) == ["vim", "+7", "/w/a.py"]
    assert editor_command("code --wait", path, 7) == ["code", "--wait", "-g", "/w/a.py:7"]
    assert editor_command("subl", path, 3) == ["subl", "/w/a.py:3"]
