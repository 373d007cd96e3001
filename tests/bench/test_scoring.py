"""Scoring, end to end: `openjet run` as a real subprocess against the scripted model server on loopback, the
hidden checks, the failure reasons, the task-local shell rules and the `openjet bench tasks` command."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from openjet_tui.benchtasks.agentrun import AgentTarget
from openjet_tui.benchtasks.errors import BenchTaskError
from openjet_tui.benchtasks.report import Reporter
from openjet_tui.benchtasks.runner import ServerUnusableError, SuiteOptions, run_suite
from openjet_tui.benchtasks.suite import TaskSpec, load_suite
from openjet_tui.benchtasks.workspace import overlay_files, prepare_workspace
from openjet_tui.cli import main as openjet_main
from tests.agent.scripted_server import ScriptedReply, ScriptedServer, call, reply

SUITE = load_suite()


def user_text(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user").strip()


def has_tool_results(body: dict[str, Any]) -> bool:
    return any(m["role"] == "tool" for m in body["messages"])


def editing_model(folder_of: str):
    """A scripted model that answers each task's prompt by writing the files of its solution/ (or wrong/)."""
    tasks = {task.prompt: task for task in SUITE}

    def answer(body: dict[str, Any]) -> ScriptedReply:
        if has_tool_results(body):
            return reply("Done: the change is made.")
        task = tasks[user_text(body)]
        files = overlay_files(getattr(task, folder_of))
        return reply(tool_calls=[call("write_file", path=str(rel), content=src.read_text()) for rel, src in
                                 files.items()])

    return answer


