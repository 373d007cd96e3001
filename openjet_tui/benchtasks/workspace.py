"""A task's workspace: a fresh copy of its repository, the reference solution, and running the hidden check."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from openjet_tui.benchtasks.errors import BrokenTaskError, WorkspaceSetupError
from openjet_tui.benchtasks.suite import TaskSpec

# The hidden check is copied here after the agent finishes; any folder of this name the agent made is replaced.
CHECK_DIRNAME = ".openjet-check"
# Fixed identity and dates so every workspace's history (and so `git log`) is the same on every run.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "OpenJet Bench",
    "GIT_AUTHOR_EMAIL": "bench@openjet.invalid",
    "GIT_COMMITTER_NAME": "OpenJet Bench",
    "GIT_COMMITTER_EMAIL": "bench@openjet.invalid",
    "GIT_AUTHOR_DATE": "2024-01-15T09:00:00+00:00",
    "GIT_COMMITTER_DATE": "2024-01-15T09:00:00+00:00",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
_OUTPUT_TAIL = 4000
_EXCLUDES = ("__pycache__/", "*.pyc", ".pytest_cache/", "/.openjet/", f"/{CHECK_DIRNAME}/")


@dataclass(slots=True)
class CheckResult:
    """How the hidden check ended."""

    passed: bool
    returncode: int | None
    output: str
    duration_s: float
    timed_out: bool = False


def task_env(python: str | None = None) -> dict[str, str]:
    """Environment for setup, the agent's shell and the check: `python` first on PATH, no stray pytest or git config."""
    python = python or sys.executable
    # PYTHONPATH and friends would leak the harness's imports into the task; PYTHON_* (keyring backend) are fine.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTEST_", "GIT_")) and not (key.startswith("PYTHON") and key[6:7] != "_")}
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", os.defpath)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Plugins installed beside the harness (snapshot, asyncio, ...) have no business in a task's check, and are slow.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.update(_GIT_ENV)
    return env


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run a setup step; failures become WorkspaceSetupError with the step's output."""
    try:
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkspaceSetupError(f"{' '.join(command)} in {cwd}: {exc}") from exc
    if result.returncode != 0:
        raise WorkspaceSetupError(f"{' '.join(command)} in {cwd} exited {result.returncode}: {result.stderr.strip()}")
    return result


def prepare_workspace(task: TaskSpec, dest: Path, python: str | None = None) -> Path:
    """Copy the task's repository into dest (which must not exist), commit it as "Initial import", run setup.sh."""
    dest = Path(dest)
    if dest.exists():
        raise WorkspaceSetupError(f"workspace {dest} already exists")
    shutil.copytree(task.repo_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = task_env(python)
    _run(["git", "init", "-q", "-b", "main"], dest, env, 30)
    # Byproducts of running code or the harness are not changes the agent made, and `git status` should say so.
    (dest / ".git" / "info").mkdir(parents=True, exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text("\n".join(_EXCLUDES) + "\n")
    _run(["git", "add", "-A"], dest, env, 30)
    _run(["git", "commit", "-q", "-m", "Initial import"], dest, env, 30)
    if task.setup_script is not None:
        _run(["bash", str(task.setup_script)], dest, env, 60)
    return dest


def overlay_files(folder: Path) -> dict[Path, Path]:
    """The files of an overlay folder (solution/ or wrong/): relative path -> source path."""
    return {
        source.relative_to(folder): source
        for source in sorted(Path(folder).rglob("*"))
        if source.is_file() and "__pycache__" not in source.parts
    }


def apply_overlay(folder: Path, workspace: Path) -> list[Path]:
    """Lay an overlay folder's files over the workspace (keeping modes); returns the relative paths written."""
    written = []
    for relative, source in overlay_files(folder).items():
        target = Path(workspace) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        written.append(relative)
    return written


def apply_solution(task: TaskSpec, workspace: Path) -> list[Path]:
    """Lay the task's reference solution over the workspace."""
    return apply_overlay(task.solution_dir, workspace)


def install_check(task: TaskSpec, workspace: Path) -> Path:
    """Copy the hidden check into the workspace, replacing anything the agent left under that name."""
    target = Path(workspace) / CHECK_DIRNAME
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    shutil.copytree(task.check_dir, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def check_command(task: TaskSpec, python: str) -> list[str]:
    """The command that runs the installed check, from the workspace root."""
    if task.check_kind == "pytest":
        return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", CHECK_DIRNAME]
    return ["bash", f"{CHECK_DIRNAME}/check.sh"]


def run_check(task: TaskSpec, workspace: Path, python: str | None = None) -> CheckResult:
    """Install and run the hidden check in the workspace; passed means exit status 0 within the time limit."""
    python = python or sys.executable
    install_check(task, workspace)
    started = time.monotonic()
    # A new session lets a timeout kill everything the check started (make, subprocesses), not just its shell.
    process = subprocess.Popen(
        check_command(task, python),
        cwd=workspace,
        env=task_env(python),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=task.check_timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it ended between the timeout and the kill
        output, _ = process.communicate()
        return CheckResult(False, None, output[-_OUTPUT_TAIL:], time.monotonic() - started, timed_out=True)
    duration = time.monotonic() - started
    return CheckResult(process.returncode == 0, process.returncode, output[-_OUTPUT_TAIL:], duration)


def ensure_not_broken(task: TaskSpec, scratch: Path, python: str | None = None) -> CheckResult:
    """Run the check on an untouched copy of the starting repository; raise BrokenTaskError if it passes."""
    workspace = prepare_workspace(task, Path(scratch) / f"{task.name}-pristine", python)
    try:
        result = run_check(task, workspace, python)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    if result.passed:
        raise BrokenTaskError(task.name, result.output)
    return result
