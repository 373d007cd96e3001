"""Coalescing agent events into frames.

The agent emits one event per streamed token. Drawing each would make a 1,000 tok/s stream cost 1,000 layouts a
second and starve keystrokes; instead events wait here and are drawn together, one batch per frame. The frame
adapts: a batch that took long to draw (a big reply, a slow or busy machine) stretches the wait before the next,
up to MAX_FRAME_S, so drawing never takes more than about half the time and typing stays immediate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from openjet_tui.agent.events import Event

MIN_FRAME_S = 0.05  # 20 frames a second when drawing is cheap
MAX_FRAME_S = 0.2  # at worst 5 frames a second: text still visibly streams
DRAW_SHARE = 0.4  # the most of the time drawing may take


class EventPump:
    """Queues events and delivers them in order, in batches, never two deliveries at once."""

    def __init__(self, deliver: Callable[[list[Event]], Awaitable[None]], *,
                 settle: Callable[[], Awaitable[None]] | None = None,
                 on_error: Callable[[BaseException], None] | None = None):
        self.deliver, self.settle, self.on_error = deliver, settle, on_error
        self.pending: list[Event] = []
        self.frame_s = MIN_FRAME_S
        self.num_batches = 0
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def push(self, event: Event) -> None:
        """Queue an event; a delivery is scheduled within one frame."""
        self.pending.append(event)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.frame_s, self._start_flush)

    def _start_flush(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Deliver everything queued so far (approval prompts call this so earlier output shows first)."""
        async with self._lock:
            if not self.pending:
                return
            batch, self.pending = self.pending, []
            self.num_batches += 1
            started = time.monotonic()
            try:
                await self.deliver(batch)
                if self.settle is not None:
                    await self.settle()  # until the batch is on screen: layout and rendering count too
            except Exception as exc:  # a drawing bug must not lose the events after it, nor stop the agent
                if self.on_error is None:
                    raise
                self.on_error(exc)
            cost = time.monotonic() - started
            self.frame_s = min(MAX_FRAME_S, max(MIN_FRAME_S, cost / DRAW_SHARE - cost))

    async def close(self) -> None:
        """Deliver what is left and stop scheduling."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()
        for task in list(self._tasks):
            await task
