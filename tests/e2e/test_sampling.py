"""Sampling settings reach the server: `openjet run --temperature/--seed`, the [sampling] settings layers, and
`openjet bench tasks`, which is greedy with a fixed seed unless told otherwise. The scripted server records
every request body, so these tests read exactly what a real server would have been sent."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from openjet_tui.benchtasks.suite import load_suite
from openjet_tui.benchtasks.workspace import overlay_files
from openjet_tui.cli import main
from openjet_tui.config import SamplingSettings, load_settings
from openjet_tui.errors import ConfigError
from tests.agent.scripted_server import ScriptedReply, ScriptedServer, call, reply


@pytest.fixture(autouse=True)
def no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """`openjet run` reads no approvals from a terminal in these tests."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))


def edit_replies() -> list[ScriptedReply]:
    """Two model turns: one edit, then a closing reply."""
    return [reply(tool_calls=[call("edit_file", path="a.txt", edits=[{"old_text": "old", "new_text": "new"}])]),
            reply("Replaced old with new.")]


def run_against(server: ScriptedServer, workspace: Path, *flags: str) -> int:
    """`openjet run` in auto-edit mode against the scripted server; returns the exit code."""
    return main(["run", "--provider", "llama-server", "--base-url", server.base_url, "--mode", "auto-edit",
                 "--workspace", str(workspace), "--json", *flags, "change old to new in a.txt"])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace holding a.txt = 'old'."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("old\n")
    return root


def test_request_fields_hold_only_what_was_set():
    assert SamplingSettings().request_fields() == {}
    assert SamplingSettings(temperature=0.0).request_fields() == {"temperature": 0.0}  # 0 is set, not absent
    assert SamplingSettings(temperature=0.3, seed=5, max_tokens=64).request_fields() == {
        "temperature": 0.3, "seed": 5, "max_tokens": 64}


def test_run_sends_temperature_and_seed_in_every_request(workspace, capsys):
    with ScriptedServer(edit_replies(), supports_tools=True) as server:
        code = run_against(server, workspace, "--temperature", "0", "--seed", "7")
        bodies = server.chat_bodies
    assert code == 0 and (workspace / "a.txt").read_text() == "new\n", capsys.readouterr()
    assert len(bodies) == 2  # the edit turn and the reply after the tool result
    for body in bodies:
        assert body["temperature"] == 0 and body["seed"] == 7
        assert "max_tokens" not in body


def test_run_without_settings_leaves_the_server_defaults(workspace):
    with ScriptedServer(edit_replies(), supports_tools=True) as server:
        assert run_against(server, workspace) == 0
        bodies = server.chat_bodies
    assert bodies and all(not {"temperature", "seed", "max_tokens"} & set(body) for body in bodies)


def test_layers_merge_and_the_command_line_wins(workspace, monkeypatch):
    (workspace / ".openjet").mkdir()
    (workspace / ".openjet" / "config.toml").write_text("[sampling]\ntemperature = 0.8\nseed = 3\n")
    monkeypatch.setenv("OPENJET_SAMPLING__MAX_TOKENS", "48")
    with ScriptedServer(edit_replies(), supports_tools=True) as server:
        assert run_against(server, workspace, "--temperature", "0") == 0
        bodies = server.chat_bodies
    assert [(b["temperature"], b["seed"], b["max_tokens"]) for b in bodies] == [(0, 3, 48)] * 2
    loaded = load_settings(workspace, {"sampling": {"temperature": 0.0}})
    assert loaded.sources["sampling.temperature"] == "command line"
    assert loaded.sources["sampling.seed"].startswith("project ")
    assert loaded.sources["sampling.max_tokens"] == "environment"


@pytest.mark.parametrize(("flags", "key"), [(["--temperature", "-0.5"], "sampling.temperature"),
                                            (["--temperature", "3"], "sampling.temperature"),
                                            (["--seed", "-1"], "sampling.seed")])
def test_bad_values_are_refused_naming_the_key(workspace, capsys, flags, key):
    with ScriptedServer(edit_replies(), supports_tools=True) as server:
        code = run_against(server, workspace, *flags)
        assert server.chat_bodies == []  # refused before anything was sent
    out = capsys.readouterr().out
    error = next(json.loads(line) for line in out.splitlines() if '"error"' in line)
    assert code == 2 and key in error["message"] and "command line" in error["message"]
    with pytest.raises(ConfigError, match="sampling.max_tokens"):
        load_settings(workspace, {"sampling": {"max_tokens": 0}})


def toml_task_model() -> Any:
    """A scripted model that solves task 05 by writing its reference solution, then says it is done."""
    task = next(t for t in load_suite() if t.name == "05-toml-cache-ttl")
    files = overlay_files(task.solution_dir)

    def answer(body: dict[str, Any]) -> ScriptedReply:
        if any(m["role"] == "tool" for m in body["messages"]):
            return reply("Done.")
        return reply(tool_calls=[call("write_file", path=str(rel), content=src.read_text())
                                 for rel, src in files.items()])

    return answer


@pytest.mark.parametrize(("flags", "expected"), [([], (0.0, 0)), (["--temperature", "0.7", "--seed", "11"],
                                                                   (0.7, 11))])
def test_bench_tasks_is_greedy_unless_told(tmp_path, capsys, flags, expected):
    with ScriptedServer([toml_task_model()] * 3, supports_tools=True) as server:
        code = main(["bench", "tasks", "--provider", "openai-compatible", "--base-url", server.base_url,
                     "--model", "scripted", "--tasks", "05-*", "--json", "--results-dir", str(tmp_path), *flags])
        bodies = server.chat_bodies
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and document["summary"]["passed"] == 1
    assert len(bodies) == 2 and all((b["temperature"], b["seed"]) == expected for b in bodies)
    assert (document["run"]["temperature"], document["run"]["seed"]) == expected
