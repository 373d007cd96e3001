"""Running the agent on one task: `openjet run` headless in auto-edit mode, in its own process group, with the task's
time limit, and reading its JSON Lines events back into the counters a run records."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openjet_tui.benchtasks.results import AgentMetrics
from openjet_tui.benchtasks.suite import TaskSpec

# Tool results the agent core writes when a call could not even be attempted: an unknown tool, arguments that are
# not JSON, or arguments that break the tool's schema (openjet_tui/agent/tools/base.py words them this way).
_MALFORMED = re.compile(
    r"^Error: (unknown tool |[\w.-]+: (arguments are not valid JSON|arguments must be a JSON object|"
    r"missing required argument|unknown argument|argument \S+ must be ))"
)
# A reply the agent did not run although it is shaped like a tool call: a Hermes tag, a Qwen3-Coder function tag,
# or a JSON object with a name and arguments (small models invent tools and print such calls as plain text).
_CALL_AS_TEXT = re.compile(r'<tool_call>|<function=|"name"\s*:\s*"[^"]*"\s*,\s*"(arguments|parameters)"\s*:')
_CONTEXT_ERRORS = {"ContextWindowError"}
_STDERR_TAIL = 2000


@dataclass(slots=True)
class AgentTarget:
    """The model the agent talks to and how it samples; None leaves the choice to openjet's own defaults."""

    provider: str | None = None
    base_url: str | None = None
    model: str | None = None
    # Greedy with a fixed seed by default, whatever the server's own defaults: a repeat must give the same pass/fail.
    temperature: float | None = 0.0
    seed: int | None = 0


@dataclass(slots=True)
class AgentOutcome:
    """How the agent process ended and what it said."""

    exit_code: int | None
    timed_out: bool
    wall_s: float
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: str = ""
    num_bad_lines: int = 0  # stdout lines that were not JSON events


def openjet_command() -> list[str]:
    """How to start the openjet CLI with the same interpreter as this process."""
    return [sys.executable, "-c", "import sys; from openjet_tui.cli import main; sys.exit(main())"]


def agent_command(task: TaskSpec, workspace: Path, target: AgentTarget, base: list[str] | None = None) -> list[str]:
    """The `openjet run` command line for a task."""
    command = [*(base or openjet_command()), "run", task.prompt, "--mode", "auto-edit", "--json",
               "--workspace", str(workspace)]
    for flag, value in (("--provider", target.provider), ("--base-url", target.base_url), ("--model", target.model)):
        if value:
            command += [flag, value]
    for flag, number in (("--temperature", target.temperature), ("--seed", target.seed)):
        if number is not None:  # 0 is a value here: temperature 0 is what makes a run greedy
            command += [flag, str(number)]
    return command


def parse_events(text: str) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSON Lines stream, and how many lines were something else."""
    events, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(item, dict) and "type" in item:
            events.append(item)
        else:
            bad += 1
    return events, bad


def run_agent(command: list[str], workspace: Path, env: dict[str, str], time_limit_s: float,
              log_dir: Path) -> AgentOutcome:
    """Run the agent until it exits or the time limit passes; on timeout the whole process group is killed."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = log_dir / "events.jsonl", log_dir / "stderr.txt"
    started = time.monotonic()
    # Files, not pipes: a chatty agent can never block on a full pipe while we wait on it.
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        process = subprocess.Popen(command, cwd=workspace, env=env, stdout=out, stderr=err,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process)
    wall = time.monotonic() - started
    events, bad = parse_events(stdout_path.read_text(encoding="utf-8", errors="replace"))
    stderr = stderr_path.read_text(encoding="utf-8", errors="replace")[-_STDERR_TAIL:]
    return AgentOutcome(None if timed_out else process.returncode, timed_out, wall, events, stderr, bad)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGTERM the agent's process group, then SIGKILL whatever is left, the leader's children included."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=3.0)
    except subprocess.TimeoutExpired:
        pass
    # The leader may exit on SIGTERM while a child of its ignores it: the group is killed regardless.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=5.0)


def metrics_from_events(events: list[dict[str, Any]]) -> AgentMetrics:
    """Count turns, tool calls, proposals, tokens and engine figures from the agent's events."""
    metrics = AgentMetrics()
    for event in events:
        kind = event.get("type")
        if event.get("origin", "local") == "cloud":
            continue  # Slipstream's orchestrator is not the model under test
        if kind == "assistant_message":
            metrics.turns += 1
            if not event.get("tool_calls") and _CALL_AS_TEXT.search(event.get("content") or ""):
                metrics.malformed_tool_calls += 1
        elif kind == "tool_requested":
            metrics.tool_calls += 1
        elif kind == "tool_result" and event.get("is_error") and _MALFORMED.match(event.get("content") or ""):
            metrics.malformed_tool_calls += 1
        elif kind == "proposal_resolved":
            metrics.proposals_applied += bool(event.get("applied"))
            metrics.proposals_rejected += bool(event.get("rejected")) or event.get("status") in ("stale", "failed")
        elif kind == "usage":
            metrics.prompt_tokens += int(event.get("prompt_tokens") or 0)
            metrics.generated_tokens += int(event.get("completion_tokens") or 0)
        elif kind == "engine_stats":
            metrics.add_timings(event.get("predicted_n"), event.get("predicted_per_second"),
                                event.get("draft_n"), event.get("draft_n_accepted"))
        elif kind == "error":
            metrics.errors.append(str(event.get("message") or ""))
            metrics.context_overflow |= event.get("kind") in _CONTEXT_ERRORS
    return metrics
