"""POST /v1/completions: OpenAI's legacy text completion of a raw prompt (text or token ids)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.server.generation import Finished, TextChunk
from engine.server.handling import check_fits, events, failure_body, read_json, server_state, submit
from engine.server.prompts import text_prompt
from engine.server.responses import completion_chunk, completion_logprobs, new_id, sse, usage
from engine.server.schemas import CompletionRequest, parse_completion_request
from engine.server.streaming import ErrorReply, EventStreamResponse, race_disconnect
from engine.server.textstream import TokenLogprob
from engine.server.worker import JobFailed


async def completions(request: Request) -> Response:
    """Text completion, streamed (SSE) or whole."""
    state = server_state(request)
    model, worker = state.ready_model()
    completion = parse_completion_request(await read_json(request), model.backend.vocab_size)
    prompt = await anyio.to_thread.run_sync(text_prompt, model.tokenizer, completion.prompt)
    check_fits(prompt, model)
    job, channel = submit(worker, prompt, completion.options)
    name, response_id, created = completion.model or model.model_id, new_id("cmpl"), int(time.time())
    echo = prompt.text if completion.echo else ""
    if completion.stream:
        stream = stream_completion(events(channel), completion, echo, (response_id, name, created))
        return EventStreamResponse(stream, lambda: worker.cancel(job))
    result = await race_disconnect(request.receive, collect(events(channel)), lambda: worker.cancel(job))
    if result is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    if isinstance(result, JobFailed):
        return JSONResponse(failure_body(result), result.status)
    text, logprobs, finished = result
    lp = completion_logprobs(logprobs, len(echo)) if completion.options.logprobs is not None else None
    body = completion_chunk(response_id, name, created, echo + text, finished.finish_reason, lp,
                            usage=usage(finished), timings=finished.timings())
    return JSONResponse(body)


async def collect(stream: AsyncIterator[Any]) -> tuple[str, list[TokenLogprob], Finished] | JobFailed:
    """The whole generated text, its logprobs and the Finished event (or the failure)."""
    text, logprobs = "", []
    async for event in stream:
        if isinstance(event, JobFailed):
            return event
        if isinstance(event, TextChunk):
            text += event.text
            logprobs.extend(event.logprobs)
        else:
            return text, logprobs, event
    raise AssertionError("a job always ends with Finished or JobFailed")


async def stream_completion(stream: AsyncIterator[Any], completion: CompletionRequest, echo: str,
                            ident: tuple[str, str, int]) -> AsyncGenerator[bytes | ErrorReply, None]:
    """SSE text_completion pieces (the echoed prompt first), the finish with timings, usage, [DONE]."""
    response_id, name, created = ident
    offset, has_started = len(echo), False
    wants_logprobs = completion.options.logprobs is not None
    async for event in stream:
        if isinstance(event, JobFailed):
            yield ErrorReply(event.status, failure_body(event)) if not has_started else sse(failure_body(event))
            return
        if not has_started:
            has_started = True
            if echo:
                yield sse(completion_chunk(response_id, name, created, echo, None))
        if isinstance(event, TextChunk):
            lp = completion_logprobs(event.logprobs, offset) if wants_logprobs else None
            offset += len(event.text)
            yield sse(completion_chunk(response_id, name, created, event.text, None, lp))
            continue
        yield sse(completion_chunk(response_id, name, created, "", event.finish_reason, timings=event.timings()))
        if completion.include_usage:
            yield sse({"id": response_id, "object": "text_completion", "created": created, "model": name,
                       "choices": [], "usage": usage(event)})
        yield sse("[DONE]")
        return
