"""The bridge from the engine thread to a request handler, and the response that streams it.

Channel: the engine thread put()s events, the handler awaits get(); put() hops onto the event loop thread-safely.
EventStreamResponse: waits for the first piece before answering, so a failure before any token still gets its
real status (400, 500) instead of a 200 stream; it listens for the client's disconnect the whole time (also while
the job waits in the queue) and calls on_disconnect at once, which cancels the job within one cycle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send


class Channel:
    """A queue from one producer thread to the event loop that created it."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, item: Any) -> None:
        """Called from any thread."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is shutting down and nobody listens any more
            pass

    async def get(self) -> Any:
        """The next item."""
        return await self._queue.get()


@dataclass(slots=True)
class ErrorReply:
    """A failure before streaming began: answered as a JSON error with this status."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] | None = None


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client disconnects (the request body must already be read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStreamResponse(Response):
    """text/event-stream from an async iterator of bytes whose first item may be an ErrorReply instead."""

    media_type = "text/event-stream"

    def __init__(self, pieces: AsyncGenerator[bytes | ErrorReply, None], on_close: Callable[[], None]):
        # no body and so no Content-Length: the length is unknown until the stream ends
        self.status_code, self.background = 200, None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._pieces, self._on_close = pieces, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream while watching for a disconnect; whichever ends first cancels the other.

        on_close runs as soon as the client is gone and again when streaming ends however it ends (it must be
        idempotent: cancelling a finished job does nothing).
        """
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    """Cancel the stream when the client goes."""
                    await until_disconnect(receive)
                    self._on_close()
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                try:
                    await self._stream(scope, receive, send)
                finally:
                    group.cancel_scope.cancel()
        finally:
            self._on_close()
            with anyio.CancelScope(shield=True):
                await self._pieces.aclose()

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            first = await anext(self._pieces)
        except StopAsyncIteration:
            first = b""
        if isinstance(first, ErrorReply):
            await JSONResponse(first.body, first.status, first.headers)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": first, "more_body": True})
        async for piece in self._pieces:
            assert isinstance(piece, bytes), "only the first piece may be an ErrorReply"
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def race_disconnect(receive: Receive, work: Awaitable[Any], on_disconnect: Callable[[], None]) -> Any:
    """The result of work, or None after calling on_disconnect if the client leaves first."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        if work_task.done():
            return work_task.result()
        on_disconnect()
        return None
    finally:
        for task in (work_task, watch_task):
            if not task.done():
                task.cancel()
