"""SVG snapshots of the main screen, the diff review, the shell prompt and the engine panel, with fixed data.
Update them with `make snapshot-update` after an intended change, and look at the report before committing."""

from __future__ import annotations

from textual.pilot import Pilot

from openjet_tui.ui.widgets.prompt_box import PromptInput
from tests.ui.snapshot_apps.apps import DiffReviewApp, EnginePanelApp, EngineSelectionApp, MainScreenApp, \
    ShellPromptApp

SIZE = (120, 36)


async def settle(pilot: Pilot) -> None:
    """Cursor blink off, then wait until the fixed content is drawn."""
    for editor in pilot.app.query(PromptInput):
        editor.cursor_blink = False
    await pilot.pause(0.3)
    await pilot.wait_for_scheduled_animations()


class TestMainScreen:
    def test_conversation_mid_turn(self, snap_compare):
        assert snap_compare(MainScreenApp(), terminal_size=SIZE, run_before=settle)


class TestApprovals:
    def test_diff_review_first_hunk_accepted(self, snap_compare):
        async def accept_first(pilot: Pilot) -> None:
            await settle(pilot)
            await pilot.press("y")
            await pilot.pause(0.1)

        assert snap_compare(DiffReviewApp(), terminal_size=SIZE, run_before=accept_first)

    def test_diff_review_side_by_side(self, snap_compare):
        async def side_by_side(pilot: Pilot) -> None:
            await settle(pilot)
            await pilot.press("v")
            await pilot.pause(0.1)

        assert snap_compare(DiffReviewApp(), terminal_size=SIZE, run_before=side_by_side)

    def test_shell_prompt(self, snap_compare):
        assert snap_compare(ShellPromptApp(), terminal_size=SIZE, run_before=settle)


class TestEnginePanel:
    def test_engine_panel_with_gpu(self, snap_compare):
        assert snap_compare(EnginePanelApp(), terminal_size=SIZE, run_before=settle)

    def test_engine_selection_with_every_decision(self, snap_compare):
        assert snap_compare(EngineSelectionApp(), terminal_size=(120, 60), run_before=settle)
