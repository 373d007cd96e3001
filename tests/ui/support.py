"""Helpers for Pilot tests: waiting for the app to reach a state, and reading what a turn sent the model."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual import events
from textual.pilot import Pilot

from openjet_tui.ui.widgets.prompts import AnswerPrompt


async def wait_for(pilot: Pilot[Any], condition: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Let the app run until `condition()` is truthy; fail the test (naming `what`) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await pilot.pause(0.02)


async def wait_for_prompt(pilot: Pilot[Any], kind: type[AnswerPrompt[Any]]) -> Any:
    """The approval prompt of this kind, once it is shown and focused."""
    app = pilot.app

    def shown() -> Any:
        prompts = list(app.chat.prompt_area.query(kind))  # type: ignore[attr-defined]
        return prompts[0] if prompts and app.focused is prompts[0] else None

    return await wait_for(pilot, shown, what=f"a {kind.__name__}")


async def wait_idle(pilot: Pilot[Any], timeout: float = 10.0) -> None:
    """Until no turn runs and every event is drawn."""
    app = pilot.app
    await wait_for(pilot, lambda: not app.is_busy and not app.pump.pending, timeout,  # type: ignore[attr-defined]
                   "the turn to end")
    await pilot.pause(0.05)


async def send(pilot: Pilot[Any], text: str) -> None:
    """Type a message into the editor and press enter."""
    app = pilot.app
    await wait_for(pilot, lambda: app.controller.ready.is_set(), what="the app to connect")  # type: ignore
    app.chat.prompt_input.focus()  # type: ignore[attr-defined]
    await pilot.press(*text, "enter")


def type_now(app: Any, text: str, enter: bool = True) -> None:
    """Post key events without waiting for the screen to settle (pilot.press would wait out a whole stream)."""
    for char in text:
        app.post_message(events.Key(char, char))
    if enter:
        app.post_message(events.Key("enter", None))


def tool_results(body: dict[str, Any]) -> list[str]:
    """The tool messages of a recorded chat request."""
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]
