"""Engine worker lifecycle: a free port, /health waited on with progress, output to a log file, bounded restarts
after a crash with the reason kept, and the whole process group stopped on exit so no engine outlives the app."""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from openjet_tui.runtime.applog import configure_logging
from openjet_tui.runtime.errors import EngineStartError
from openjet_tui.runtime.paths import cache_dir, ensure_dir, logs_dir
from openjet_tui.runtime.progress import ProgressCallback, ProgressEvent, no_progress

HEALTH_POLL_S = 0.2
TROUBLE_EVENTS = ("crashed", "gave_up")  # logged as warnings
log = logging.getLogger("openjet.worker")


@dataclass(slots=True)
class WorkerSpec:
    """How to run one engine server; '{port}' in the command is replaced by the chosen port."""

    name: str
    command: list[str]
    port: int | None = None  # None: a free loopback port is chosen
    health_path: str = "/health"
    start_timeout_s: float = 600.0  # loading a 17 GB model from a cold disk takes minutes
    max_restarts: int = 3  # crashes tolerated within restart_window_s before giving up
    restart_window_s: float = 600.0
    env: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class WorkerEvent:
    """Something the app shows: starting, healthy, crashed (with the reason), restarting, gave_up, stopped."""

    kind: str
    message: str


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def describe_exit(code: int) -> str:
    """'exit code 3' or 'killed by SIGSEGV' for a Popen return code."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def log_tail(path: Path, num_lines: int = 8) -> str:
    """The last lines of a log file, for error messages."""
    try:
        lines = path.read_bytes()[-8192:].decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-num_lines:])


def _registry_dir() -> Path:
    return ensure_dir(cache_dir() / "workers")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, timeout_s: float = 5.0) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after `timeout_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def process_start_ticks(pid: int) -> int | None:
    """When a process started (clock ticks since boot, from /proc), to tell it from a later one with the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime) counted after the command name, which is in parentheses and may hold spaces.
    return int(stat.rpartition(")")[2].split()[19])


def reap_orphans() -> list[int]:
    """Stop workers left by an app that died without cleaning up (killed hard); returns their group ids."""
    reaped = []
    for record in _registry_dir().glob("*.json"):
        try:
            entry = json.loads(record.read_text())
            owner, pgid, started = int(entry["owner_pid"]), int(entry["pgid"]), entry.get("started")
        except (OSError, ValueError, KeyError, TypeError):
            record.unlink(missing_ok=True)
            continue
        if process_start_ticks(owner) == entry.get("owner_started") and _pid_alive(owner):
            continue  # its app is still running (another OpenJet window)
        # Only the very process we started: a pid reused since (say, after a reboot) is left alone.
        if started is not None and process_start_ticks(pgid) == started:
            kill_group(pgid)
            reaped.append(pgid)
        record.unlink(missing_ok=True)
    return reaped


_LIVE_WORKERS: set["EngineWorker"] = set()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # a normal exit, so atexit stops the workers


