"""Run records: failure classification, engine-figure aggregation, the JSON document and the table."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from openjet_tui.benchtasks import results
from openjet_tui.benchtasks.report import Reporter, run_row
from openjet_tui.benchtasks.results import AgentMetrics, RunInfo, TaskRun, classify_failure


def make_run(name: str, passed: bool, failure: str | None = None, wall_s: float = 2.0, attempt: int = 1,
             metrics: AgentMetrics | None = None) -> TaskRun:
    return TaskRun(name, "config", attempt, passed, failure, "", wall_s, metrics or AgentMetrics())


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"passed": True, "timed_out": True}, None),
        ({"timed_out": True, "files_changed": ["a.py"]}, results.TIMEOUT),
        ({"metrics": AgentMetrics(context_overflow=True), "files_changed": ["a.py"]}, results.CONTEXT_OVERFLOW),
        ({"metrics": AgentMetrics(malformed_tool_calls=2)}, results.MALFORMED_TOOL_CALL),
        ({"metrics": AgentMetrics(malformed_tool_calls=2), "files_changed": ["a.py"]}, results.WRONG_EDIT),
        ({"agent_exit": 3}, results.AGENT_ERROR),
        ({"agent_exit": 0}, results.NO_EDIT),
        ({"agent_exit": 1, "files_changed": ["a.py"]}, results.WRONG_EDIT),
    ],
)
def test_classify_failure(kwargs, expected):
    arguments = {"passed": False, "timed_out": False, "metrics": AgentMetrics(), "files_changed": [],
                 "agent_exit": 0} | kwargs
    assert classify_failure(**arguments) == expected


def test_engine_figures_are_weighted_by_work():
    metrics = AgentMetrics()
    assert metrics.decode_tok_s is None and metrics.draft_acceptance is None
    metrics.add_timings(100, 50.0, 40, 30)  # 2 s
    metrics.add_timings(300, 100.0, 60, 30)  # 3 s
    metrics.add_timings(None, None, None, None)  # a server that reports nothing changes nothing
    assert metrics.decode_tok_s == pytest.approx(400 / 5)
    assert metrics.draft_acceptance == pytest.approx(60 / 100)


def test_summary_leaves_broken_tasks_out_of_the_pass_rate():
    runs = [make_run("a", True, wall_s=4.0), make_run("b", True, wall_s=2.0),
            make_run("c", False, results.WRONG_EDIT), make_run("d", False, results.BROKEN_TASK)]
    summary = results.summarize(runs)
    assert summary["runs"] == 3 and summary["passed"] == 2
    assert summary["pass_rate"] == pytest.approx(2 / 3)
    assert summary["mean_wall_s_passed"] == 3.0
    assert summary["failures"] == {results.WRONG_EDIT: 1, results.BROKEN_TASK: 1}


def test_results_file_holds_every_field_and_never_overwrites(tmp_path):
    metrics = AgentMetrics(turns=3, tool_calls=4, proposals_applied=1, proposals_rejected=1, prompt_tokens=900,
                           generated_tokens=120)
    metrics.add_timings(120, 60.0, 10, 7)
    info = RunInfo("openjet", "http://127.0.0.1:8080/v1", "qwen/coder:0.5b", "abc123", "cpu", "2024-01-01", 1)
    document = results.results_document(info, [make_run("01-x", False, results.WRONG_EDIT, metrics=metrics)])
    first = results.write_results(document, tmp_path / "results")
    second = results.write_results(document, tmp_path / "results")
    assert first != second and first.name.startswith("tasks-qwen_coder_0.5b-")
    loaded = json.loads(first.read_text())
    assert loaded["run"]["model"] == "qwen/coder:0.5b" and loaded["summary"]["pass_rate"] == 0.0
    task = loaded["tasks"][0]
    for key in ("passed", "wall_s", "turns", "tool_calls", "proposals_applied", "proposals_rejected",
                "prompt_tokens", "generated_tokens", "decode_tok_s", "draft_acceptance", "failure"):
        assert key in task
    assert task["decode_tok_s"] == 60.0 and task["draft_acceptance"] == 0.7 and task["failure"] == "wrong-edit"


def test_reporter_prints_rows_and_final_table_when_not_a_terminal():
    out = io.StringIO()
    reporter = Reporter(Console(file=out, width=200, force_terminal=False))
    reporter.start(2)
    reporter.begin("01-a", 1)
    reporter.finish(make_run("01-a", True))
    reporter.begin("02-b", 2)
    reporter.finish(make_run("02-b", False, results.TIMEOUT, attempt=2))
    reporter.close(results.summarize(reporter.runs))
    text = out.getvalue()
    assert "01-a | pass" in text and "02-b #2 | FAIL timeout" in text
    assert "passed 1/2 (50 %)" in text


def test_quiet_reporter_prints_nothing():
    out = io.StringIO()
    reporter = Reporter(Console(file=out, force_terminal=True), is_quiet=True)
    reporter.start(1)
    reporter.finish(make_run("01-a", True))
    reporter.close(results.summarize(reporter.runs))
    assert out.getvalue() == ""


def test_row_shows_engine_figures():
    metrics = AgentMetrics(proposals_applied=2, proposals_rejected=1)
    metrics.add_timings(50, 25.0, 4, 3)
    row = run_row(make_run("t", True, metrics=metrics))
    assert row[5] == "2/1" and row[7] == "25.0" and row[8] == "75 %"
