"""A transparent HTTP proxy on loopback that records each exchange: what the agent sent a real server, and what the
server answered, byte for byte. It stands in for nothing: every request goes on to the real server unchanged.

    with RecordingProxy("http://127.0.0.1:18080") as proxy:
        ... point the agent at proxy.base_url ...
        first = proxy.chat_exchanges[0]   # .request (parsed JSON) and .response_text (the SSE stream)
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"})


@dataclass(slots=True)
class Exchange:
    """One request the proxy passed on and the server's whole answer."""

    method: str
    path: str
    request: Any  # parsed JSON body, or None
    status: int
    response_text: str


class RecordingProxy:
    """Forwards every request to `upstream` and records it; the answer is sent on once complete."""

    def __init__(self, upstream: str, timeout_s: float = 900.0):
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="recording-proxy", daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL to give the agent."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def chat_exchanges(self) -> list[Exchange]:
        """The chat completion exchanges, in order."""
        return [e for e in self.exchanges if e.path.endswith("/chat/completions")]

    def __enter__(self) -> "RecordingProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._client.close()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict, bytes]:
        """Send one request upstream, record it, and return status, headers and body for the caller."""
        sent = {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS | {"host"}}
        response = self._client.request(method, self.upstream + path, headers=sent, content=body or None)
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        self.exchanges.append(Exchange(method, path, parsed, response.status_code, response.text))
        kept = {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS}
        return response.status_code, kept, response.content

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            """Relays GET and POST through the proxy."""

            protocol_version = "HTTP/1.1"

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, headers, content = proxy.forward(self.command, self.path, dict(self.headers),
                                                         self.rfile.read(length))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = _relay

            def log_message(self, *args: object) -> None:
                """Quiet: the test reads the exchanges instead."""

        return Handler
