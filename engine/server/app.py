"""The OpenAI-compatible HTTP app (starlette): routes, API-key check, errors in OpenAI's shape.

Routes (each also without the /v1 prefix, as llama-server serves them): POST /v1/chat/completions,
POST /v1/completions, GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize.
No handler touches the backend: generation happens on the engine thread (engine.server.worker).
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.server.chat import chat_completions
from engine.server.completions import completions
from engine.server.handling import read_json, server_state
from engine.server.metrics import CONTENT_TYPE
from engine.server.schemas import RequestError, parse_detokenize_request, parse_tokenize_request
from engine.server.state import ServerState

log = logging.getLogger("engine.server")


async def health(request: Request) -> Response:
    """200 when ready; 503 with the load stage and progress while loading; 500 if loading failed."""
    state = server_state(request)
    stage, fraction, error, model = state.load_state.snapshot()
    if error is not None:
        body = RequestError(f"the model failed to load: {error}", status=500, error_type="server_error").body()
        return JSONResponse({"status": "error", **body}, 500)
    if model is None:
        body = RequestError("Loading model", status=503, error_type="unavailable_error").body()
        return JSONResponse({"status": "loading", "stage": stage, "progress": round(fraction, 3), **body}, 503)
    worker = state.worker
    return JSONResponse({
        "status": "ok", "model": model.model_id, "backend": model.backend_name, "backend_reason": model.backend_reason,
        "draft": state.drafter_kind, "context_size": model.backend.context_size,
        "requests_waiting": worker.num_waiting if worker is not None else 0,
    })


async def models(request: Request) -> Response:
    """The one model served, in OpenAI's list shape."""
    state = server_state(request)
    model, _ = state.ready_model()
    entry = {"id": model.model_id, "object": "model", "created": state.created, "owned_by": "openjet",
             "meta": {"n_ctx": model.backend.context_size, "n_vocab": model.backend.vocab_size,
                      "backend": model.backend_name, "draft": state.drafter_kind}}
    return JSONResponse({"object": "list", "data": [entry]})


async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE)


async def tokenize(request: Request) -> Response:
    """llama.cpp's /tokenize: {"content"} -> {"tokens"} (with_pieces: [{"id", "piece"}])."""
    model, _ = server_state(request).ready_model()
    content, add_special, parse_special, with_pieces = parse_tokenize_request(await read_json(request))
    ids = await anyio.to_thread.run_sync(
        lambda: model.tokenizer.encode(content, parse_special=parse_special, add_special=add_special))
    if not with_pieces:
        return JSONResponse({"tokens": ids})
    pieces: list[dict[str, Any]] = []
    for i in ids:
        raw = model.tokenizer.token_bytes(i)
        try:
            pieces.append({"id": i, "piece": raw.decode("utf-8")})
        except UnicodeDecodeError:  # part of a character: give the bytes, as llama.cpp does
            pieces.append({"id": i, "piece": list(raw)})
    return JSONResponse({"tokens": pieces})


async def detokenize(request: Request) -> Response:
    """llama.cpp's /detokenize: {"tokens"} -> {"content"}."""
    model, _ = server_state(request).ready_model()
    ids = parse_detokenize_request(await read_json(request), model.backend.vocab_size)
    return JSONResponse({"content": model.tokenizer.decode(ids)})


class ApiKeyMiddleware:
    """401 for every request without `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app, self._expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the header, then pass the request on."""
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = RequestError("invalid or missing API key (send Authorization: Bearer <key>)", status=401,
                                    error_type="authentication_error", code="invalid_api_key").body()
                await JSONResponse(body, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return JSONResponse(exc.body(), exc.status, exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    body = RequestError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code,
                        error_type=error_type).body()
    return JSONResponse(body, exc.status_code, exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    body = RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, error_type="server_error").body()
    return JSONResponse(body, 500)


def create_app(state: ServerState) -> Starlette:
    """The ASGI app serving state (whose model may still be loading)."""
    routes = []
    for path, endpoint, methods in [
        ("/v1/chat/completions", chat_completions, ["POST"]), ("/v1/completions", completions, ["POST"]),
        ("/v1/models", models, ["GET"]), ("/health", health, ["GET"]), ("/metrics", metrics, ["GET"]),
        ("/tokenize", tokenize, ["POST"]), ("/detokenize", detokenize, ["POST"]),
    ]:
        routes.append(Route(path, endpoint, methods=methods))
        if path.startswith("/v1/"):
            routes.append(Route(path[3:], endpoint, methods=methods))
    app = Starlette(routes=routes, exception_handlers={
        RequestError: _request_error, HTTPException: _http_error, Exception: _server_error})
    app.state.server = state
    if state.config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=state.config.api_key)
    return app
