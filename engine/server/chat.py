"""POST /v1/chat/completions: render the conversation, generate, answer as one object or as a stream of chunks."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.server.generation import Finished, TextChunk
from engine.server.handling import check_fits, events, failure_body, read_json, server_state, submit
from engine.server.loader import LoadedModel
from engine.server.prompts import Prompt, chat_prompt
from engine.server.responses import ChatChunks, ChatOutput, chat_completion, chat_logprobs, sse, usage
from engine.server.schemas import ChatRequest, RequestError, parse_chat_request
from engine.server.streaming import Channel, ErrorReply, EventStreamResponse, race_disconnect
from engine.server.textstream import TokenLogprob
from engine.server.worker import EngineWorker, Job, JobFailed
from engine.text.chat import ChatTemplateError, prompt_opens_reasoning
from engine.text.tokenizer import Tokenizer


@dataclass(slots=True)
class ChatPiece:
    """Deltas of one engine event, the logprobs that go with them, and the end of the reply when it comes."""

    deltas: list[dict] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None
    finish_reason: str | None = None
    failed: JobFailed | None = None
    reasoning_tokens: int | None = None  # with `finished`: how many tokens the reasoning text takes


def render(model: LoadedModel, request: ChatRequest) -> Prompt:
    """The prompt for a chat request (runs in a worker thread: templates and tokenizing take time)."""
    if request.tools and not model.template.supports_tools:
        # rendering would drop the schemas without a word; say so instead
        raise RequestError("this model's chat template does not render tools, so the model would never see them",
                           "tools")
    try:
        return chat_prompt(model.template, model.tokenizer, request.messages, request.tools,
                           request.template_kwargs)
    except (ChatTemplateError, ValueError) as exc:
        raise RequestError(f"the messages could not be rendered: {exc}", "messages") from None


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    """Tokens `text` encodes to (for reasoning_tokens: the generated ids are not kept split by part)."""
    return len(tokenizer.encode(text, parse_special=False)) if text else 0


async def chat_pieces(channel: Channel, output: ChatOutput, request: ChatRequest, worker: EngineWorker,
                      job: Job, tokenizer: Tokenizer) -> AsyncIterator[ChatPiece]:
    """The job's events as chat deltas. Without parallel tool calls, generation stops after the first call."""
    is_cut = False
    async for event in events(channel):
        if isinstance(event, JobFailed):
            yield ChatPiece(failed=event)
        elif isinstance(event, TextChunk):
            if is_cut:
                continue
            yield ChatPiece(output.feed(event.text), event.logprobs)
            if output.tool_calls and not request.parallel_tool_calls:
                is_cut = True
                worker.cancel(job)  # the one call is complete: nothing after it is wanted
        else:
            deltas = [] if is_cut else output.finish()
            reason = "tool_calls" if is_cut else output.finish_reason(event)
            num_reasoning = await anyio.to_thread.run_sync(count_tokens, tokenizer, output.reasoning)
            yield ChatPiece(deltas, finished=event, finish_reason=reason, reasoning_tokens=num_reasoning)


async def chat_completions(request: Request) -> Response:
    """Chat completion, streamed (SSE) or whole."""
    state = server_state(request)
    model, worker = state.ready_model()
    chat = parse_chat_request(await read_json(request), model.backend.vocab_size)
    prompt = await anyio.to_thread.run_sync(render, model, chat)
    check_fits(prompt, model)
    job, channel = submit(worker, prompt, chat.options)
    output = ChatOutput(chat.tools, prompt_opens_reasoning(prompt.text))
    name = chat.model or model.model_id
    pieces = chat_pieces(channel, output, chat, worker, job, model.tokenizer)
    if chat.stream:
        return EventStreamResponse(stream_chat(pieces, chat, ChatChunks(name)), lambda: worker.cancel(job))
    result = await race_disconnect(request.receive, collect(pieces), lambda: worker.cancel(job))
    if result is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    if isinstance(result, JobFailed):
        return JSONResponse(failure_body(result), result.status)
    last, logprobs = result
    assert last.finished is not None and last.finish_reason is not None
    body = chat_completion(name, output, last.finished, last.finish_reason,
                           logprobs if chat.options.logprobs is not None else None, last.reasoning_tokens)
    return JSONResponse(body)


async def collect(pieces: AsyncIterator[ChatPiece]) -> tuple[ChatPiece, list[TokenLogprob]] | JobFailed:
    """Run a reply to its end (ChatOutput accumulates the message); the last piece and every logprob."""
    logprobs: list[TokenLogprob] = []
    async for piece in pieces:
        if piece.failed is not None:
            return piece.failed
        logprobs.extend(piece.logprobs)
        if piece.finished is not None:
            return piece, logprobs
    raise AssertionError("a job always ends with Finished or JobFailed")


async def stream_chat(pieces: AsyncIterator[ChatPiece], chat: ChatRequest,
                      chunks: ChatChunks) -> AsyncGenerator[bytes | ErrorReply, None]:
    """SSE chunks: the role, content / reasoning / tool-call deltas, the finish with timings, usage, [DONE]."""
    has_started, held = False, []  # held: logprobs waiting for a delta to ride on
    wants_logprobs = chat.options.logprobs is not None
    async for piece in pieces:
        if piece.failed is not None:
            if not has_started:
                yield ErrorReply(piece.failed.status, failure_body(piece.failed))
            else:  # the status line is gone: report in-band, as llama.cpp does
                yield sse(failure_body(piece.failed))
            return
        if not has_started:
            has_started = True
            yield sse(chunks.chunk({"role": "assistant", "content": ""}))
        held.extend(piece.logprobs)
        for delta in piece.deltas:
            logprobs = chat_logprobs(held) if wants_logprobs and held else None
            held = [] if logprobs else held
            yield sse(chunks.chunk(delta, logprobs=logprobs))
        if piece.finished is not None:
            logprobs = chat_logprobs(held) if wants_logprobs and held else None
            yield sse(chunks.chunk({}, piece.finish_reason, logprobs=logprobs, timings=piece.finished.timings()))
            if chat.include_usage:
                yield sse(chunks.chunk(None, usage=usage(piece.finished, piece.reasoning_tokens)))
            yield sse("[DONE]")
            return