def run(server: ScriptedServer, tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    options = SuiteOptions(AgentTarget("openai-compatible", server.base_url, "scripted"),
                           results_dir=tmp_path / "results", **kwargs)
    with open(tmp_path / "table.txt", "w") as table:
        document, path = run_suite(options, Reporter(Console(file=table, width=160)))
    assert json.loads(path.read_text()) == document
    return document


def test_correct_edits_score_100_percent(tmp_path):
    with ScriptedServer([editing_model("solution_dir")] * (3 * len(SUITE))) as server:
        document = run(server, tmp_path, is_verifying=False)  # test_tasks verifies every task's start
    summary = document["summary"]
    assert summary["runs"] == len(SUITE) and summary["pass_rate"] == 1.0 and summary["failures"] == {}
    for record in document["tasks"]:
        task = next(t for t in SUITE if t.name == record["task"])
        expected = sorted(str(rel) for rel in overlay_files(task.solution_dir))
        assert record["passed"] and record["failure"] is None
        assert record["files_changed"] == expected
        assert record["turns"] == 2 and record["tool_calls"] == len(expected) == record["proposals_applied"]
        assert record["prompt_tokens"] > 0 and record["generated_tokens"] > 0
    assert "passed 14/14 (100 %)" in (tmp_path / "table.txt").read_text()


def test_wrong_edits_score_0_percent(tmp_path):
    with ScriptedServer([editing_model("wrong_dir")] * (3 * len(SUITE))) as server:
        document = run(server, tmp_path, is_verifying=False)
    assert document["summary"]["pass_rate"] == 0.0
    assert document["summary"]["failures"] == {"wrong-edit": len(SUITE)}
    assert all(record["files_changed"] and record["check_output"] for record in document["tasks"])


@pytest.fixture
def quick_suite(tmp_path: Path) -> Path:
    """The TOML task alone, with a 4 s time limit so a hanging model times out fast."""
    suite = tmp_path / "suite"
    shutil.copytree(next(t for t in SUITE if t.name == "05-toml-cache-ttl").root, suite / "05-toml-cache-ttl")
    toml = suite / "05-toml-cache-ttl" / "task.toml"
    toml.write_text(re.sub(r"time_limit_s = \d+", "time_limit_s = 4", toml.read_text()))
    return suite


CONTEXT_ERROR = "the request exceeds the available context size, try increasing it"


@pytest.mark.parametrize(
    ("replies", "failure"),
    [
        ([reply("Looks fine to me, nothing to change.")], "no-edit"),
        ([reply(tool_calls=[call("edit_config", path="config/app.toml")]), reply("I changed it.")],
         "malformed-tool-call"),
        ([reply(status=400, error=CONTEXT_ERROR)], "context-overflow"),
        ([reply(status=500, error="model crashed")] * 5, "agent-error"),
        ([reply("Let me think", hang_after_chunks=2)], "timeout"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_failure_reasons(tmp_path, quick_suite, replies, failure):
    with ScriptedServer(replies) as server:
        started = time.monotonic()
        document = run(server, tmp_path, suite_dir=quick_suite, is_verifying=False)
    (record,) = document["tasks"]
    assert not record["passed"] and record["failure"] == failure, record
    if failure == "timeout":
        assert 4 <= record["wall_s"] < 12 and time.monotonic() - started < 30
    if failure == "context-overflow":
        assert "context" in record["detail"]


def test_shell_rules_come_from_the_task(tmp_path):
    """Task 11 allows `git log` and denies `git commit`; the model must see both decisions."""
    task: TaskSpec = next(t for t in SUITE if t.name == "11-version-from-git-log")
    solution = (task.solution_dir / "mailparse" / "__init__.py").read_text()
    replies = [
        reply(tool_calls=[call("run_shell", command="git log --format=%s -n 3")]),
        reply(tool_calls=[call("run_shell", command="git commit --allow-empty -m sneaky")]),
        reply(tool_calls=[call("run_shell", command="ls -a && cat /etc/hostname")]),
        reply(tool_calls=[call("write_file", path="mailparse/__init__.py", content=solution)]),
        reply("Set to 1.8.1."),
    ]
    with ScriptedServer(replies) as server:
        document = run(server, tmp_path, pattern="11-*", is_verifying=False)
        results = [m["content"] for m in server.chat_bodies[-1]["messages"] if m["role"] == "tool"]
    assert "Release 1.8.1" in results[0] and "Start planning the 2.0" in results[0]
    assert results[1].startswith("Error: Not run") and "git commit" in results[1]
    assert results[2].startswith("Error: Not run")  # a path outside the workspace needs a person
    (record,) = document["tasks"]
    assert record["passed"] and record["tool_calls"] == 4 and record["files_changed"] == ["mailparse/__init__.py"]


def test_unreachable_server_stops_the_suite(tmp_path):
    server = ScriptedServer()
    base_url = server.base_url  # bound, then closed without ever serving: connections are refused
    server._httpd.server_close()
    options = SuiteOptions(AgentTarget("openai-compatible", base_url, "m"), pattern="05-*",
                           results_dir=tmp_path / "results", is_verifying=False)
    with pytest.raises(ServerUnusableError, match="cannot reach"), open(tmp_path / "t.txt", "w") as table:
        run_suite(options, Reporter(Console(file=table)))
    assert not (tmp_path / "results").exists()


def test_cli_repeats_deterministically_and_prints_json(tmp_path, capsys):
    with ScriptedServer([editing_model("solution_dir")] * 6) as server:
        code = openjet_main(["bench", "tasks", "--provider", "openai-compatible", "--base-url", server.base_url,
                             "--model", "scripted", "--tasks", "toml", "--repeat", "2", "--json",
                             "--results-dir", str(tmp_path / "results")])
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    first, second = document["tasks"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    for key in ("passed", "failure", "files_changed", "turns", "tool_calls", "proposals_applied"):
        assert first[key] == second[key]
    assert document["run"]["repeat"] == 2 and document["run"]["model"] == "scripted"
    assert list((tmp_path / "results").glob("tasks-scripted-*.json"))


def test_cli_rejects_broken_tasks_without_running_the_agent(tmp_path, capsys):
    suite = tmp_path / "suite"
    task = next(t for t in SUITE if t.name == "05-toml-cache-ttl")
    shutil.copytree(task.root, suite / "05-broken")
    shutil.copytree(task.solution_dir, suite / "05-broken" / "repo", dirs_exist_ok=True)  # already solved
    with ScriptedServer() as server:
        code = openjet_main(["bench", "tasks", "--provider", "openai-compatible", "--base-url", server.base_url,
                             "--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--repeat", "2"])
        assert server.chat_bodies == []
    assert code == 1
    captured = capsys.readouterr()
    assert "rejected 05-broken" in captured.out and "passes before the agent" in captured.out
    (path,) = (tmp_path / "results").glob("*.json")
    assert json.loads(path.read_text())["summary"]["failures"] == {"broken-task": 1}


def test_cli_reports_bad_selection(tmp_path, capsys):
    code = openjet_main(["bench", "tasks", "--tasks", "no-such-task", "--results-dir", str(tmp_path)])
    assert code == 2 and "no task matches 'no-such-task'" in capsys.readouterr().err


def test_suite_refuses_to_run_pytest_checks_without_pytest(tmp_path):
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    options = SuiteOptions(pattern="05-*", python=str(bare / "bin" / "python"), results_dir=tmp_path / "results")
    with pytest.raises(BenchTaskError, match="need pytest"), open(tmp_path / "t.txt", "w") as table:
        run_suite(options, Reporter(Console(file=table)))


def test_relative_suite_path_works_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(next(t for t in SUITE if t.name == "11-version-from-git-log").root.parent.parent)
    (task,) = load_suite(Path("tasks"), "11-*")
    assert task.root.is_absolute()
    monkeypatch.chdir(tmp_path)
    workspace = prepare_workspace(task, tmp_path / "ws")  # runs setup.sh from inside the workspace
    assert (workspace / ".git").is_dir()
