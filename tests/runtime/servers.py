"""Real HTTP servers on loopback for download tests: a Hugging Face hub (resolve endpoint with HEAD, GET and Range)
and a PyPI simple index (PEP 691 JSON or PEP 503 HTML) serving wheels. Failures are injected on purpose."""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Behaviour:
    """What the server does: files it holds and the faults it injects."""

    hub_files: dict[str, bytes] = field(default_factory=dict)  # "repo/path" -> bytes
    hub_sizes: dict[str, int] = field(default_factory=dict)  # "repo/path" -> announced size overriding len(bytes)
    wheels: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # project -> (wheel filename, bytes)
    simple_html: bool = False
    ollama_models: list[str] = field(default_factory=list)  # served at /api/tags, as Ollama does
    corrupt_wheel: str | None = None  # this project's wheel is served with a flipped byte (its listed hash unchanged)
    cut_after: int | None = None  # the next GET stops after this many body bytes and drops the connection
    status_after_cut: int | None = None  # every GET after the cut answers this status
    before_body: Callable[[], None] | None = None  # runs once a hub GET is answered, before its body is sent
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, Range header)
    is_cut_done: bool = False


def make_wheel(project: str, version: str, member: str, payload: bytes) -> tuple[str, bytes]:
    """A real wheel (zip) carrying `payload` as `member`."""
    dist = project.replace("-", "_")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{dist}/__init__.py", "")
        archive.writestr(member, payload)
        archive.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {project}\nVersion: {version}\n")
    return f"{dist}-{version}-py3-none-any.whl", buffer.getvalue()


class Handler(BaseHTTPRequestHandler):
    """Dispatches /simple/, /files/ and /{repo}/resolve/{rev}/{path}."""

    protocol_version = "HTTP/1.1"
    behaviour: Behaviour

    def log_message(self, *args: object) -> None:
        """Silence per-request logging."""

    def do_HEAD(self) -> None:
        """Hub metadata request."""
        self._dispatch(head=True)

    def do_GET(self) -> None:
        """Hub file, index page or wheel."""
        self._dispatch(head=False)

    def _dispatch(self, head: bool) -> None:
        b = self.behaviour
        b.requests.append((self.command, self.path, self.headers.get("Range", "")))
        if self.path == "/api/tags":
            body = json.dumps({"models": [{"name": name} for name in b.ollama_models]}).encode()
            return self._send(200, body, {"Content-Type": "application/json"})
        if self.path.startswith("/simple/"):
            return self._index(self.path.split("/")[2])
        if self.path.startswith("/files/"):
            return self._wheel(self.path.split("/")[2], head)
        match = re.match(r"^/(.+?/.+?)/resolve/([^/]+)/(.+)$", self.path)
        if not match:
            return self._send(404, b"", {})
        return self._hub(f"{match.group(1)}/{match.group(3)}", head)

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", headers.get("Content-Length", str(len(body))))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _hub(self, key: str, head: bool) -> None:
        b = self.behaviour
        if key not in b.hub_files:
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})
        data = b.hub_files[key]
        size = b.hub_sizes.get(key, len(data))
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if head:
            return self._send(200, b"", {**headers, "Content-Length": str(size)})
        if b.is_cut_done and b.status_after_cut:
            return self._send(b.status_after_cut, b"", {})
        start = int(re.match(r"bytes=(\d+)-", self.headers.get("Range", "bytes=0-")).group(1))
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        body = data[start:]
        if b.before_body is not None:
            hook, b.before_body = b.before_body, None
            hook()
        if b.cut_after is not None and not b.is_cut_done:
            b.is_cut_done = True  # announce the whole body, send part of it, drop the connection
            self._send(status, body[: b.cut_after], {**headers, "Content-Length": str(len(body))})
            self.wfile.flush()
            self.close_connection = True
            return None
        return self._send(status, body, headers)

    def _index(self, project: str) -> None:
        b = self.behaviour
        if project not in b.wheels:
            return self._send(404, b"not found", {})
        filename, data = b.wheels[project]
        sha = hashlib.sha256(data).hexdigest()
        if b.simple_html:
            page = f'<html><body><a href="../../files/{filename}#sha256={sha}">{filename}</a></body></html>'
            return self._send(200, page.encode(), {"Content-Type": "text/html"})
        listing = {"meta": {"api-version": "1.1"}, "name": project, "files": [
            {"filename": filename, "url": f"/files/{filename}", "hashes": {"sha256": sha}, "size": len(data)}]}
        return self._send(200, json.dumps(listing).encode(), {"Content-Type": "application/vnd.pypi.simple.v1+json"})

    def _wheel(self, filename: str, head: bool) -> None:
        for project, (name, data) in self.behaviour.wheels.items():
            if name == filename:
                if project == self.behaviour.corrupt_wheel:
                    data = data[:-1] + bytes([data[-1] ^ 1])
                if self.behaviour.cut_after is not None and not self.behaviour.is_cut_done:
                    self.behaviour.is_cut_done = True
                    self._send(200, data[: self.behaviour.cut_after], {"Content-Length": str(len(data))})
                    self.close_connection = True
                    return None
                return self._send(200, b"" if head else data, {"Content-Length": str(len(data))})
        return self._send(404, b"", {})


class LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1 with a Behaviour, stopped by close()."""

    def __init__(self, behaviour: Behaviour):
        handler = type("BoundHandler", (Handler,), {"behaviour": behaviour})
        self.behaviour = behaviour
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        """Stop serving and free the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
