"""`openjet bench tasks --time-scale X`: every task's time limit is multiplied by X, and the JSON says so."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

from openjet_tui.benchtasks.suite import load_suite
from openjet_tui.cli import main
from tests.agent.scripted_server import ScriptedServer, reply


def short_suite(tmp_path: Path, limit_s: int) -> Path:
    """Task 05 alone, with its time limit set to `limit_s`."""
    suite = tmp_path / "suite"
    task = next(t for t in load_suite() if t.name == "05-toml-cache-ttl")
    shutil.copytree(task.root, suite / task.name)
    toml = suite / task.name / "task.toml"
    toml.write_text(re.sub(r"time_limit_s = \d+", f"time_limit_s = {limit_s}", toml.read_text()))
    return suite


def test_the_scaled_limit_stops_a_hanging_model(tmp_path, capsys):
    suite = short_suite(tmp_path, 8)
    with ScriptedServer([reply("Let me think", hang_after_chunks=1)], supports_tools=True) as server:
        started = time.monotonic()
        code = main(["bench", "tasks", "--provider", "openai-compatible", "--base-url", server.base_url,
                     "--model", "scripted", "--suite", str(suite), "--time-scale", "0.25", "--json",
                     "--results-dir", str(tmp_path / "results")])
        elapsed = time.monotonic() - started
        server.release.set()
    document = json.loads(capsys.readouterr().out)
    (record,) = document["tasks"]
    assert code == 0 and record["failure"] == "timeout" and "2 s limit" in record["detail"]
    assert 2 <= record["wall_s"] < 7 and elapsed < 30  # 8 s x 0.25, plus the kill's grace period at most
    assert document["run"]["time_scale"] == 0.25


def test_a_scale_that_is_not_positive_is_refused(tmp_path, capsys):
    code = main(["bench", "tasks", "--tasks", "05-*", "--time-scale", "0", "--results-dir", str(tmp_path)])
    assert code == 2 and "--time-scale must be positive, got 0.0" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
