"""What one task run records, how a failure is classified, and the JSON document a suite run leaves behind."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Why a run failed. The first four are the issue's; the rest say what else went wrong, never "unknown".
TIMEOUT = "timeout"
WRONG_EDIT = "wrong-edit"
MALFORMED_TOOL_CALL = "malformed-tool-call"
CONTEXT_OVERFLOW = "context-overflow"
NO_EDIT = "no-edit"  # the agent stopped without changing any file
AGENT_ERROR = "agent-error"  # the agent process failed for another reason (server unreachable, crash)
BROKEN_TASK = "broken-task"  # the check passed before the agent ran: the task measures nothing
FAILURE_REASONS = (TIMEOUT, WRONG_EDIT, MALFORMED_TOOL_CALL, CONTEXT_OVERFLOW, NO_EDIT, AGENT_ERROR, BROKEN_TASK)
SCHEMA_VERSION = 1


@dataclass(slots=True)
class AgentMetrics:
    """Counters gathered from the agent's event stream for one run."""

    turns: int = 0
    tool_calls: int = 0
    proposals_applied: int = 0
    proposals_rejected: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    malformed_tool_calls: int = 0
    context_overflow: bool = False
    errors: list[str] = field(default_factory=list)
    # Engine figures summed over requests, so rates are weighted by work, not averaged per request.
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    draft_tokens: int = 0
    draft_accepted: int = 0

    def add_timings(self, predicted_n: int | None, predicted_per_second: float | None,
                    draft_n: int | None, draft_n_accepted: int | None) -> None:
        """Fold in one request's engine timings (llama.cpp's `timings` fields)."""
        if predicted_n and predicted_per_second:
            self.decode_tokens += predicted_n
            self.decode_seconds += predicted_n / predicted_per_second
        if draft_n:
            self.draft_tokens += draft_n
            self.draft_accepted += draft_n_accepted or 0

    @property
    def decode_tok_s(self) -> float | None:
        """Decode speed as the engine reported it, over every request of the run."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def draft_acceptance(self) -> float | None:
        """Share of drafted tokens accepted, when the engine drafted at all."""
        return self.draft_accepted / self.draft_tokens if self.draft_tokens else None


@dataclass(slots=True)
class TaskRun:
    """The record of one attempt at one task."""

    task: str
    category: str
    attempt: int
    passed: bool
    failure: str | None
    detail: str
    wall_s: float
    metrics: AgentMetrics
    files_changed: list[str] = field(default_factory=list)
    check_output: str = ""

    def to_json(self) -> dict[str, Any]:
        """A flat JSON object: the issue's fields first, then diagnostics."""
        m = self.metrics
        return {
            "task": self.task, "category": self.category, "attempt": self.attempt, "passed": self.passed,
            "failure": self.failure, "detail": self.detail, "wall_s": round(self.wall_s, 3),
            "turns": m.turns, "tool_calls": m.tool_calls,
            "proposals_applied": m.proposals_applied, "proposals_rejected": m.proposals_rejected,
            "prompt_tokens": m.prompt_tokens, "generated_tokens": m.generated_tokens,
            "decode_tok_s": None if m.decode_tok_s is None else round(m.decode_tok_s, 2),
            "draft_acceptance": None if m.draft_acceptance is None else round(m.draft_acceptance, 4),
            "malformed_tool_calls": m.malformed_tool_calls, "errors": m.errors,
            "files_changed": self.files_changed, "check_output": self.check_output,
        }


def classify_failure(*, passed: bool, timed_out: bool, metrics: AgentMetrics, files_changed: list[str],
                     agent_exit: int | None) -> str | None:
    """Why a run failed (None when it passed); the most specific cause wins."""
    if passed:
        return None
    if timed_out:
        return TIMEOUT
    if metrics.context_overflow:
        return CONTEXT_OVERFLOW
    if metrics.malformed_tool_calls and not files_changed:
        return MALFORMED_TOOL_CALL
    if agent_exit not in (0, None) and not files_changed:
        return AGENT_ERROR
    if not files_changed:
        return NO_EDIT
    return WRONG_EDIT


@dataclass(slots=True)
class RunInfo:
    """Where and with what a suite ran: quoted beside the numbers."""

    provider: str | None
    base_url: str | None
    model: str | None
    commit: str | None
    machine: str
    started: str
    repeat: int
    temperature: float | None = None  # as sent with every request; None: the server's default
    seed: int | None = None
    time_scale: float = 1.0  # multiplier applied to every task's time limit


def git_commit(root: Path) -> str | None:
    """The checkout's HEAD commit (with -dirty when it has changes), or None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_description() -> str:
    """CPU model, core count and OS: enough to tell two result files apart."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def summarize(runs: list[TaskRun]) -> dict[str, Any]:
    """Pass rate, time to done and failure counts over the runs that measured something."""
    scored = [run for run in runs if run.failure != BROKEN_TASK]
    passed = [run for run in scored if run.passed]
    failures = {reason: sum(run.failure == reason for run in runs) for reason in FAILURE_REASONS}
    return {
        "runs": len(scored),
        "passed": len(passed),
        "pass_rate": len(passed) / len(scored) if scored else 0.0,
        "mean_wall_s_passed": round(sum(r.wall_s for r in passed) / len(passed), 3) if passed else None,
        "total_wall_s": round(sum(r.wall_s for r in runs), 3),
        "failures": {reason: count for reason, count in failures.items() if count},
    }


def results_document(info: RunInfo, runs: list[TaskRun]) -> dict[str, Any]:
    """The whole JSON document of a suite run."""
    return {"schema": SCHEMA_VERSION, "kind": "bench-tasks", "run": asdict(info), "summary": summarize(runs),
            "tasks": [run.to_json() for run in runs]}


def write_results(document: dict[str, Any], results_dir: Path) -> Path:
    """Write the document as bench/results/tasks-<model>-<time>.json; returns the path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    model = "".join(c if c.isalnum() or c in "-._" else "_" for c in document["run"].get("model") or "default")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = results_dir / f"tasks-{model}-{stamp}.json"
    counter = 1
    while path.exists():  # two runs in one second must not overwrite each other
        counter += 1
        path = results_dir / f"tasks-{model}-{stamp}-{counter}.json"
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path
