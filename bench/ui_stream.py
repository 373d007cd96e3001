"""Keystroke latency while the app draws a fast stream (a benchmark, not a timed test).

Streams TOKENS tokens of Markdown (paragraphs, lists, code) at RATE tok/s from the scripted OpenAI-compatible
server, through the real client and agent, into the real app (headless Textual), while typing one character
every KEY_INTERVAL seconds into the editor. A keystroke's latency runs from posting the key event to the first
screen refresh after the character is in the editor.

The figures hold only for the rate the stream reached: below RATE_SHORTFALL of the asked rate (a loaded machine
that cannot keep up) the run says so, on stderr and in its JSON, beside the machine, date, commit and load average.

    .venv/bin/python bench/ui_stream.py [--tokens 20000] [--rate 1000] [--history 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from textual import events  # noqa: E402

from openjet_tui.agent.sessions import SessionStore  # noqa: E402
from openjet_tui.ui.app import OpenJetApp  # noqa: E402
from openjet_tui.ui.controller import LaunchOptions  # noqa: E402
from tests.agent.scripted_server import ScriptedServer, reply  # noqa: E402

CHARS_PER_TOKEN = 4  # one SSE chunk per token, as a real server sends them
KEY_INTERVAL = 0.05
RATE_SHORTFALL = 0.9  # a stream below this share of the asked rate measured a lighter load than asked
SECTION = """## Step {n}: tighten the parser

The loader reads every row, converts the quantity and keeps a running total. A blank quantity made `int()`
raise, so the report stopped at the first incomplete row; counting it as zero keeps the totals honest.

- read the row and strip the fields
- treat an empty quantity as **0** and log the row number
- keep going: one bad row must not hide the others

```python
def parse_quantity(text: str) -> int:
    text = text.strip()
    return int(text) if text else 0
```

"""


@dataclass
class Result:
    """What one run measured."""

    tokens: int
    target_rate: float
    achieved_rate: float
    stream_seconds: float
    history_messages: int
    keystrokes: int
    worst_ms: float
    p99_ms: float
    median_ms: float
    frames: int
    app_cpu_seconds: float  # CPU the app process used while streaming (steadier than latency on a busy machine)
    latencies_ms: list[float] = field(repr=False)
    rate_warning: str = ""  # set when the stream fell short of the asked rate
    machine: dict[str, object] = field(default_factory=dict)  # where and when it ran (machine_info)


def rate_warning(target_rate: float, achieved_rate: float) -> str:
    """Why the figures understate the asked load, when the stream reached less than RATE_SHORTFALL of it."""
    if achieved_rate >= RATE_SHORTFALL * target_rate:
        return ""
    return (f"the stream reached {achieved_rate:,.0f} tok/s, {achieved_rate / target_rate:.0%} of the "
            f"{target_rate:,.0f} tok/s asked (below {RATE_SHORTFALL:.0%}): these latencies are for a slower stream; "
            f"run it again on a quieter machine before quoting them")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor())


def machine_info() -> dict[str, object]:
    """Machine, software, date, commit and load average (1, 5, 15 minutes), for the results file."""
    import textual

    return {"host": platform.node(), "cpu": _cpu_model(), "num_cpus": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(), "textual": textual.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": _git("rev-parse", "HEAD"),
            "is_tree_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def markdown_tokens(num_tokens: int) -> str:
    """About `num_tokens` tokens of varied Markdown."""
    text, n = "", 1
    while len(text) < num_tokens * CHARS_PER_TOKEN:
        text += SECTION.format(n=n)
        n += 1
    return text[:num_tokens * CHARS_PER_TOKEN]


def seed_history(workspace: Path, num_messages: int) -> str | None:
    """A stored session of this many messages to resume, or None."""
    if not num_messages:
        return None
    store = SessionStore()
    store.db.execute("PRAGMA synchronous = OFF")
    session = store.create(workspace, "llama-server", "scripted-model", "ask")
    for i in range(num_messages // 2):
        store.add_message(session.id, {"role": "user", "content": f"question {i}: what does step {i} change?"})
        # short answers: the stored history must fit the window, or the agent would first compact it
        store.add_message(session.id, {"role": "assistant", "content": f"Step **{i}** treats a blank quantity "
                                                                       "as `0` and logs the row."})
    store.close()
    return session.id


async def type_and_time(app: OpenJetApp, stop: asyncio.Event) -> list[float]:
    """Type a character every KEY_INTERVAL seconds; return each one's latency in milliseconds."""
    editor = app.chat.prompt_input
    latencies = []
    while not stop.is_set():
        await asyncio.sleep(KEY_INTERVAL)
        before = len(editor.text)
        started = time.perf_counter()
        app.post_message(events.Key("x", "x"))
        while len(editor.text) == before:  # applied by the editor
            await asyncio.sleep(0.0005)
        painted = asyncio.get_running_loop().create_future()
        editor.call_after_refresh(lambda: painted.done() or painted.set_result(None))
        await painted  # and on screen
        latencies.append((time.perf_counter() - started) * 1000)
        if len(editor.text) > 200:
            editor.clear()
    return latencies


