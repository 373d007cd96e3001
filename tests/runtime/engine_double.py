"""A small real HTTP server standing in for an engine where the tests need one to misbehave on purpose:
slow to load, crashing once or always, or spawning a child process. Run as a script by the worker tests."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    """Serve /health (503 with progress while 'loading', then 200) and /pid until told to die."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--loading-polls", type=int, default=0)
    parser.add_argument("--die-after", type=float, default=None)
    parser.add_argument("--crash-once-marker", default=None)
    parser.add_argument("--die-at-start", action="store_true")
    parser.add_argument("--spawn-child", action="store_true")
    args = parser.parse_args()
    if args.die_at_start:
        print("fatal: cannot load model (simulated)", file=sys.stderr, flush=True)
        sys.exit(2)
    child = subprocess.Popen(["sleep", "300"]) if args.spawn_child else None
    polls = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/pid":
                body = {"pid": os.getpid(), "child": child.pid if child else None}
                status = 200
            else:
                polls["n"] += 1
                loading = polls["n"] <= args.loading_polls
                status = 503 if loading else 200
                body = {"error": {"message": "Loading model"}, "progress": polls["n"] / (args.loading_polls + 1)} \
                    if loading else {"status": "ok"}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

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
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
