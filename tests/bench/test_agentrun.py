"""Reading the agent's JSON Lines events into run counters; built from the agent core's own event classes, so a
change in their shape breaks here rather than silently zeroing the benchmark's numbers."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from openjet_tui.agent import events as ev
from openjet_tui.benchtasks.agentrun import (AgentTarget, agent_command, metrics_from_events, parse_events,
                                             run_agent)
from openjet_tui.benchtasks.suite import load_suite


def as_lines(*events: ev.Event) -> str:
    return "\n".join(json.dumps(event.to_json()) for event in events)


def test_counts_from_a_recorded_turn():
    text = as_lines(
        ev.TurnStarted("s1", "fix it"),
        ev.AssistantMessage("", "", [{"id": "c1"}, {"id": "c2"}]),
        ev.ToolRequested("c1", "read_file", {"path": "a.py"}),
        ev.ToolResult("c1", "read_file", "1: x = 1"),
        ev.ToolRequested("c2", "edit_files", {}),
        ev.ToolResult("c2", "edit_files", "Error: unknown tool 'edit_files'; available tools: read_file", True),
        ev.UsageReported(1000, 40, 1040, 8192),
        ev.EngineStats(1000, 500.0, 40, 20.0, 30, 24),
        ev.AssistantMessage("", "", [{"id": "c3"}]),
        ev.ToolRequested("c3", "edit_file", {"path": "a.py", "edits": []}),
        ev.ProposalResolved("p1", "a.py", "partial", [0], [1], "second hunk is wrong"),
        ev.ToolResult("c3", "edit_file", "applied hunk 1 of 2"),
        ev.ToolRequested("c4", "write_file", {"path": "b.py"}),
        ev.ToolResult("c4", "write_file", "Error: write_file: missing required argument 'content'", True),
        ev.UsageReported(1100, 60, 1160, 8192),
        ev.EngineStats(1100, 400.0, 60, 30.0, 50, 26),
        ev.AssistantMessage("Done.", "", []),
        ev.TurnFinished("done", 3, "Done."),
    ) + "\nnot json\n[1, 2]\n"
    events, bad = parse_events(text)
    assert bad == 2 and len(events) == 18
    metrics = metrics_from_events(events)
    assert (metrics.turns, metrics.tool_calls) == (3, 4)
    assert (metrics.proposals_applied, metrics.proposals_rejected) == (1, 1)
    assert (metrics.prompt_tokens, metrics.generated_tokens) == (2100, 100)
    assert metrics.malformed_tool_calls == 2
    assert metrics.decode_tok_s == 100 / (40 / 20.0 + 60 / 30.0)
    assert metrics.draft_acceptance == 50 / 80


def test_tool_calls_written_as_plain_text_count_as_malformed():
    fenced = '```json\n{\n  "name": "set_cache_ttl",\n  "arguments": {"ttl": 15}\n}\n```'
    events, _ = parse_events(as_lines(ev.AssistantMessage(fenced, "", []),
                                      ev.AssistantMessage("<tool_call>{oops</tool_call>", "", []),
                                      ev.AssistantMessage('The "name" field is required.', "", [])))
    assert metrics_from_events(events).malformed_tool_calls == 2


def test_context_errors_and_cloud_traffic():
    events, _ = parse_events(as_lines(
        ev.UsageReported(50000, 900, 50900, None, origin="cloud"),
        ev.ErrorEvent("the conversation no longer fits", "ContextWindowError"),
    ))
    metrics = metrics_from_events(events)
    assert metrics.context_overflow and metrics.errors == ["the conversation no longer fits"]
    assert metrics.prompt_tokens == 0  # the Slipstream orchestrator is not the model under test


def test_agent_command_passes_only_given_options(tmp_path):
    task = load_suite(pattern="05-*")[0]
    command = agent_command(task, tmp_path, AgentTarget(base_url="http://127.0.0.1:9/v1"), ["openjet"])
    assert command[:3] == ["openjet", "run", task.prompt]
    assert command[3:] == ["--mode", "auto-edit", "--json", "--workspace", str(tmp_path),
                           "--base-url", "http://127.0.0.1:9/v1", "--temperature", "0.0", "--seed", "0"]


def test_run_agent_kills_the_group_at_the_time_limit(tmp_path):
    # The child ignores SIGTERM, as a stuck tool might: only the group's SIGKILL ends it.
    script = ("import subprocess, sys, time\n"
              "print('{\"type\": \"turn_started\"}', flush=True)\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)'],"
              " stdout=subprocess.PIPE)\n"
              "child.stdout.readline()\n"
              "print(child.pid, file=sys.stderr, flush=True)\n"
              "time.sleep(60)\n")
    outcome = run_agent([sys.executable, "-c", script], tmp_path, {"PATH": "/usr/bin:/bin"}, 1.5, tmp_path / "log")
    assert outcome.timed_out and outcome.exit_code is None and 1.5 <= outcome.wall_s < 8
    assert outcome.events == [{"type": "turn_started"}]
    child = int(outcome.stderr_tail.split()[0])
    assert not _alive(child), "the agent's child survived the time limit"


def _alive(pid: int) -> bool:
    """Whether pid still runs; a zombie counts as ended (with no reaping init, a killed orphan stays one)."""
    for _ in range(40):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.05)
    return True
