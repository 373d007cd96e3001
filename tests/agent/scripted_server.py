"""A scripted OpenAI-compatible server on loopback: a test double for the *model* only.

It serves real SSE over real HTTP from a queue of scripted replies and records every request, so the agent core,
the UI (Pilot tests) and benchmarks can all drive the real client against it:

    with ScriptedServer([reply(tool_calls=[call("read_file", path="a.py")]), reply("done")]) as server:
        ... point a client at server.base_url ...
        assert server.chat_bodies[1]["messages"][-1]["role"] == "tool"

A reply may also be a callable taking the request body and returning a ScriptedReply. Set `metrics` (for example
to `openjet_metrics(...)`) and GET /metrics serves it as Prometheus text; without it /metrics is a 404.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ScriptedReply:
    """One model reply and how to deliver it."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # [{"name": ..., "arguments": {...}}]
    usage: dict[str, int] | None = None  # default: counted from the request and reply sizes
    timings: dict[str, Any] | None = None
    chunk_chars: int = 7  # content is cut into chunks this long: many small SSE events, like a real server
    delay_s: float = 0.0  # pause between chunks
    hang_after_chunks: int | None = None  # stop sending after N chunks and hold the connection open
    pause_after_chunks: int | None = None  # after N chunks, wait for the server's `resume` event, then go on
    status: int = 200
    error: str | None = None  # error message sent with a status >= 400
    as_json: bool = False  # answer with one JSON object instead of SSE (a server that ignores `stream`)


def reply(text: str = "", **kwargs: Any) -> ScriptedReply:
    """Shorthand for ScriptedReply."""
    return ScriptedReply(text=text, **kwargs)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """One tool call for ScriptedReply.tool_calls."""
    return {"name": name, "arguments": arguments}


@dataclass
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    num_bytes: int


Script = ScriptedReply | Callable[[dict[str, Any]], ScriptedReply]


