"""`openjet-engine serve` as a real process: it opens the port, serves, stops cleanly, and fails clearly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(*args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "engine.cli", "serve", "--log-level", "warning", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_serves_and_stops_cleanly(tiny_qwen35, stop: signal.Signals) -> None:
    port = free_port()
    process = serve("--model", str(tiny_qwen35), "--backend", "reference", "--port", str(port), "--ctx", "256",
                    "--draft", "ngram+mtp", "--n-draft", "2")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server never became healthy"
            time.sleep(0.1)
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()
        assert (health["backend"], health["draft"], health["context_size"]) == ("reference", "ngram+mtp", 256)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30).json()
        assert reply["usage"]["completion_tokens"] == 3
    finally:
        os.killpg(process.pid, stop)
        assert process.wait(20) == 0


def test_load_failure_exits_1(tmp_path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    process = serve("--model", str(broken), "--port", str(free_port()))
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and "broken.gguf" in output


def test_bad_options_exit_2(tiny_qwen35) -> None:
    for options in (["--port", "70000"], ["--n-draft", "-1"], ["--queue", "-2"]):
        process = serve("--model", str(tiny_qwen35), *options)
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 2 and "error" in output, options
