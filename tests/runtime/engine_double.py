"""A small real HTTP server standing in for an engine where the tests need one to misbehave on purpose:
slow to load, crashing once or always, or spawning a child process. Run as a script by the worker tests.

It also stands in for llama-server (tests/runtime/test_selection_processes.py puts a `llama-server` script on PATH
that runs this file): it takes llama-server's command line (unknown options are ignored, `-m` is kept) and serves
the OpenAI routes the runtime and the app's probe use: /health, /props, /v1/models and /v1/chat/completions."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = "Hello from the engine double."
CONTEXT = 4096


def parse_args() -> argparse.Namespace:
    """The double's own flags plus the llama-server ones it needs; anything else llama-server takes is ignored."""
    parser = argparse.ArgumentParser(allow_abbrev=False)  # `--metrics` must not be read as a prefix of ours
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-m", "--model", default="")
    parser.add_argument("--loading-polls", type=int, default=0)
    parser.add_argument("--die-after", type=float, default=None)
    parser.add_argument("--crash-once-marker", default=None)
    parser.add_argument("--die-at-start", action="store_true")
    parser.add_argument("--spawn-child", action="store_true")
    args, _ = parser.parse_known_args()
    return args


def chat_reply(body: dict) -> dict:
    """A non-streamed OpenAI chat completion carrying REPLY."""
    return {"id": "chatcmpl-double", "object": "chat.completion", "created": int(time.time()), "model": "double",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": REPLY}}],
            "usage": {"prompt_tokens": len(json.dumps(body.get("messages", []))) // 4,
                      "completion_tokens": 6, "total_tokens": 6}}


def sse_chunks() -> list[dict]:
    """The same reply as OpenAI stream chunks."""
    base = {"id": "chatcmpl-double", "object": "chat.completion.chunk", "model": "double"}
    return [base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": REPLY}, "finish_reason": None}]},
            base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}}]


def make_handler(args: argparse.Namespace, child: subprocess.Popen | None) -> type[BaseHTTPRequestHandler]:
    """The request handler, closed over the command line and the optional child process."""
    polls = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/pid":
                return self._send(200, {"pid": os.getpid(), "child": child.pid if child else None})
            if self.path == "/props":
                return self._send(200, {"model_path": args.model,
                                        "default_generation_settings": {"n_ctx": CONTEXT}})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [
                    {"id": os.path.basename(args.model) or "double", "object": "model",
                     "meta": {"n_ctx_train": CONTEXT}}]})
            if self.path != "/health":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            polls["n"] += 1
            if polls["n"] <= args.loading_polls:
                return self._send(503, {"error": {"message": "Loading model"},
                                        "progress": polls["n"] / (args.loading_polls + 1)})
            return self._send(200, {"status": "ok"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            if not body.get("stream"):
                return self._send(200, chat_reply(body))
            data = b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in sse_chunks()) + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main() -> None:
    """Serve /health (503 with progress while 'loading', then 200), the OpenAI routes and /pid until told to die."""
    args = parse_args()
    if args.die_at_start:
        print("fatal: cannot load model (simulated)", file=sys.stderr, flush=True)
        sys.exit(2)
    child = subprocess.Popen(["sleep", "300"]) if args.spawn_child else None
    crash_after = args.die_after
    if args.crash_once_marker and not os.path.exists(args.crash_once_marker):
        open(args.crash_once_marker, "w").close()
        crash_after = 3.0 if crash_after is None else crash_after

    if crash_after is not None:
        def die() -> None:
            time.sleep(crash_after)
            print("fatal: simulated GPU fault", file=sys.stderr, flush=True)
            os._exit(3)

        threading.Thread(target=die, daemon=True).start()
    ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args, child)).serve_forever()


if __name__ == "__main__":
    main()