class ScriptedServer:
    """Serves /v1/chat/completions from a reply queue, plus /v1/models, /props, /tokenize, /health and /metrics."""

    def __init__(self, replies: Iterable[Script] = (), *, model: str = "scripted-model",
                 context_window: int | None = None, supports_tools: bool | None = None,
                 tokenize: bool = False, model_fields: dict[str, Any] | None = None,
                 ollama_show: dict[str, Any] | None = None, host: str = "127.0.0.1"):
        self.model, self.context_window, self.supports_tools = model, context_window, supports_tools
        self.tokenize = tokenize
        self.model_fields = model_fields or {}  # extra /v1/models entry fields, e.g. vLLM's max_model_len
        self.ollama_show = ollama_show  # the answer to Ollama's POST /api/show
        self.metrics: str | None = None  # the Prometheus text GET /metrics serves (None: 404, as llama-server)
        self.replies: deque[Script] = deque(replies)
        self.requests: list[RecordedRequest] = []
        self.disconnects = 0  # streams the client closed before the reply ended
        self.release = threading.Event()  # set to free hanging replies
        self.resume = threading.Event()  # set to let paused replies go on
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), name="scripted-server",
                                        daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, ending in /v1."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ScriptedServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Free hanging replies and stop serving."""
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def push(self, *replies: Script) -> None:
        """Queue more replies."""
        with self._lock:
            self.replies.extend(replies)

    @property
    def chat_bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of every chat request, in order."""
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    def wait_for_chat_requests(self, count: int, timeout_s: float = 10.0) -> None:
        """Block until `count` chat requests arrived (or fail the test)."""
        deadline = time.monotonic() + timeout_s
        while len(self.chat_bodies) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {count} chat requests, got {len(self.chat_bodies)}")
            time.sleep(0.01)

    def next_reply(self, body: dict[str, Any]) -> ScriptedReply:
        """Pop the next scripted reply (an error reply when the script ran out)."""
        with self._lock:
            script = self.replies.popleft() if self.replies else None
        if script is None:
            return ScriptedReply(status=500, error="scripted server: no reply queued for this request")
        return script(body) if callable(script) else script

    def record(self, request: RecordedRequest) -> None:
        """Keep a request (thread-safe)."""
        with self._lock:
            self.requests.append(request)

    def info_document(self, path: str) -> Any:
        """The JSON for the informational GET endpoints, or None for an unknown path."""
        if path.endswith("/models"):
            entry: dict[str, Any] = {"id": self.model, "object": "model", "owned_by": "scripted",
                                     **self.model_fields}
            if self.context_window:
                entry["meta"] = {"n_ctx": self.context_window}
            return {"object": "list", "data": [entry]}
        if path == "/props" and (self.context_window or self.supports_tools is not None):
            props: dict[str, Any] = {"default_generation_settings": {"n_ctx": self.context_window or 0}}
            if self.supports_tools is not None:
                props["chat_template_caps"] = {"supports_tool_calls": self.supports_tools}
            return props
        if path == "/health":
            return {"status": "ok"}
        return None


def sse_chunks(script: ScriptedReply, model: str, prompt_chars: int) -> list[dict[str, Any]]:
    """The chunk objects of one streamed reply: reasoning, content, tool-call fragments, finish, usage."""
    base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    size = max(1, script.chunk_chars)
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": script.reasoning[i:i + size]})
               for i in range(0, len(script.reasoning), size)]
    chunks += [chunk({"content": script.text[i:i + size]}) for i in range(0, len(script.text), size)]
    for index, tool_call in enumerate(script.tool_calls):
        arguments = json.dumps(tool_call["arguments"])
        chunks.append(chunk({"tool_calls": [{"index": index, "id": f"call_{index}_{int(time.time_ns()) % 10**8}",
                                             "type": "function",
                                             "function": {"name": tool_call["name"], "arguments": ""}}]}))
        chunks += [chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[i:i + size]}}]})
                   for i in range(0, len(arguments), size)]
    chunks.append(chunk({}, "tool_calls" if script.tool_calls else "stop"))
    completion = max(1, (len(script.text) + len(script.reasoning)) // 4)
    usage = script.usage or {"prompt_tokens": max(1, prompt_chars // 4), "completion_tokens": completion,
                             "total_tokens": max(1, prompt_chars // 4) + completion}
    final = {**base, "choices": [], "usage": usage}
    if script.timings:
        final["timings"] = script.timings
    chunks.append(final)
    return chunks


class _Handler(BaseHTTPRequestHandler):
    """Routes requests to the scripted server named by the subclass `_handler_for` makes."""

    scripted: ScriptedServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        """Informational endpoints: /v1/models, /props, /health, /metrics."""
        self.scripted.record(RecordedRequest("GET", self.path, dict(self.headers), None, 0))
        if self.path == "/metrics" and self.scripted.metrics is not None:
            self._text(200, self.scripted.metrics, "text/plain; version=0.0.4; charset=utf-8")
            return
        document = self.scripted.info_document(self.path)
        self._json(404 if document is None else 200, document or {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        """Chat completions from the script, and /tokenize."""
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.loads(raw or b"{}")
        self.scripted.record(RecordedRequest("POST", self.path, dict(self.headers), body, len(raw)))
        if self.path == "/api/show" and self.scripted.ollama_show is not None:
            self._json(200, self.scripted.ollama_show)
        elif self.path == "/tokenize" and self.scripted.tokenize:
            self._json(200, {"tokens": list(range(len(body.get("content", "")) // 4))})
        elif self.path.endswith("/chat/completions"):
            self._chat(body, len(raw))
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def _json(self, status: int, document: Any) -> None:
        self._text(status, json.dumps(document), "application/json")

    def _text(self, status: int, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chat(self, body: dict[str, Any], num_bytes: int) -> None:
        script = self.scripted.next_reply(body)
        if script.status >= 400:
            self._json(script.status, {"error": {"message": script.error or "error", "code": script.status}})
            return
        chunks = sse_chunks(script, self.scripted.model, num_bytes)
        if script.as_json:
            self._json(200, _as_completion(chunks))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            self._stream(script, chunks)
        except (BrokenPipeError, ConnectionResetError):
            self.scripted.disconnects += 1

    def _stream(self, script: ScriptedReply, chunks: list[dict[str, Any]]) -> None:
        started = time.monotonic()
        for number, item in enumerate(chunks):
            if script.hang_after_chunks is not None and number >= script.hang_after_chunks:
                while not self.scripted.release.wait(0.05):  # keep-alive comments reveal a closed client
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                return
            if number == script.pause_after_chunks:
                while not self.scripted.resume.wait(0.05) and not self.scripted.release.is_set():
                    pass
                started = time.monotonic()  # the schedule starts again after the pause
            self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
            self.wfile.flush()
            if script.delay_s:  # on a schedule, not a pause per chunk: the rate holds whatever a write costs
                time.sleep(max(0.0, started + (number + 1) * script.delay_s - time.monotonic()))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def openjet_metrics(*, decode_tps: float = 0.0, prefill_tps: float = 0.0, generated: int = 0, drafted: int = 0,
                    accepted: int = 0, acceptance_length: float = 0.0, context_tokens: int = 0,
                    context_size: int = 0, backend: str = "cuda", backend_reason: str = "",
                    model: str = "scripted-model") -> str:
    """A /metrics page exactly as openjet-engine renders one (its own registry, names and format)."""
    from engine.server.metrics import ServerMetrics

    metrics = ServerMetrics()
    metrics.decode_rate.set(decode_tps)
    metrics.prefill_rate.set(prefill_tps)
    metrics.generated_tokens.inc(generated)
    metrics.draft_tokens.inc(drafted)
    metrics.accepted_tokens.inc(accepted)
    metrics.acceptance_length.set(acceptance_length)
    metrics.context_tokens.set(context_tokens)
    metrics.context_size.set(context_size)
    metrics.backend.info({"backend": backend, "backend_reason": backend_reason, "model": model})
    return metrics.render().decode()


def _handler_for(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    """A handler class bound to one scripted server."""
    return type("Handler", (_Handler,), {"scripted": server})


def _as_completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold the chunks of a reply into one non-streaming chat.completion object."""
    content, calls, finish, usage = "", [], "stop", None
    for item in chunks:
        usage = item.get("usage", usage)
        for choice in item["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for fragment in delta.get("tool_calls") or []:
                if "id" in fragment:
                    calls.append({"id": fragment["id"], "type": "function",
                                  "function": {"name": fragment["function"]["name"], "arguments": ""}})
                calls[fragment["index"]]["function"]["arguments"] += fragment["function"].get("arguments", "")
            finish = choice["finish_reason"] or finish
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage}
