"""Running a suite: for every task and attempt, a fresh workspace, the agent headless under the task's rules and
time limit, then the hidden check; broken tasks are rejected before any agent runs."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openjet_tui.benchtasks.agentrun import AgentOutcome, AgentTarget, agent_command, metrics_from_events, run_agent
from openjet_tui.benchtasks.errors import BenchTaskError, BrokenTaskError
from openjet_tui.benchtasks.report import Reporter
from openjet_tui.benchtasks.results import (BROKEN_TASK, AgentMetrics, RunInfo, TaskRun, classify_failure, git_commit,
                                            machine_description, results_document, write_results)
from openjet_tui.benchtasks.suite import TaskSpec, default_suite_dir, load_suite
from openjet_tui.benchtasks.workspace import CHECK_DIRNAME, ensure_not_broken, prepare_workspace, run_check, task_env
from openjet_tui.config import DEFAULT_DENY

EXIT_SERVER = 3  # `openjet run`: the model server cannot be used
_KEEP_ENV = ("_API_KEY",)  # OPENJET_* variables that still pass through: keys, which never live in files


class ServerUnusableError(BenchTaskError):
    """The agent could not use the model server at all: every task would fail the same way."""


@dataclass(slots=True)
class SuiteOptions:
    """What `openjet bench tasks` was asked to do."""

    target: AgentTarget = field(default_factory=AgentTarget)
    pattern: str | None = None
    repeat: int = 1
    suite_dir: Path | None = None
    results_dir: Path | None = None
    openjet: list[str] | None = None  # command that starts openjet (default: this interpreter)
    python: str | None = None  # interpreter for checks and the agent's `python` (default: this one)
    is_verifying: bool = True  # run each check on the untouched start first and reject tasks it passes
    keep_dir: Path | None = None  # keep every workspace and agent log here instead of deleting them
    time_scale: float = 1.0  # every task's time limit is multiplied by this (a slow CPU engine needs more)


def agent_env(task: TaskSpec, home: Path, python: str | None = None) -> dict[str, str]:
    """The agent's environment: isolated settings and sessions, the task's shell rules, nothing from the user's
    own OPENJET_* settings except API keys."""
    env = {key: value for key, value in task_env(python).items()
           if not key.startswith("OPENJET_") or key.endswith(_KEEP_ENV)}
    env["XDG_CONFIG_HOME"] = str(home / "config")
    env["XDG_DATA_HOME"] = str(home / "data")
    env["OPENJET_SHELL__ALLOW"] = json.dumps(list(task.shell_allow))
    env["OPENJET_SHELL__DENY"] = json.dumps(sorted(set(DEFAULT_DENY) | set(task.shell_deny)))
    return env


def changed_files(workspace: Path) -> list[str]:
    """Files the agent added, changed or deleted since the start (git sees them; noise is excluded)."""
    result = subprocess.run(["git", "status", "--porcelain=v1", "-z", "-uall"], cwd=workspace,
                            capture_output=True, text=True, timeout=30)
    entries = [entry for entry in result.stdout.split("\0") if entry]
    paths, skip_next = [], False
    for entry in entries:
        if skip_next:  # the source path of a rename
            skip_next = False
            continue
        skip_next = entry[0] in "RC"
        paths.append(entry[3:])
    return sorted(path for path in paths if not path.startswith((CHECK_DIRNAME + "/", ".openjet/")))


def _detail(outcome: AgentOutcome, failure: str | None, time_limit_s: float) -> str:
    """One line saying what happened, for the table's reader and the JSON."""
    if failure is None:
        return "check passed"
    if outcome.timed_out:
        return f"stopped after the {time_limit_s:.0f} s limit"
    errors = [e.get("message", "") for e in outcome.events if e.get("type") == "error"]
    if errors:
        return str(errors[-1])[:300]
    if outcome.exit_code not in (0, None):
        return f"openjet run exited {outcome.exit_code}: {outcome.stderr_tail.strip()[-300:]}"
    replies = [e.get("content") or "" for e in outcome.events if e.get("type") == "assistant_message"]
    last = " ".join(replies[-1].split())[:200] if replies else ""
    return f"check failed; the agent's last words: {last!r}" if last else "check failed"


def stable_run_dir(task: TaskSpec) -> Path:
    """Where every attempt at a task runs: the same absolute path each time, because the agent's system prompt names
    its workspace folder, and a greedy model's reply depends on every byte of the prompt."""
    return Path(tempfile.gettempdir()) / f"openjet-bench-tasks-{os.getuid()}" / task.name


@contextmanager
def task_lock(task: TaskSpec) -> Iterator[None]:
    """The exclusive lock on a task's stable run folder: a concurrent suite's attempt at the task waits its turn."""
    run_dir = stable_run_dir(task)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{task.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield


@contextmanager
def _task_slot(task: TaskSpec) -> Iterator[Path]:
    """The task's stable run folder, empty, held under its lock."""
    run_dir = stable_run_dir(task)
    with task_lock(task):
        shutil.rmtree(run_dir, ignore_errors=True)  # left by a run that was killed
        try:
            yield run_dir
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)


