"""The conversation: follows streamed output unless the person scrolls up; reasoning collapsed with its token count
(the server's, else one per streamed chunk, else an estimate); tool cards expand; a 2,000-message history mounts only a window and loads earlier pages on demand."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Collapsible

from openjet_tui.agent.sessions import SessionStore
from openjet_tui.ui.widgets.chat_items import AssistantReply, NoticeLine, ToolCard
from openjet_tui.ui.widgets.conversation import MAX_MOUNTED, PAGE, Conversation, HistoryMarker
from tests.agent.scripted_server import call, reply
from tests.ui.support import send, wait_for, wait_idle

LONG_REPLY = "".join(f"Paragraph {i} of a long answer.\n\n" for i in range(80))


async def test_follows_output_until_scrolled_up_and_again_at_the_bottom(server, make_app):
    # The stream pauses after a third of the reply, so the scroll happens while more is surely to come.
    server.push(reply(LONG_REPLY, chunk_chars=12, delay_s=0.005, pause_after_chunks=70))
    app = make_app(server)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "write a lot")
        conversation = app.chat.conversation
        await wait_for(pilot, lambda: conversation.max_scroll_y > 20, what="overflowing text")
        assert conversation.is_following and conversation.scroll_y == conversation.max_scroll_y
        app.simulate_key("pageup")  # pilot.press would wait for the stream to finish
        await wait_for(pilot, lambda: not conversation.is_following, what="the scroll")
        held = conversation.scroll_y
        height = conversation.virtual_size.height
        server.resume.set()
        await wait_for(pilot, lambda: conversation.virtual_size.height > height + 10, what="more text")
        assert conversation.scroll_y == held  # new output did not drag the view down
        await wait_idle(pilot)
        while conversation.scroll_y < conversation.max_scroll_y:
            await pilot.press("pagedown")
        await pilot.pause(0.05)
        assert conversation.is_following


async def test_reasoning_is_collapsed_with_its_token_count_and_cards_expand(server, workspace, make_app):
    (workspace / "a.py").write_text("print(1)\n")
    server.push(reply("Let me look.", reasoning="I should read the file first. " * 4,
                      tool_calls=[call("read_file", path="a.py")]), reply("It prints 1."))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "what does a.py do?")
        await wait_idle(pilot)
        first = app.chat.conversation.query(AssistantReply).first()
        box = first.query_one("#reasoning", Collapsible)
        # the server reports no count: one token per streamed reasoning chunk (120 characters, 7 per chunk)
        assert box.collapsed and str(box.title) == "reasoning · 18 tokens"
        card = app.chat.conversation.query_one(ToolCard)
        assert "read_file a.py" in str(card.title) and "done" in str(card.title) and card.collapsed
        assert not card.query(".card-result")  # details are built only when opened
        card.collapsed = False
        await wait_for(pilot, lambda: card.query(".card-result"), what="the card details")
        assert "print(1)" in str(card.query_one(".card-result").render())


async def test_reasoning_count_is_the_servers_when_it_reports_one(server, workspace, make_app):
    usage = {"prompt_tokens": 300, "completion_tokens": 40, "total_tokens": 340,
             "completion_tokens_details": {"reasoning_tokens": 31}}
    server.push(reply("Fine.", reasoning="Several tokens arrive in each chunk here. " * 3, chunk_chars=40,
                      usage=usage))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "hello")
        await wait_idle(pilot)
        answer = app.chat.conversation.query_one(AssistantReply)
        assert str(answer.query_one("#reasoning", Collapsible).title) == "reasoning · 31 tokens"  # not 4 chunks
        assert answer.record()().reasoning_tokens == 31  # kept when scrolled out and mounted again
        session_id = app.controller.session.id
    app = make_app(server, resume=session_id)
    async with app.run_test(size=(120, 40)) as pilot:  # a stored reply: no count survives, so an estimate
        [answer] = await wait_for(pilot, lambda: list(app.chat.conversation.query(AssistantReply)),
                                  what="the stored reply")
        await pilot.pause()
        assert str(answer.query_one("#reasoning", Collapsible).title) == "reasoning · ~32 tokens"


async def test_two_thousand_message_history_mounts_a_window(server, workspace, make_app):
    store = SessionStore()
    store.db.execute("PRAGMA synchronous = OFF")  # fixture data: 4,000 commits need not each reach the disk
    session = store.create(workspace.resolve(), "llama-server", "scripted-model", "ask")
    for i in range(1000):
        store.add_message(session.id, {"role": "user", "content": f"question {i}"})
        store.add_message(session.id, {"role": "assistant", "content": f"answer **{i}**"})
    store.close()
    app = make_app(server, resume=session.id)
    async with app.run_test(size=(120, 40)) as pilot:
        conversation = app.chat.conversation
        await wait_for(pilot, lambda: conversation.query(HistoryMarker), what="the history")
        assert len(conversation.items) == PAGE and len(conversation.older) == 2000 - PAGE
        assert "1,960 earlier items" in str(conversation.query_one(HistoryMarker).render())
        assert conversation.items[-1].content == "answer **999**"
        await pilot.press(*"still typing")
        assert app.chat.prompt_input.text == "still typing"
        conversation.scroll_home(animate=False)
        await wait_for(pilot, lambda: len(conversation.items) == 2 * PAGE, what="the previous page")
        await wait_for(pilot, lambda: conversation.scroll_y > 0, what="the view to stay on what was shown")
        assert "1,920 earlier items" in str(conversation.query_one(HistoryMarker).render())


class TrimApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Conversation(id="c")


async def test_following_a_long_session_unmounts_the_oldest_items():
    app = TrimApp()
    async with app.run_test(size=(80, 20)) as pilot:
        conversation = app.query_one(Conversation)
        for i in range(MAX_MOUNTED + 30):
            await conversation.add(NoticeLine(f"note {i}"))
        await pilot.pause()
        assert conversation.num_items == MAX_MOUNTED + 30 and len(conversation.items) <= MAX_MOUNTED
        assert conversation.items[-1].message == f"note {MAX_MOUNTED + 29}"
        await conversation.load_older(5)
        assert conversation.items[0].message == f"note {len(conversation.older)}"
