"""The editor: multi-line input with history, @path and slash-command completion; the command palette lists every
action; the help screen lists the keys; /mode and /model."""

from __future__ import annotations

from textual.app import SystemCommand

from openjet_tui.ui.commands import COMMANDS, parse_command, UnknownCommandError
from openjet_tui.ui.screens.help import HelpScreen
from openjet_tui.ui.screens.picker import PickerScreen
from openjet_tui.ui.widgets.diff_review import DiffReview
from openjet_tui.ui.widgets.prompt_box import CompletionSources, completion_context
from openjet_tui.ui.widgets.prompts import ShellPrompt
from tests.agent.scripted_server import call, reply
from tests.ui.support import send, wait_for, wait_for_prompt, wait_idle

SOURCES = CompletionSources([(c.slash, c.help) for c in COMMANDS], lambda cmd, part: [("ask", "")],
                            lambda query: ["src/app.py", "src/api.py"] if "ap" in query else [])


def test_completion_context_finds_commands_arguments_and_paths():
    assert [c for c, _ in completion_context("/re", SOURCES)[1]] == ["/resume"]
    assert completion_context("/mode a", SOURCES) == (6, [("ask", "")])
    assert completion_context("look at @ap", SOURCES) == (8, [("@src/app.py", ""), ("@src/api.py", "")])
    assert completion_context("first line\nsee @ap", SOURCES)[0] == 15
    assert completion_context("plain words", SOURCES) is None
    assert completion_context("a /slash mid-text", SOURCES) is None


def test_parse_command_suggests_close_names():
    assert parse_command("/mode  auto ")[1] == "auto"
    try:
        parse_command("/resum")
    except UnknownCommandError as exc:
        assert "did you mean /resume" in str(exc)
    else:
        raise AssertionError("unknown command accepted")


async def test_multiline_history_and_path_completion(server, workspace, make_app):
    (workspace / "src").mkdir()
    (workspace / "src" / "parser.py").write_text("x = 1\n")
    server.push(reply("one"), reply("two"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "first")
        await wait_idle(pilot)
        editor = app.chat.prompt_input
        await pilot.press(*"look at @pars")
        menu = app.chat.prompt_box.menu
        await wait_for(pilot, lambda: menu.display, what="the completion menu")
        await pilot.press("tab", "ctrl+j", *"and explain")
        assert editor.text == "look at @src/parser.py \nand explain"
        await pilot.press("enter")
        await wait_idle(pilot)
        assert server.chat_bodies[-1]["messages"][-1]["content"] == "look at @src/parser.py \nand explain"
        await pilot.press("up")
        assert editor.text == "look at @src/parser.py \nand explain"
        await pilot.press("up", "up")  # the cursor climbs the two-line entry first, then the history moves
        assert editor.text == "first"
        await pilot.press("down", "down")
        assert editor.text == ""


async def test_slash_completion_mode_command_and_unknown_command(server, workspace, make_app):
    (workspace / "a.txt").write_text("one\n")
    server.push(reply(tool_calls=[call("edit_file", path="a.txt", edits=[{"old_text": "one", "new_text": "two"}])]),
                reply("done"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.controller.ready.is_set, what="the connection")
        await pilot.press(*"/mo")
        await wait_for(pilot, lambda: app.chat.prompt_box.menu.display, what="the menu")
        await pilot.press("down", "tab")  # /mode is below /model
        assert app.chat.prompt_input.text == "/mode "
        await pilot.press(*"auto-e", "tab", "enter")
        await wait_for(pilot, lambda: app.chat.status_bar.mode == "auto-edit", what="the mode")
        await send(pilot, "edit it")
        await wait_idle(pilot)
        assert not app.chat.prompt_area.query(DiffReview)  # auto-edit applies without a review
        await pilot.press(*"/resum", "escape", "enter")
        await wait_for(pilot, lambda: app._notifications, what="the warning")
        assert "did you mean /resume" in list(app._notifications)[0].message
    assert (workspace / "a.txt").read_text() == "two\n"


async def test_palette_lists_every_action_help_lists_keys_and_model_picker(server, make_app):
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.controller.ready.is_set, what="the connection")
        titles = [c.title for c in app.get_system_commands(app.screen) if isinstance(c, SystemCommand)]
        assert {c.usage for c in COMMANDS} <= set(titles) and "Cancel the running turn" in titles
        await pilot.press("f1")
        help_screen = await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen)
        text = str(help_screen.query_one("#help-text").render())
        for line in ("accept the current hunk", "allow always", "cancel the running turn", "/compact"):
            assert line in text
        await pilot.press("escape")
        await pilot.press(*"/model", "enter")
        picker = await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen) and app.screen)
        assert picker.option_list.get_option_at_index(0).id == "scripted-model"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.chat.status_bar.model == "scripted-model", what="the model")


async def palette_run(pilot, app, title: str) -> None:
    """Open the command palette, search for `title`, and run the first match (it must be that command)."""
    from textual.command import CommandList, CommandPalette

    await pilot.press("ctrl+p")
    palette = await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette) and app.screen)
    await pilot.press(*title)
    commands = palette.query_one(CommandList)
    await wait_for(pilot, lambda: commands.option_count and title in str(commands.get_option_at_index(0).prompt),
                   what=f"{title!r} first in the palette")
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette), what="the palette to close")


async def test_palette_offers_the_waiting_prompts_keys(server, workspace, make_app):
    from tests.ui.test_edit_review import SOURCE, TWO_HUNKS

    (workspace / "app.py").write_text(SOURCE)
    server.push(reply(tool_calls=[call("edit_file", path="app.py", edits=TWO_HUNKS)]),
                reply(tool_calls=[call("run_shell", command="touch made.txt")]), reply("done"))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "rename and touch")
        review = await wait_for_prompt(pilot, DiffReview)
        titles = {c.title: c.help for c in app.get_system_commands(app.screen) if isinstance(c, SystemCommand)}
        for key in ("Accept hunk (y)", "Reject hunk (n)", "Accept all (A)", "Reject all (R)",
                    "Unified / side by side (v)", "Open in $EDITOR (e)"):
            assert titles[key] == "answer the diff review"
        await palette_run(pilot, app, "Accept hunk (y)")
        assert review.current == 1 and app.focused is review  # the answer went to the prompt, which keeps focus
        await palette_run(pilot, app, "Reject hunk (n)")
        await pilot.press(*"keep line 25", "enter")  # the reason field the palette's action opened
        shell = await wait_for_prompt(pilot, ShellPrompt)
        titles = [c.title for c in app.get_system_commands(app.screen) if isinstance(c, SystemCommand)]
        assert {"Allow once (y)", "Allow always (a)", "Deny (n)"} <= set(titles) and "Accept hunk (y)" not in titles
        await palette_run(pilot, app, "Allow once (y)")
        await wait_idle(pilot)
        assert shell.is_answered and not app.chat.prompt_area.children
        titles = [c.title for c in app.get_system_commands(app.screen) if isinstance(c, SystemCommand)]
        assert "Allow once (y)" not in titles  # no prompt waits: no prompt keys
    assert (workspace / "app.py").read_text() == SOURCE.replace("line 2\n", "line two\n")
    assert (workspace / "made.txt").exists()
