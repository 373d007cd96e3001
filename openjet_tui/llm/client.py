"""OpenAI-compatible chat over httpx: streaming, retries with backoff, cancellation, traffic recording."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from openjet_tui.errors import (ContextWindowError, LLMConnectionError, LLMResponseError, ProviderError,
                                ServerCapabilityError)
from openjet_tui.llm.network import GuardedTransport, NetworkGuard, TrafficLog, TrafficRecord
from openjet_tui.llm.providers import Endpoint
from openjet_tui.llm.stream import ReplyBuilder, SSEDecoder, parse_event
from openjet_tui.llm.textcalls import extract_text_tool_calls
from openjet_tui.llm.types import ChatResult, StreamPart

RETRY_STATUSES = frozenset({429, 502, 503, 504})  # busy, loading the model, or a proxy in between
RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
                httpx.PoolTimeout)
_TOOL_HINTS = ("tools param requires", "does not support tools", "tool calls are not supported",
               "tools are not supported", "tool_choice", "function calling is not")
_CONTEXT_HINTS = ("exceed_context_size", "exceeds the available context", "maximum context length",
                  "context length", "context window", "too many tokens", "prompt is too long")


@dataclass(slots=True)
class RetryPolicy:
    """How often and how patiently to retry a request that could not connect."""

    attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0

    def delay(self, attempt: int) -> float:
        """Exponential backoff: base, 2 x base, 4 x base ... capped."""
        return min(self.max_delay_s, self.base_delay_s * (2 ** attempt))


class ChatClient:
    """Streams chat completions from one endpoint; one instance per endpoint, shared by every turn."""

    def __init__(self, endpoint: Endpoint, *, guard: NetworkGuard | None = None, traffic: TrafficLog | None = None,
                 retry: RetryPolicy | None = None, timeout_s: float = 600.0,
                 sampling: dict[str, Any] | None = None, transport: httpx.AsyncBaseTransport | None = None):
        self.endpoint = endpoint
        self.guard = guard or NetworkGuard()
        self.traffic = traffic
        self.retry = retry or RetryPolicy()
        self.sampling = dict(sampling or {})
        timeout = httpx.Timeout(timeout_s, connect=10.0)
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        # trust_env off when airgapped: a proxy from the environment would be a non-loopback hop
        self._http = httpx.AsyncClient(transport=GuardedTransport(self.guard, transport), timeout=timeout,
                                       headers=headers, trust_env=not self.guard.airgapped)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                       on_part: Callable[[StreamPart], None] | None = None) -> ChatResult:
        """Stream a reply, passing each delta to on_part, and return the finished result."""
        result: ChatResult | None = None
        async for part in self.stream(messages, tools):  # run to the end so the traffic record is written now
            if isinstance(part, ChatResult):
                result = part
            elif on_part is not None:
                on_part(part)
        if result is None:
            raise LLMResponseError(f"{self.endpoint.base_url}: the stream ended without a reply")
        return result

    async def stream(self, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None = None) -> AsyncIterator[StreamPart]:
        """Yield content and reasoning deltas as they arrive, then one ChatResult. Cancel the task to stop."""
        body: dict[str, Any] = {"model": self.endpoint.model or "default", "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}, **self.sampling}
        if tools:
            body["tools"] = tools
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        record = TrafficRecord(self.endpoint.base_url + "/chat/completions", len(payload), 0, len(messages))
        builder = ReplyBuilder()
        try:
            response = await self._send(payload, record)
            try:
                async for part in self._read(response, builder, record):
                    yield part
            finally:
                record.response_bytes = response.num_bytes_downloaded
                await response.aclose()
            tail, result = builder.finish()
            for part in tail:
                yield part
            yield _with_text_calls(result, tools)
        except (LLMResponseError, LLMConnectionError, ProviderError) as exc:
            record.error = str(exc)
            raise
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        finally:
            if builder.result.usage is not None:
                record.prompt_tokens = builder.result.usage.prompt_tokens
                record.completion_tokens = builder.result.usage.completion_tokens
            if self.traffic is not None and record.status is not None:  # refused or unreachable: nothing sent
                self.traffic.add(record)

    async def _send(self, payload: bytes, record: TrafficRecord) -> httpx.Response:
        """POST with retries on connection failures and busy statuses; returns an open streaming response."""
        url = self.endpoint.base_url + "/chat/completions"
        last: str = ""
        for attempt in range(self.retry.attempts):
            if attempt:
                await asyncio.sleep(self.retry.delay(attempt - 1))
            request = self._http.build_request("POST", url, content=payload,
                                               headers={"Content-Type": "application/json"})
            try:
                response = await self._http.send(request, stream=True)
            except RETRY_ERRORS as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            record.status = response.status_code
            if response.status_code < 400:
                return response
            text = (await response.aread()).decode("utf-8", errors="replace")
            await response.aclose()
            if response.status_code in RETRY_STATUSES and attempt + 1 < self.retry.attempts:
                last = f"HTTP {response.status_code}"
                if self.traffic is not None:  # this attempt reached the server: it counts as a request sent
                    self.traffic.add(dataclasses.replace(record, response_bytes=response.num_bytes_downloaded,
                                                         error=last))
                continue
            raise _status_error(self.endpoint, response.status_code, text)
        raise LLMConnectionError(f"cannot reach {self.endpoint.provider} at {self.endpoint.base_url} after "
                                 f"{self.retry.attempts} attempts ({last}); is the server running?")

    async def _read(self, response: httpx.Response, builder: ReplyBuilder,
                    record: TrafficRecord) -> AsyncIterator[StreamPart]:
        """Decode the body: SSE normally, or one JSON object from a server that ignored `stream`."""
        if "application/json" in response.headers.get("content-type", ""):
            data = json.loads(await response.aread())
            for part in builder.feed_chunk(data):
                yield part
            return
        decoder = SSEDecoder()
        try:
            async for chunk in response.aiter_bytes():
                for data in decoder.feed(chunk):
                    event = parse_event(data)
                    if event is None:
                        return
                    for part in builder.feed_chunk(event):
                        yield part
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout) as exc:
            raise LLMConnectionError(f"connection to {self.endpoint.base_url} dropped mid-reply after "
                                     f"{response.num_bytes_downloaded} bytes ({type(exc).__name__})") from exc
        for data in decoder.close():
            event = parse_event(data)
            if event is not None:
                for part in builder.feed_chunk(event):
                    yield part

    async def get_json(self, url: str, timeout_s: float = 10.0) -> Any:
        """GET a JSON document (used by probing); raises LLMResponseError on an error status."""
        response = await self._http.get(url, timeout=timeout_s)
        if response.status_code >= 400:
            raise LLMResponseError(f"GET {url}: HTTP {response.status_code}", response.status_code)
        return response.json()

    async def post_json(self, url: str, body: dict[str, Any], timeout_s: float = 10.0) -> Any:
        """POST JSON and return the JSON answer (used by probing)."""
        response = await self._http.post(url, json=body, timeout=timeout_s)
        if response.status_code >= 400:
            raise LLMResponseError(f"POST {url}: HTTP {response.status_code}", response.status_code)
        return response.json()


def _with_text_calls(result: ChatResult, tools: list[dict[str, Any]] | None) -> ChatResult:
    """Recognise tool calls the server passed on as plain content."""
    if tools and not result.tool_calls and result.content:
        remaining, calls = extract_text_tool_calls(result.content, tools)
        if calls:
            result.content, result.tool_calls, result.finish_reason = remaining, calls, "tool_calls"
    return result


def _status_error(endpoint: Endpoint, status: int, text: str) -> Exception:
    """Map an error status to the error a person can act on."""
    try:
        detail = json.loads(text).get("error", text)
        detail = detail.get("message", detail) if isinstance(detail, dict) else detail
    except (json.JSONDecodeError, AttributeError):
        detail = text
    detail = str(detail).strip()[:500]
    where = f"{endpoint.provider} at {endpoint.base_url}"
    lowered = detail.lower()
    if any(hint in lowered for hint in _TOOL_HINTS):
        return ServerCapabilityError(f"{where} cannot do tool calls: {detail}. For llama-server start it with "
                                     "--jinja; otherwise pick a model whose chat template supports tools.")
    if any(hint in lowered for hint in _CONTEXT_HINTS):
        return ContextWindowError(f"{where}: the conversation does not fit the model's context window: {detail}")
    if status in (401, 403):
        return ProviderError(f"{where} rejected the request (HTTP {status}): check the API key for "
                             f"{endpoint.provider} ({endpoint.key_source or 'no key was found'})")
    return LLMResponseError(f"{where} answered HTTP {status}: {detail}", status)
