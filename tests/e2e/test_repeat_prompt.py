"""A repeat sends the model byte-identical requests: every attempt at a task runs in the same folder (the system
prompt names it), with or without --keep, so a greedy model gives the same reply and the same pass/fail."""

from __future__ import annotations

import json

from openjet_tui.benchtasks.runner import stable_run_dir, task_lock
from openjet_tui.benchtasks.suite import load_suite
from openjet_tui.cli import main
from tests.agent.scripted_server import ScriptedServer, reply


def test_attempts_send_identical_requests_and_keep_copies_each(tmp_path, capsys):
    keep = tmp_path / "kept"
    with ScriptedServer([reply("I would change the TTL.")] * 2, supports_tools=True) as server:
        code = main(["bench", "tasks", "--provider", "openai-compatible", "--base-url", server.base_url,
                     "--model", "scripted", "--tasks", "05-*", "--repeat", "2", "--keep", str(keep), "--json",
                     "--results-dir", str(tmp_path / "results")])
        first, second = server.chat_bodies
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and [t["failure"] for t in document["tasks"]] == ["no-edit", "no-edit"]
    assert first == second  # system prompt (with the workspace path), task, tools, sampling: all the same
    task = next(t for t in load_suite() if t.name == "05-toml-cache-ttl")
    system = first["messages"][0]["content"]
    assert str(stable_run_dir(task) / "workspace") in system
    for attempt in (1, 2):  # each attempt's workspace and events were copied out before the next one ran
        kept = keep / f"{task.name}-{attempt}"
        assert (kept / "workspace" / "config" / "app.toml").is_file()
        assert "turn_finished" in (kept / "logs" / "events.jsonl").read_text()
    with task_lock(task):  # another test's attempt at the task (another worker) may hold the folder meanwhile
        assert not stable_run_dir(task).exists()  # the shared folder is cleared after the attempt
