"""Running an approved shell command: own process group, timeout, output capped to head + tail, cancel kills all."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from openjet_tui.llm.providers import key_env_names

KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL
DRAIN_AFTER_EXIT_S = 0.5  # background children may hold the pipe open after the shell exits
# Names that say they hold a credential (Codex's default exclusion): GITHUB_TOKEN, ANTHROPIC_API_KEY, AWS_SECRET_...
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


@dataclass(slots=True)
class CommandResult:
    """What a command did: exit code (None if killed), combined output (capped), and how it ended."""

    exit_code: int | None
    output: str
    num_output_bytes: int
    is_truncated: bool
    timed_out: bool
    duration_s: float

    def describe(self, timeout_s: float) -> str:
        """The result as the model reads it."""
        if self.timed_out:
            status = f"timed out after {timeout_s:g}s; the whole process group was killed"
        else:
            status = f"exit code {self.exit_code}"
        body = self.output if self.output.strip() else "(no output)"
        return f"{status}\n{body}"


class OutputCap:
    """Keeps the first and last `limit // 2` bytes of a stream and counts what fell in between."""

    def __init__(self, limit: int):
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        """Take more output."""
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[:max(0, len(self.tail) - self.half)]

    @property
    def is_truncated(self) -> bool:
        """True when bytes were dropped."""
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        """Head, an omission marker if needed, and tail, decoded leniently."""
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if not self.is_truncated:
            return head + tail
        dropped = self.total - len(self.head) - len(self.tail)
        return f"{head}\n[... {dropped} bytes of output omitted ...]\n{tail}"


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _exited(process: asyncio.subprocess.Process) -> int:
    """Wait for the shell itself to exit. Process.wait() would also wait for every pipe to close, which a
    background child holding stdout delays until it ends, so poll the exit status instead."""
    while process.returncode is None:
        await asyncio.sleep(0.02)
    return process.returncode


async def _terminate(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the whole group, then SIGKILL whatever is left after a grace period."""
    _kill_group(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(_exited(process), KILL_GRACE_S)
    except TimeoutError:
        pass
    _kill_group(process.pid, signal.SIGKILL)
    await _exited(process)


async def _close(process: asyncio.subprocess.Process, pump: asyncio.Task[None]) -> None:
    """Let the pipe reach end-of-file (the group is dead) so the transport closes while the loop still runs."""
    try:
        await asyncio.wait_for(asyncio.shield(pump), KILL_GRACE_S)
        await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    except TimeoutError:
        pump.cancel()
    except asyncio.CancelledError:
        pump.cancel()
        raise


async def _pump(stream: asyncio.StreamReader, cap: OutputCap) -> None:
    while chunk := await stream.read(65536):
        cap.add(chunk)


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment without the API keys providers read and any variable named like a credential: a command's
    output goes to the model and the session database, so `echo $OPENAI_API_KEY` must print nothing."""
    secret = key_env_names()
    kept = {name: value for name, value in os.environ.items()
            if name not in secret and not _SECRET_NAME.search(name)}
    return {**kept, **(extra or {})}


async def run_command(command: str, cwd: Path, timeout_s: float, max_output_bytes: int,
                      env: dict[str, str] | None = None) -> CommandResult:
    """Run `bash -c command` in cwd, in a new session so the group can be killed on timeout or cancel."""
    started = time.monotonic()
    spawning = asyncio.ensure_future(asyncio.create_subprocess_exec(
        "/bin/bash", "-c", command, cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        env=child_environment(env)))
    # The shell runs (and may start children) before asyncio has connected its pipes. Cancelled in that window,
    # asyncio would kill the shell alone and wait for the orphans to close the pipes: let the spawn finish instead,
    # then cancel through the path below that kills the whole group.
    cancelled_while_spawning = False
    while not spawning.done():  # a few milliseconds, however many cancels arrive meanwhile
        try:
            await asyncio.shield(spawning)
        except asyncio.CancelledError:
            cancelled_while_spawning = True
    process = spawning.result()
    cap = OutputCap(max_output_bytes)
    assert process.stdout is not None
    pump = asyncio.create_task(_pump(process.stdout, cap))
    timed_out = False
    try:
        if cancelled_while_spawning:
            raise asyncio.CancelledError
        try:
            await asyncio.wait_for(_exited(process), timeout_s)
        except TimeoutError:
            timed_out = True
            await _terminate(process)
        try:  # children left in the background keep the pipe open: stop waiting for them soon
            await asyncio.wait_for(asyncio.shield(pump), DRAIN_AFTER_EXIT_S)
        except TimeoutError:
            pass
    except asyncio.CancelledError:
        await asyncio.shield(_terminate(process))
        raise
    finally:
        _kill_group(process.pid, signal.SIGKILL)  # nothing the command started outlives it
        await _close(process, pump)
    return CommandResult(None if timed_out else process.returncode, cap.text(), cap.total, cap.is_truncated,
                         timed_out, time.monotonic() - started)