def install_exit_handlers() -> None:
    """Make SIGTERM and SIGHUP exit normally (running atexit) where nobody else handles them; main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _exit_on_signal)


@atexit.register
def stop_all_workers() -> None:
    """Stop every worker this process started (runs at interpreter exit)."""
    for worker in list(_LIVE_WORKERS):
        worker.stop()


class EngineWorker:
    """One engine server process, kept healthy until stop()."""

    def __init__(self, spec: WorkerSpec, on_event: Callable[[WorkerEvent], None] | None = None):
        self.spec = spec
        self.port = spec.port or free_port()
        self.log_path = ensure_dir(logs_dir()) / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{self.port}.log"
        self.events: list[WorkerEvent] = []
        self.crash_reasons: list[str] = []
        self.health_info: dict[str, object] = {}
        self._on_event = on_event
        self._process: subprocess.Popen[bytes] | None = None
        self._crash_times: deque[float] = deque()
        self._is_stopping = False
        self._lock = threading.RLock()  # an event callback may call stop() from the monitor thread
        self._monitor: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The server root, e.g. http://127.0.0.1:PORT (OpenAI routes live under /v1)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The current process id (also its process group id), if running."""
        return self._process.pid if self._process else None

    def _emit(self, kind: str, message: str) -> None:
        event = WorkerEvent(kind, message)
        self.events.append(event)
        log.log(logging.WARNING if kind in TROUBLE_EVENTS else logging.INFO, "%s %s: %s", self.spec.name, kind,
                message)
        if self._on_event is not None:
            self._on_event(event)

    def _spawn(self) -> None:
        command = [part.replace("{port}", str(self.port)) for part in self.spec.command]
        with self.log_path.open("ab") as log:
            log.write(f"\n$ {' '.join(command)}\n".encode())
            log.flush()
            # Its own session and process group: stop() kills the engine and anything it spawned, in one call.
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, env={**os.environ, **self.spec.env})
        record = {"owner_pid": os.getpid(), "owner_started": process_start_ticks(os.getpid()),
                  "pgid": self._process.pid, "started": process_start_ticks(self._process.pid), "command": command}
        (_registry_dir() / f"{self._process.pid}.json").write_text(json.dumps(record))

    def _health(self, client: httpx.Client) -> tuple[bool, str, float | None]:
        """(is ready, message, load progress 0..1 if the server reports one)."""
        try:
            response = client.get(f"{self.base_url}{self.spec.health_path}")
        except httpx.HTTPError:
            return False, "waiting for the port", None
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        error = body.get("error")
        message = str(error.get("message", "")) if isinstance(error, dict) else str(body.get("status", ""))
        if body.get("stage"):
            message = str(body["stage"])  # openjet-engine names its load stage
        if response.status_code == 200:
            self.health_info = body  # e.g. the engine's own backend and backend_reason
        fraction = body.get("progress", body.get("load_progress"))
        fraction = float(fraction) if isinstance(fraction, (int, float)) else None
        if fraction is not None and fraction > 1.0:
            fraction /= 100.0  # a server that reports percent
        return response.status_code == 200, message or f"HTTP {response.status_code}", fraction

    def _wait_healthy(self, progress: ProgressCallback) -> None:
        task, started = f"start {self.spec.name}", time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while True:
                process = self._process
                assert process is not None
                if (code := process.poll()) is not None:
                    self._unregister(process.pid)
                    raise EngineStartError(f"{self.spec.name} stopped while starting ({describe_exit(code)}); "
                                           f"log {self.log_path}:\n{log_tail(self.log_path)}")
                is_ready, message, fraction = self._health(client)
                elapsed = time.monotonic() - started
                if is_ready:
                    progress(ProgressEvent(task, 100, 100, unit="%", note="ready", is_finished=True))
                    return
                if elapsed > self.spec.start_timeout_s:
                    self._kill_current()
                    raise EngineStartError(f"{self.spec.name} was not healthy after {self.spec.start_timeout_s:.0f} "
                                           f"s ({message}); log {self.log_path}:\n{log_tail(self.log_path)}")
                if fraction is not None:
                    progress(ProgressEvent(task, round(100 * fraction), 100, unit="%", note=message))
                else:
                    progress(ProgressEvent(task, round(elapsed), None, unit="s", note=message))
                time.sleep(HEALTH_POLL_S)

    def start(self, progress: ProgressCallback = no_progress) -> "EngineWorker":
        """Start the process and block until /health answers 200; EngineStartError (with the log tail) if not."""
        reap_orphans()
        install_exit_handlers()
        configure_logging()
        self._emit("starting", f"{self.spec.name} on port {self.port}, log {self.log_path}")
        self._spawn()
        _LIVE_WORKERS.add(self)
        try:
            self._wait_healthy(progress)
        except EngineStartError:
            _LIVE_WORKERS.discard(self)
            raise
        self._emit("healthy", f"{self.spec.name} ready at {self.base_url}")
        self._monitor = threading.Thread(target=self._watch, name=f"watch-{self.spec.name}", daemon=True)
        self._monitor.start()
        return self

    def is_running(self) -> bool:
        """Whether the engine process is alive right now."""
        return self._process is not None and self._process.poll() is None

    def _unregister(self, pid: int) -> None:
        (_registry_dir() / f"{pid}.json").unlink(missing_ok=True)

    def _kill_current(self, timeout_s: float = 5.0) -> None:
        """SIGTERM the process group, reap the leader, SIGKILL whatever of the group is left."""
        process = self._process
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # children that ignored SIGTERM, or a stuck leader
        except ProcessLookupError:
            pass
        process.wait()
        self._unregister(process.pid)

    def _record_crash(self, code: int) -> bool:
        """Note a crash and its reason; returns whether another restart is within the budget."""
        reason = f"{self.spec.name} crashed ({describe_exit(code)})"
        if tail := log_tail(self.log_path, 3):
            reason += f": {tail}"
        self.crash_reasons.append(reason)
        self._emit("crashed", reason)
        now = time.monotonic()
        self._crash_times.append(now)
        while self._crash_times and now - self._crash_times[0] > self.spec.restart_window_s:
            self._crash_times.popleft()
        if len(self._crash_times) > self.spec.max_restarts:
            self._emit("gave_up", f"{self.spec.name} crashed {len(self._crash_times)} times within "
                                  f"{self.spec.restart_window_s:.0f} s; not restarting. Last: {reason}")
            return False
        self._emit("restarting", f"restart {len(self._crash_times)} of at most {self.spec.max_restarts}")
        return True

    def _watch(self) -> None:
        """Monitor thread: restart the engine after a crash, within the restart budget."""
        while True:
            process = self._process
            assert process is not None
            code = process.wait()
            with self._lock:
                if self._is_stopping:
                    return
                self._kill_current(timeout_s=1.0)  # anything the crashed engine left in its group
                if not self._record_crash(code) or self._is_stopping:
                    _LIVE_WORKERS.discard(self)
                    return
                self._spawn()
            try:
                self._wait_healthy(no_progress)
                self._emit("healthy", f"{self.spec.name} ready again at {self.base_url}")
            except EngineStartError:
                continue  # the failed start is the next crash the loop records

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the engine and everything in its process group; safe to call more than once."""
        with self._lock:
            was_stopping, self._is_stopping = self._is_stopping, True
            if self._process is not None and self._process.poll() is None:
                self._kill_current(timeout_s)
            elif self._process is not None:
                self._unregister(self._process.pid)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout_s)
        _LIVE_WORKERS.discard(self)
        if not was_stopping:
            self._emit("stopped", f"{self.spec.name} stopped")
