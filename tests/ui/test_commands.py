"""Slash commands: /diff, /undo, /compact, /clear, /engine, /quit and typed /slipstream; Slipstream asked for at
start-up still needs the person's confirmation; a /metrics scrape names the backend and why."""

from __future__ import annotations

from openjet_tui.agent.sessions import SessionStore
from openjet_tui.ui.screens.confirm import SlipstreamConfirm
from openjet_tui.ui.screens.diff import DiffScreen
from openjet_tui.ui.widgets.chat_items import NoticeLine
from openjet_tui.ui.widgets.diff_view import HunkView
from tests.agent.scripted_server import ScriptedServer, call, reply
from tests.ui.support import send, wait_for, wait_idle
from tests.ui.test_engine_panel import OPENJET_METRICS


def notices(app) -> list[str]:
    """The notice lines of the conversation."""
    return [item.message for item in app.chat.conversation.items if isinstance(item, NoticeLine)]


async def test_diff_undo_and_clear(server, workspace, make_app):
    (workspace / "a.txt").write_text("one\ntwo\n")
    server.push(reply(tool_calls=[call("edit_file", path="a.txt", edits=[{"old_text": "two", "new_text": "2"}])]),
                reply("changed"), reply("fresh"))
    app = make_app(server, mode="auto-edit")
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "change two")
        await wait_idle(pilot)
        first_session = app.controller.session.id
        await pilot.press(*"/diff", "enter")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen)
        [view] = screen.query(HunkView)
        assert view.hunk.lines == [" one", "-two", "+2"]
        await pilot.press("escape")
        await pilot.press(*"/undo", "enter")
        await wait_for(pilot, lambda: any(n.startswith("undone:") for n in notices(app)), what="the undo")
        assert (workspace / "a.txt").read_text() == "one\ntwo\n"
        await pilot.press(*"/clear", "enter")
        await wait_for(pilot, lambda: app.chat.status_bar.session_id == "new", what="a new conversation")
        assert app.chat.conversation.items == []
        await send(pilot, "hello again")
        await wait_idle(pilot)
        assert app.controller.session.id != first_session
    assert [m["role"] for m in server.chat_bodies[-1]["messages"]] == ["system", "user"]


async def test_compact_summarises_older_turns(server, make_app):
    server.push(reply("one"), reply("two"), reply("three"), reply("Summary: counted to three."))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        for word in ("first", "second", "third"):
            await send(pilot, word)
            await wait_idle(pilot)
        await pilot.press(*"/compact", "enter")
        await wait_for(pilot, lambda: any(n.startswith("compacted 2 earlier messages") for n in notices(app)),
                       what="the compaction notice")
    assert "Summary: counted to three." not in str(server.chat_bodies[-1]["messages"][-1])
    assert len(server.chat_bodies) == 4


async def test_slipstream_from_settings_still_asks_first(server, workspace, make_app):
    with ScriptedServer(model="cloud-model") as cloud:
        (workspace / ".openjet").mkdir()
        (workspace / ".openjet" / "config.toml").write_text(
            f'[slipstream]\nenabled = true\nbase_url = "{cloud.base_url}"\nmodel = "cloud-model"\n')
        app = make_app(server)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, SlipstreamConfirm), what="the confirmation")
            assert not app.controller.is_slipstream_on
            await pilot.press("n")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, what="the confirmation to close")
            assert not app.chat.banner.is_on and not app.controller.is_slipstream_on


async def test_metrics_scrape_names_the_backend_and_its_reason(server, make_app):
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.controller.ready.is_set, what="the connection")
        app.show_engine_metrics(OPENJET_METRICS)
        await pilot.pause()
        panel = app.chat.engine_panel
        assert panel.backend == "megakernel" and panel.reason == "sm_90 with 139 GiB free"
        assert "105 tok/s" in str(panel.query_one("#engine-decode").render())
        assert "3.28 tok/pass" in str(panel.query_one("#engine-speeds").render())
        assert "figures from the server's /metrics" in str(panel.query_one("#engine-source").render())


async def test_engine_command_hides_and_shows_the_panel(server, make_app):
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.controller.ready.is_set, what="the connection")
        panel = app.chat.engine_panel
        assert panel.display and panel.region.width > 0  # wide enough: shown from the start
        await pilot.press(*"/engine", "enter")
        await wait_for(pilot, lambda: not panel.display, what="the panel to hide")
        await pilot.pause()
        assert panel.region.width == 0 and app.chat.conversation.region.width == 120
        await pilot.press(*"/engine", "enter")
        await wait_for(pilot, lambda: panel.display, what="the panel to come back")
    narrow = make_app(server)
    async with narrow.run_test(size=(80, 40)) as pilot:
        await wait_for(pilot, narrow.controller.ready.is_set, what="the connection")
        assert not narrow.chat.engine_panel.display  # too narrow: hidden unless asked for
        await pilot.press(*"/engine", "enter")
        await wait_for(pilot, lambda: narrow.chat.engine_panel.display, what="the panel on a narrow screen")


async def test_quit_leaves_the_app_and_keeps_the_session(server, make_app):
    server.push(reply("hello there"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "hi")
        await wait_idle(pilot)
        session_id = app.controller.session.id
        await pilot.press(*"/quit", "enter")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    assert app.return_value == 0
    store = SessionStore()
    try:  # the conversation is stored and resumable
        assert [m["content"] for m in store.messages(session_id)] == ["hi", "hello there"]
    finally:
        store.close()


async def test_typed_slipstream_asks_turns_on_and_off_and_waits_for_a_turn(server, workspace, make_app):
    from tests.ui.test_slipstream import configure

    with ScriptedServer(model="cloud-model") as cloud:
        configure(workspace, cloud)
        server.push(reply("partial", hang_after_chunks=2))
        app = make_app(server)
        async with app.run_test(size=(120, 40)) as pilot:
            await send(pilot, "a long one")
            await wait_for(pilot, lambda: app.is_busy and server.chat_bodies, what="the turn to start")
            await pilot.press(*"/slipstream", "enter")
            await wait_for(pilot, lambda: app._notifications, what="the refusal while busy")
            assert "/slipstream waits for the running turn" in list(app._notifications)[0].message
            assert not isinstance(app.screen, SlipstreamConfirm) and not app.controller.is_slipstream_on
            await pilot.press("escape")
            await wait_idle(pilot)
            await pilot.press(*"/slipstream", "enter")
            confirm = await wait_for(pilot, lambda: isinstance(app.screen, SlipstreamConfirm) and app.screen)
            assert cloud.base_url in str(confirm.query_one("#confirm-text").render())
            await pilot.press("y")
            await wait_for(pilot, lambda: app.chat.banner.is_on and app.controller.is_slipstream_on,
                           what="Slipstream on")
            await pilot.press(*"/slipstream", "enter")
            await wait_for(pilot, lambda: not app.chat.banner.is_on, what="Slipstream off")
            assert not app.controller.is_slipstream_on
            assert "Slipstream is off: everything stays on this machine" in notices(app)
        assert cloud.requests == []  # turning it on and off sends nothing by itself
