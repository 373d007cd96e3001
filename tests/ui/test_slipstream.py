"""Must show: toggle Slipstream with confirmation (banner, cloud-marked messages, bytes and tokens sent), declining
it, and refusal when airgapped."""

from __future__ import annotations

from pathlib import Path

from openjet_tui.agent.sessions import SessionStore
from openjet_tui.ui.screens.confirm import SlipstreamConfirm
from openjet_tui.ui.widgets.chat_items import AssistantReply, UserMessage
from tests.agent.scripted_server import ScriptedServer, reply
from tests.ui.support import send, wait_for, wait_idle


def configure(workspace: Path, cloud: ScriptedServer, airgapped: bool = False) -> None:
    """A project config naming the cloud endpoint (and the airgap setting)."""
    folder = workspace / ".openjet"
    folder.mkdir()
    folder.joinpath("config.toml").write_text(f'airgapped = {str(airgapped).lower()}\n\n[slipstream]\n'
                                              f'base_url = "{cloud.base_url}"\nmodel = "cloud-model"\n')


async def test_enable_with_confirmation_marks_cloud_traffic_and_disable(server, workspace, make_app):
    with ScriptedServer([reply("Plan: read, then delegate.")], model="cloud-model") as cloud:
        configure(workspace, cloud)
        server.push(reply("local answer"))
        app = make_app(server)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.controller.ready.is_set, what="the connection")
            await pilot.press("f3")
            confirm = await wait_for(pilot, lambda: isinstance(app.screen, SlipstreamConfirm) and app.screen)
            text = str(confirm.query_one("#confirm-text").render())
            assert cloud.base_url in text and "cloud-model" in text and "What is sent there" in text
            assert not app.chat.banner.is_on  # nothing changes before the person accepts
            await pilot.press("y")
            await wait_for(pilot, lambda: app.chat.banner.is_on, what="the banner")
            assert cloud.base_url in str(app.chat.banner.render())
            await send(pilot, "make a plan")
            await wait_idle(pilot)
            [sent] = [r for r in cloud.requests if r.path.endswith("/chat/completions")]
            banner = app.chat.banner
            assert (banner.num_requests, banner.bytes_sent) == (1, sent.num_bytes)
            assert banner.tokens_sent > 0 and f"{banner.tokens_sent:,} tokens" in str(banner.render())
            items = app.chat.conversation.items
            assert [m.to_cloud for m in items if isinstance(m, UserMessage)] == [True]
            assert [r.origin for r in items if isinstance(r, AssistantReply)] == ["cloud"]
            assert server.chat_bodies == []  # the local server saw none of it
            store = SessionStore()  # one stored traffic row per cloud request, filed under this session
            assert [row["request_bytes"] for row in store.traffic(app.controller.session.id)] == [sent.num_bytes]
            assert store.db.execute("SELECT COUNT(*) FROM traffic").fetchone()[0] == 1  # and nowhere else
            store.close()
            await pilot.press("f3")
            await wait_for(pilot, lambda: not app.chat.banner.is_on, what="the banner to go")
            await send(pilot, "now locally")
            await wait_idle(pilot)
            assert len(server.chat_bodies) == 1 and len(cloud.chat_bodies) == 1
            assert "make a plan" in str(server.chat_bodies[0]["messages"])  # the conversation carried over


async def test_declining_the_confirmation_sends_nothing_to_the_cloud(server, workspace, make_app):
    with ScriptedServer(model="cloud-model") as cloud:
        configure(workspace, cloud)
        server.push(reply("local answer"))
        app = make_app(server)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.controller.ready.is_set, what="the connection")
            await pilot.press("f3")
            await wait_for(pilot, lambda: isinstance(app.screen, SlipstreamConfirm), what="the confirmation")
            await pilot.press("n")
            await send(pilot, "hello")
            await wait_idle(pilot)
            assert not app.chat.banner.is_on and not app.controller.is_slipstream_on
        assert cloud.requests == [] and len(server.chat_bodies) == 1


async def test_airgapped_refuses_and_says_why(server, workspace, make_app):
    with ScriptedServer(model="cloud-model") as cloud:
        configure(workspace, cloud, airgapped=True)
        app = make_app(server)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.controller.ready.is_set, what="the connection")
            await pilot.press("f3")
            await wait_for(pilot, lambda: app._notifications, what="the refusal")
            [note] = list(app._notifications)
            assert "impossible while airgapped = true" in note.message and cloud.base_url in note.message
            assert len(app.screen_stack) == 1 and not app.chat.banner.is_on
        assert cloud.requests == []