def serve(connection: Connection, text: str, delay_s: float) -> None:
    """The model server, in its own process as a real one would be (a thread would share the app's GIL)."""
    script = reply(text, chunk_chars=CHARS_PER_TOKEN, delay_s=delay_s)
    with ScriptedServer([script], context_window=262144) as server:
        connection.send(server.base_url)
        connection.recv()  # until the run is over


async def stream_and_type(app: OpenJetApp) -> tuple[float, float, list[float]]:
    """Start the turn, type throughout it; returns (seconds, CPU seconds, keystroke latencies)."""
    app.chat.prompt_input.focus()
    await app.chat.add_user_message("explain every step")
    stop = asyncio.Event()
    started, cpu_started = time.perf_counter(), time.process_time()
    app.run_turn("explain every step")
    typing = asyncio.create_task(type_and_time(app, stop))
    while not app.is_busy:
        await asyncio.sleep(0.01)
    while app.is_busy:
        await asyncio.sleep(0.05)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    stop.set()
    return elapsed, cpu, await typing


async def run(base_url: str, text: str, num_tokens: int, rate: float, history: int) -> Result:
    """One streaming run with keystrokes measured throughout."""
    workspace = Path(tempfile.mkdtemp(prefix="openjet-bench-"))
    options = LaunchOptions(provider="llama-server", base_url=base_url, workspace=workspace,
                            resume=seed_history(workspace, history))
    app = OpenJetApp(options, gpu_sampler=None, poll_metrics=False, watch_workspace=False)
    async with app.run_test(size=(160, 50)) as pilot:
        while not app.controller.ready.is_set():
            await pilot.pause(0.05)
        elapsed, cpu, latencies = await stream_and_type(app)
        shown = getattr(app.chat.conversation.items[-1], "content", "")
        if shown != text:
            raise SystemExit(f"the app showed {len(shown):,} of {len(text):,} characters of the reply")
        frames = app.pump.num_batches
    ordered = sorted(latencies)
    return Result(num_tokens, rate, num_tokens / elapsed, elapsed, history, len(latencies), ordered[-1],
                  ordered[int(0.99 * (len(ordered) - 1))], statistics.median(ordered), frames, cpu, latencies)


def main(argv: list[str] | None = None) -> int:
    """Run and print the figures (optionally as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=1000.0, help="tokens per second the server sends")
    parser.add_argument("--history", type=int, default=0, help="stored messages of a resumed session")
    parser.add_argument("--delay", type=float, help="seconds between tokens (default 1/rate; sleep overhead "
                        "makes the achieved rate a little lower, and the report says what it was)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="openjet-bench-data-")  # keep the person's sessions out
    text = markdown_tokens(args.tokens)
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.get_context("fork").Process(target=serve, args=(theirs, text, args.delay or 1 / args.rate),
                                                         daemon=True)
    server.start()
    machine = machine_info()  # the load average before the run: what else was keeping the machine busy
    try:
        result = asyncio.run(run(ours.recv(), text, args.tokens, args.rate, args.history))
    finally:
        ours.send("stop")
        server.join(timeout=10)
    result.machine = {**machine, "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    result.rate_warning = rate_warning(result.target_rate, result.achieved_rate)
    print(f"{result.tokens:,} tokens at {result.achieved_rate:,.0f} tok/s (target {result.target_rate:,.0f}) "
          f"in {result.stream_seconds:.1f} s, history {result.history_messages:,} messages, "
          f"{result.frames:,} drawn batches, app CPU {result.app_cpu_seconds:.1f} s")
    print(f"keystroke latency over {result.keystrokes} keys: worst {result.worst_ms:.1f} ms, "
          f"p99 {result.p99_ms:.1f} ms, median {result.median_ms:.1f} ms")
    print(f"on {machine['cpu']} ({machine['num_cpus']} CPUs), load average {machine['load_average']}, "
          f"commit {str(machine['commit'])[:12]}{' (uncommitted changes)' if machine['is_tree_dirty'] else ''}")
    if result.rate_warning:
        print(f"WARNING: {result.rate_warning}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
