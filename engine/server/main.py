"""`openjet-engine serve`: an OpenAI-compatible server for one GGUF model (a drop-in for llama-server).

The port opens at once and /health answers 503 with load progress while the model loads in the background; if
loading fails the server stops with exit status 1 (the error is logged and shown on /health until then).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys

import uvicorn

from engine.hostmem import keep_freed_heap
from engine.server.app import create_app
from engine.server.loader import BACKENDS
from engine.server.state import DRAFTS, ServerConfig, ServerState

log = logging.getLogger("engine.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `openjet-engine serve`."""
    parser.add_argument("--model", required=True, help="GGUF model file")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="reference (numpy), cuda, or auto: cuda when it starts, else reference (default)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=int, default=18080, help="port (default 18080; 0 picks a free one)")
    parser.add_argument("--ctx", type=int, default=None, help="context window in tokens (default: the model's)")
    parser.add_argument("--draft", choices=DRAFTS, default="auto",
                        help="draft source: mtp (the model's MTP head), ngram (prompt lookup), ngram+mtp (an "
                             "n-gram match when there is one, else MTP), none; auto: mtp when the model has a head, "
                             "else ngram")
    parser.add_argument("--n-draft", type=int, default=None,
                        help="most draft tokens per cycle; the adaptive length stays at or below it "
                             "(default 4 for mtp, 8 for ngram, 6 for ngram+mtp; 0 disables speculation)")
    parser.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on every request")
    parser.add_argument("--queue", type=int, default=16,
                        help="requests that may wait while one is served; more get 503 with Retry-After")
    parser.add_argument("--checkpoints", type=int, default=8, help="state checkpoints kept for prefix reuse")
    parser.add_argument("--alias", default=None, help="model id reported by /v1/models (default: the file name)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig from the command line (ValueError naming a bad option)."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.checkpoints < 0:
        raise ValueError(f"--checkpoints must be >= 0, got {args.checkpoints}")
    return ServerConfig(model_path=args.model, backend=args.backend, host=args.host, port=args.port,
                        context_size=args.ctx, draft=args.draft, n_draft=args.n_draft, api_key=args.api_key,
                        max_waiting=args.queue, max_checkpoints=args.checkpoints, alias=args.alias)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (IPv6 when host is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def make_server(state: ServerState, log_level: str = "info") -> uvicorn.Server:
    """A uvicorn server for state's app (not yet running)."""
    config = uvicorn.Config(create_app(state), log_level=log_level, access_log=False, timeout_graceful_shutdown=5,
                            lifespan="off")
    return uvicorn.Server(config)


def run(args: argparse.Namespace) -> int:
    """Open the port, load the model in the background, serve until interrupted."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not keep_freed_heap():
        log.info("no glibc mallopt: freed heap goes back to the system (sampling pays page faults)")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"openjet-engine serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bind(config.host, config.port)
    except OSError as exc:
        print(f"openjet-engine serve: error: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    state = ServerState(config)
    server = make_server(state, args.log_level)
    failed = []

    def stop_after_failure() -> None:
        """Loading failed: stop serving, exit 1."""
        failed.append(True)
        server.should_exit = True

    log.info("listening on http://%s:%d (model loading)", host, port)
    state.start_loading(on_failure=stop_after_failure)
    # uvicorn shuts down on SIGINT / SIGTERM and then raises the signal again for the previous handler
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        server.run(sockets=[sock])
    except (KeyboardInterrupt, _Stopped):
        pass  # a requested stop, already carried out by uvicorn
    finally:
        signal.signal(signal.SIGTERM, previous)
        state.shutdown()
        sock.close()
    return 1 if failed else 0


class _Stopped(Exception):
    """SIGTERM arrived (after uvicorn's graceful shutdown)."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped()
