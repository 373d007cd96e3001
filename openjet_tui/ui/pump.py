"""Coalescing agent events into per-frame batches.

The agent emits one event per streamed token. Drawing each would make a 1,000 tok/s stream cost 1,000 layouts a
second and starve keystrokes; instead events wait here and are delivered together at most `FRAME_S` apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from openjet_tui.agent.events import Event

FRAME_S = 1 / 30


class EventPump:
    """Queues events and delivers them in order, in batches, never two deliveries at once."""

    def __init__(self, deliver: Callable[[list[Event]], Awaitable[None]], *, frame_s: float = FRAME_S,
                 on_error: Callable[[BaseException], None] | None = None):
        self.deliver, self.frame_s, self.on_error = deliver, frame_s, on_error
        self.pending: list[Event] = []
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
            try:
                await self.deliver(batch)
            except Exception as exc:  # a drawing bug must not lose the events after it, nor stop the agent
                if self.on_error is None:
                    raise
                self.on_error(exc)

    async def close(self) -> None:
        """Deliver what is left and stop scheduling."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()
        for task in list(self._tasks):
            await task