def run_attempt(task: TaskSpec, attempt: int, options: SuiteOptions, scratch: Path) -> TaskRun:
    """One attempt in the task's stable folder; with --keep, the folder is copied to scratch afterwards."""
    with _task_slot(task) as run_dir:
        record = _attempt(task, attempt, options, run_dir)
        if options.keep_dir is not None:
            shutil.copytree(run_dir, scratch / f"{task.name}-{attempt}", symlinks=True)
    return record


def _attempt(task: TaskSpec, attempt: int, options: SuiteOptions, run_dir: Path) -> TaskRun:
    """Fresh workspace, agent, hidden check, classification."""
    workspace = prepare_workspace(task, run_dir / "workspace", options.python)
    command = agent_command(task, workspace, options.target, options.openjet)
    time_limit_s = task.time_limit_s * options.time_scale
    outcome = run_agent(command, workspace, agent_env(task, run_dir / "home", options.python), time_limit_s,
                        run_dir / "logs")
    metrics = metrics_from_events(outcome.events)
    # Exit 3 before any turn began: the probe found the server unusable (every task would fail the same way).
    # After a turn began it is this task's failure (a conversation past the window, a server lost mid-turn).
    if outcome.exit_code == EXIT_SERVER and not any(e.get("type") == "turn_started" for e in outcome.events):
        raise ServerUnusableError(_detail(outcome, "agent-error", time_limit_s))
    files = changed_files(workspace)
    check = run_check(task, workspace, options.python)
    failure = classify_failure(passed=check.passed, timed_out=outcome.timed_out, metrics=metrics,
                               files_changed=files, agent_exit=outcome.exit_code)
    return TaskRun(task.name, task.category, attempt, check.passed, failure,
                   _detail(outcome, failure, time_limit_s), outcome.wall_s, metrics, files,
                   "" if check.passed else check.output[-1500:])


def _broken_run(task: TaskSpec, error: BrokenTaskError) -> TaskRun:
    """The record of a task rejected before any agent ran."""
    return TaskRun(task.name, task.category, 1, False, BROKEN_TASK, str(error), 0.0, AgentMetrics(),
                   check_output=error.output[-1500:])


def run_suite(options: SuiteOptions, reporter: Reporter) -> tuple[dict[str, Any], Path]:
    """Run every selected task `repeat` times; returns the results document and where it was written."""
    if options.repeat < 1:
        raise BenchTaskError(f"--repeat must be at least 1, got {options.repeat}")
    if not options.time_scale > 0:
        raise BenchTaskError(f"--time-scale must be positive, got {options.time_scale}")
    tasks = load_suite(options.suite_dir, options.pattern)
    _check_tools(tasks, options.python)
    root = Path(__file__).resolve().parents[2]
    info = RunInfo(options.target.provider, options.target.base_url, options.target.model, git_commit(root),
                   machine_description(), time.strftime("%Y-%m-%d %H:%M:%S %Z"), options.repeat,
                   options.target.temperature, options.target.seed, options.time_scale)
    scratch = _scratch_dir(options.keep_dir)
    reporter.start(len(tasks) * options.repeat)
    try:
        for task in tasks:
            _run_task(task, options, scratch, reporter)
    finally:
        if options.keep_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    document = results_document(info, reporter.runs)
    reporter.close(document["summary"])
    results_dir = options.results_dir or default_suite_dir().parent / "results"
    return document, write_results(document, results_dir)


def _check_tools(tasks: list[TaskSpec], python: str | None) -> None:
    """pytest checks need pytest beside the interpreter that runs them; without it every task would just fail."""
    if not any(task.check_kind == "pytest" for task in tasks):
        return
    probe = subprocess.run([python or sys.executable, "-c", "import pytest"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        raise BenchTaskError(f"the hidden checks need pytest in {python or sys.executable}: "
                             "install it with `pip install 'openjet[dev]'` (or pytest alone)")


def _scratch_dir(keep_dir: Path | None) -> Path:
    """Where workspaces go: a temporary folder, or the --keep folder (which must be new or empty)."""
    if keep_dir is None:
        return Path(tempfile.mkdtemp(prefix="openjet-bench-tasks-"))
    if keep_dir.exists() and (not keep_dir.is_dir() or any(keep_dir.iterdir())):
        raise BenchTaskError(f"--keep {keep_dir}: must be a new or empty folder")
    keep_dir.mkdir(parents=True, exist_ok=True)
    return keep_dir.resolve()


def _run_task(task: TaskSpec, options: SuiteOptions, scratch: Path, reporter: Reporter) -> None:
    """Verify one task, then run its attempts, reporting each."""
    if options.is_verifying:
        try:
            ensure_not_broken(task, scratch, options.python)
        except BrokenTaskError as error:
            reporter.note(f"rejected {task.name}: {error}")
            reporter.finish(_broken_run(task, error))
            for _ in range(options.repeat - 1):
                reporter.skip()
            return
    for attempt in range(1, options.repeat + 1):
        reporter.begin(task.name, attempt)
        reporter.finish(run_attempt(task, attempt, options, scratch))
