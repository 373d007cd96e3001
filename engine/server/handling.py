"""What every generating endpoint does before and around generation: read the body, check the prompt fits, queue
the job, and read its events back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from engine.errors import ContextOverflowError
from engine.server.generation import Event, Finished, GenerationJob
from engine.server.loader import LoadedModel
from engine.server.prompts import Prompt
from engine.server.schemas import GenerationOptions, RequestError
from engine.server.state import ServerState
from engine.server.streaming import Channel
from engine.server.worker import EngineWorker, Job, JobFailed, QueueFull


async def read_json(request: Request) -> Any:
    """The parsed JSON body, or a 400 saying why it is not JSON."""
    body = await request.body()
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None


def server_state(request: Request) -> ServerState:
    """The ServerState the app was built with."""
    return request.app.state.server


def check_fits(prompt: Prompt, model: LoadedModel) -> None:
    """400 for an empty prompt or one past the context window (naming both numbers)."""
    if not prompt.ids:
        raise RequestError("the prompt is empty (no tokens)", "prompt")
    context_size = model.backend.context_size
    if len(prompt.ids) > context_size:
        raise RequestError(f"the prompt does not fit: {ContextOverflowError(len(prompt.ids), context_size)}",
                           "messages", code="context_length_exceeded")


def submit(worker: EngineWorker, prompt: Prompt, options: GenerationOptions) -> tuple[Job, Channel]:
    """Queue a generation; 503 with Retry-After when the queue is full."""
    channel = Channel()
    job = Job(GenerationJob(prompt, options), channel.put)
    try:
        worker.submit(job)
    except QueueFull as exc:
        raise RequestError(f"{exc}; retry in {exc.retry_after} s", status=503, error_type="unavailable_error",
                           headers={"Retry-After": str(exc.retry_after)}) from None
    return job, channel


async def events(channel: Channel) -> AsyncIterator[Event | JobFailed]:
    """A job's events up to and including the last one (Finished or JobFailed)."""
    while True:
        event = await channel.get()
        yield event
        if isinstance(event, (Finished, JobFailed)):
            return


def failure_body(failed: JobFailed) -> dict[str, Any]:
    """OpenAI's error shape for a failed job."""
    return RequestError(failed.message, status=failed.status, error_type=failed.error_type).body()
