"""The task suite in bench/tasks: every hidden check fails on the start and passes on the reference solution; the
harness rejects broken tasks, builds identical workspaces and keeps the check out of the agent's reach."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from openjet_tui.benchtasks.errors import BrokenTaskError, TaskDefinitionError, WorkspaceSetupError
from openjet_tui.benchtasks.suite import load_suite, load_task, matches
from openjet_tui.benchtasks.workspace import (
    CHECK_DIRNAME,
    apply_solution,
    ensure_not_broken,
    overlay_files,
    prepare_workspace,
    run_check,
)

SUITE = load_suite()
REQUIRED_CATEGORIES = {"fix-test", "from-docstring", "refactor", "traceback", "config", "non-python", "discover"}


def by_name(name: str):
    return next(task for task in SUITE if task.name == name)


def test_suite_size_and_coverage():
    assert len(SUITE) >= 12
    assert REQUIRED_CATEGORIES <= {task.category for task in SUITE}
    # Non-Python edits must span several file kinds, not one.
    non_python = {path.suffix or path.name for task in SUITE if task.category == "non-python"
                  for path in overlay_files(task.solution_dir)}
    assert {".json", ".md", ".sh", "Makefile"} <= non_python


@pytest.mark.parametrize("task", SUITE, ids=lambda task: task.name)
def test_check_fails_on_the_starting_repository(task, tmp_path):
    result = ensure_not_broken(task, tmp_path)
    assert not result.passed and not result.timed_out, result.output


@pytest.mark.parametrize("task", SUITE, ids=lambda task: task.name)
def test_check_passes_on_the_reference_solution(task, tmp_path):
    workspace = prepare_workspace(task, tmp_path / "ws")
    apply_solution(task, workspace)
    result = run_check(task, workspace)
    assert result.passed, result.output


@pytest.mark.parametrize("task", SUITE, ids=lambda task: task.name)
def test_task_folder_hygiene(task):
    repo_files = {path.relative_to(task.repo_dir) for path in task.repo_dir.rglob("*") if path.is_file()}
    assert not any("__pycache__" in path.parts or path.suffix == ".pyc" for path in repo_files)
    # Every task has a near miss; test_scoring's wrong-edit run checks that each one fails its check.
    assert task.wrong_dir is not None, f"{task.name} has no wrong/ near miss"
    for folder in (task.solution_dir, task.wrong_dir):
        for relative, source in overlay_files(folder).items():
            original = task.repo_dir / relative
            assert not original.exists() or original.read_bytes() != source.read_bytes(), f"{relative} unchanged"
    # The agent must not be told where the check lives, nor see it in its repository.
    assert CHECK_DIRNAME not in task.prompt
    assert not (task.repo_dir / CHECK_DIRNAME).exists()
    assert task.shell_allow and 30 <= task.time_limit_s <= 900


def test_workspaces_are_deterministic(tmp_path):
    task = by_name("11-version-from-git-log")
    heads = []
    for name in ("a", "b"):
        workspace = prepare_workspace(task, tmp_path / name)
        git = ["git", "-C", str(workspace)]
        heads.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout)
        status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout
        assert status == ""
    assert heads[0] == heads[1] and len(heads[0].strip()) == 40
    log = subprocess.run([*git, "log", "--format=%s"], capture_output=True, text=True).stdout.splitlines()
    assert log[-1] == "Initial import" and "Release 1.8.1" in log


def test_agent_cannot_plant_its_own_check(tmp_path):
    task = by_name("01-word-count")
    workspace = prepare_workspace(task, tmp_path / "ws")
    planted = workspace / CHECK_DIRNAME
    planted.mkdir()
    (planted / "test_check.py").write_text("def test_nothing():\n    pass\n")
    (planted / "test_extra.py").write_text("def test_more():\n    pass\n")
    result = run_check(task, workspace)
    assert not result.passed
    assert not (planted / "test_extra.py").exists()


def write_task(root: Path, name: str = "t", *, check_sh: str = "exit 1\n", toml: str | None = None) -> Path:
    """A minimal synthetic task with a shell check."""
    folder = root / name
    for sub in ("repo", "check", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "repo" / "value.txt").write_text("old\n")
    (folder / "solution" / "value.txt").write_text("new\n")
    (folder / "check" / "check.sh").write_text(check_sh)
    (folder / "task.md").write_text("Change value.txt to say new.\n")
    (folder / "task.toml").write_text(toml if toml is not None else (
        'title = "t"\ncategory = "config"\ntime_limit_s = 60\n[shell]\nallow = ["cat"]\n'
        '[check]\nkind = "script"\ntimeout_s = 20\n'))
    return folder


def test_harness_rejects_a_task_whose_check_already_passes(tmp_path):
    task = load_task(write_task(tmp_path / "suite", check_sh="grep -q old value.txt\n"))
    with pytest.raises(BrokenTaskError, match="passes before the agent"):
        ensure_not_broken(task, tmp_path)
    good = load_task(write_task(tmp_path / "suite", "good", check_sh="grep -qx new value.txt\n"))
    assert not ensure_not_broken(good, tmp_path).passed


def test_check_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    script = f"sleep 60 &\necho $! > {pid_file}\nwait\n"
    toml = 'title = "t"\ncategory = "config"\ntime_limit_s = 60\n[check]\nkind = "script"\ntimeout_s = 1\n'
    task = load_task(write_task(tmp_path / "suite", check_sh=script, toml=toml))
    workspace = prepare_workspace(task, tmp_path / "ws")
    started = time.monotonic()
    result = run_check(task, workspace)
    assert result.timed_out and not result.passed and result.returncode is None
    assert time.monotonic() - started < 15
    sleeper = int(pid_file.read_text())
    for _ in range(50):  # the kill is asynchronous; give the kernel a moment to reap
        try:
            os.kill(sleeper, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the check's child process survived the timeout")


def test_failing_setup_script_is_reported(tmp_path):
    folder = write_task(tmp_path / "suite")
    (folder / "setup.sh").write_text("echo 'no such tool' >&2\nexit 3\n")
    with pytest.raises(WorkspaceSetupError, match="no such tool"):
        prepare_workspace(load_task(folder), tmp_path / "ws")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('title = "t"\ncategory = "cooking"\ntime_limit_s = 60\n[check]\nkind = "script"\n', "category must be"),
        ('title = "t"\ncategory = "config"\ntime_limit_s = -1\n[check]\nkind = "script"\n', "time_limit_s"),
        ('title = "t"\ncategory = "config"\ntime_limit_s = 60\n[check]\nkind = "docker"\n', "check.kind"),
        ('title = "t"\ncategory = "config"\ntime_limt_s = 60\n[check]\nkind = "script"\n', "time_limt_s"),
        ('title = "t"\ncategory = "config"\ntime_limit_s = 60\n[shell]\nallow = "ls"\n[check]\nkind = "script"\n',
         "shell.allow"),
        ('title = "t"\ncategory = "config"\ntime_limit_s = 60\n[check]\nkind = "pytest"\n', "no test_"),
        ('title = "t"\ncategory = ', "invalid TOML"),
    ],
)
def test_invalid_task_definitions_name_the_problem(tmp_path, toml, message):
    folder = write_task(tmp_path, toml=toml)
    with pytest.raises(TaskDefinitionError, match=message) as caught:
        load_task(folder)
    assert str(folder) in str(caught.value)


def test_missing_parts_are_named(tmp_path):
    folder = write_task(tmp_path)
    (folder / "task.md").write_text("  \n")
    with pytest.raises(TaskDefinitionError, match="task.md"):
        load_task(folder)
    (folder / "task.md").write_text("Do it.\n")
    (folder / "solution" / "value.txt").unlink()
    (folder / "solution").rmdir()
    with pytest.raises(TaskDefinitionError, match="solution/"):
        load_task(folder)


def test_task_selection_patterns():
    task = by_name("11-version-from-git-log")
    assert matches(task, None) and matches(task, "")
    assert matches(task, "git-log") and matches(task, "discover") and matches(task, "1[01]-*")
    assert matches(task, "01-*, 11-*") and not matches(task, "01-*")
    assert not matches(task, "config") and not matches(task, "version-from-git-logs")
    assert [t.name for t in load_suite(pattern="config")] == ["05-toml-cache-ttl", "06-ini-production-pool"]
    with pytest.raises(TaskDefinitionError, match="no task matches"):
        load_suite(pattern="no-such-task")
