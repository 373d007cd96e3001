"""Must show: resume a session (--resume and the /resume picker), continue the latest one, cancel a turn with Esc
(while streaming and while a prompt is open)."""

from __future__ import annotations

from openjet_tui.ui.screens.picker import PickerScreen
from openjet_tui.ui.widgets.chat_items import AssistantReply, NoticeLine, UserMessage
from openjet_tui.ui.widgets.diff_review import DiffReview
from tests.agent.scripted_server import call, reply
from tests.ui.support import send, type_now, wait_for, wait_for_prompt, wait_idle


def shown(app) -> list[tuple[str, str]]:
    """The user messages and replies on screen, in order."""
    items = []
    for item in app.chat.conversation.items:
        if isinstance(item, UserMessage):
            items.append(("you", item.text))
        elif isinstance(item, AssistantReply):
            items.append(("assistant", item.content))
    return items


async def first_session(server, make_app) -> str:
    server.push(reply("The answer is 4."))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "what is 2+2?")
        await wait_idle(pilot)
        return app.controller.session.id


async def test_resume_by_id_shows_history_and_continues_it(server, make_app):
    session_id = await first_session(server, make_app)
    server.push(reply("Then 8."))
    app = make_app(server, resume=session_id)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: shown(app), what="the history")
        assert shown(app) == [("you", "what is 2+2?"), ("assistant", "The answer is 4.")]
        assert app.chat.status_bar.session_id == session_id
        await pilot.press("up")  # the editor's history holds the resumed session's messages
        assert app.chat.prompt_input.text == "what is 2+2?"
        await pilot.press("ctrl+a", "ctrl+k")
        await send(pilot, "and doubled?")
        await wait_idle(pilot)
    sent = [(m["role"], m["content"]) for m in server.chat_bodies[-1]["messages"][1:]]
    assert sent == [("user", "what is 2+2?"), ("assistant", "The answer is 4."), ("user", "and doubled?")]


async def test_resume_picker_and_continue(server, make_app):
    old_id = await first_session(server, make_app)
    server.push(reply("Hi."))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "hello")
        await wait_idle(pilot)
        await pilot.press("f4")
        picker = await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen) and app.screen)
        assert picker.option_list.option_count == 2  # this workspace's sessions, newest first
        await pilot.press(*old_id[:8], "enter")
        await wait_for(pilot, lambda: app.chat.status_bar.session_id == old_id, what="the switch")
        assert shown(app) == [("you", "what is 2+2?"), ("assistant", "The answer is 4.")]
    app = make_app(server, continue_session=True)  # the session used last
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: shown(app), what="the history")
        assert app.controller.session.id != old_id and shown(app)[0] == ("you", "hello")


async def test_escape_cancels_a_streaming_turn_and_the_next_one_works(server, make_app):
    server.push(reply("Thinking about it " * 20, hang_after_chunks=6), reply("Fresh start."))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "long task")
        await wait_for(pilot, lambda: any(c for _, c in shown(app)[1:]), what="streamed text")
        assert app.is_busy
        await pilot.press("escape")
        await wait_idle(pilot)
        notices = [n.message for n in app.chat.conversation.items if isinstance(n, NoticeLine)]
        assert "turn cancelled: nothing more will run" in notices
        await wait_for(pilot, lambda: server.disconnects >= 1, what="the stream to close")
        await send(pilot, "again")
        await wait_idle(pilot)
        assert shown(app)[-1] == ("assistant", "Fresh start.")
    assert [m["role"] for m in server.chat_bodies[1]["messages"][1:]] == ["user", "user"]


async def test_escape_during_a_review_cancels_without_writing(server, workspace, make_app):
    (workspace / "a.txt").write_text("one\n")
    server.push(reply(tool_calls=[call("edit_file", path="a.txt", edits=[{"old_text": "one", "new_text": "two"}])]))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "edit")
        await wait_for_prompt(pilot, DiffReview)
        await pilot.press("escape")
        await wait_idle(pilot)
        assert not app.chat.prompt_area.children and app.focused is app.chat.prompt_input
    assert (workspace / "a.txt").read_text() == "one\n"


async def test_quitting_mid_turn_leaves_a_resumable_session(server, make_app):
    server.push(reply("Working on it " * 20, hang_after_chunks=4), reply("Resumed fine."))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "a long job")
        await wait_for(pilot, lambda: any(c for _, c in shown(app)[1:]), what="streamed text")
        session_id = app.controller.session.id
        await pilot.press("ctrl+q")
    app = make_app(server, resume=session_id)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: shown(app), what="the history")
        assert shown(app)[0] == ("you", "a long job")
        await send(pilot, "continue")
        await wait_idle(pilot)
        assert shown(app)[-1] == ("assistant", "Resumed fine.")


async def test_a_message_sent_during_a_turn_waits_for_it(server, make_app):
    server.push(reply("first answer " * 15, chunk_chars=5, delay_s=0.02), reply("second answer"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.controller.ready.is_set, what="the connection")
        type_now(app, "one")
        await wait_for(pilot, lambda: app.is_busy, what="the first turn")
        type_now(app, "two")
        await wait_for(pilot, lambda: app.queued == ["two"], what="the queued message")
        await wait_for(pilot, lambda: shown(app)[-1] == ("assistant", "second answer"), what="the second turn")
        assert [text for who, text in shown(app) if who == "you"] == ["one", "two"]
    assert server.chat_bodies[1]["messages"][-1]["content"] == "two"
