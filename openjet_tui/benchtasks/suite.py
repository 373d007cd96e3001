"""Task folders: what a benchmark task is on disk, and loading a suite of them.

A task folder holds:
  task.md      the prompt, as a person would write it
  task.toml    title, category, time limit, the task-local shell rules and how the check runs
  repo/        the starting repository the agent works in
  check/       the hidden check (pytest files, or check.sh), copied in only after the agent finishes
  solution/    the reference solution: files laid over repo/ (used to test the check, never shown to the agent)
  wrong/       optional: a plausible near miss laid over repo/ the same way, which the check must reject
  setup.sh     optional: run once in the fresh workspace after its first commit (e.g. to build git history)
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

from openjet_tui.benchtasks.errors import TaskDefinitionError

# What a suite must cover (issue 9); more categories are welcome but these are checked by name.
CATEGORIES = (
    "fix-test",
    "from-docstring",
    "refactor",
    "traceback",
    "config",
    "non-python",
    "discover",
    "feature",
    "write-test",
)
CHECK_KINDS = ("pytest", "script")
_TOP_KEYS = {"title", "category", "time_limit_s", "shell", "check"}
_SHELL_KEYS = {"allow", "deny"}
_CHECK_KEYS = {"kind", "timeout_s"}


@dataclass(slots=True, frozen=True)
class TaskSpec:
    """One benchmark task, validated."""

    name: str
    root: Path
    title: str
    category: str
    prompt: str
    time_limit_s: float
    shell_allow: tuple[str, ...]
    shell_deny: tuple[str, ...]
    check_kind: str
    check_timeout_s: float

    @property
    def repo_dir(self) -> Path:
        """The starting repository."""
        return self.root / "repo"

    @property
    def check_dir(self) -> Path:
        """The hidden check."""
        return self.root / "check"

    @property
    def solution_dir(self) -> Path:
        """The reference solution, laid over the starting repository."""
        return self.root / "solution"

    @property
    def wrong_dir(self) -> Path | None:
        """The near-miss solution, if the task has one."""
        path = self.root / "wrong"
        return path if path.is_dir() else None

    @property
    def setup_script(self) -> Path | None:
        """setup.sh if the task has one."""
        path = self.root / "setup.sh"
        return path if path.is_file() else None


def default_suite_dir() -> Path:
    """bench/tasks of the source checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "bench" / "tasks"


def _positive_number(path: Path, table: dict, key: str, default: float | None = None) -> float:
    """A number > 0 from a TOML table, or a clear error naming the key."""
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskDefinitionError(path, f"{key} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _prefixes(path: Path, shell: dict, key: str) -> tuple[str, ...]:
    """A list of non-empty command prefixes from the [shell] table."""
    value = shell.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise TaskDefinitionError(path, f"shell.{key} must be a list of non-empty command prefixes, got {value!r}")
    return tuple(item.strip() for item in value)


def _check_unknown(path: Path, table: dict, known: set[str], where: str) -> None:
    """Reject keys we do not read, so a typo cannot silently change a task."""
    unknown = sorted(set(table) - known)
    if unknown:
        raise TaskDefinitionError(path, f"unknown key(s) {', '.join(unknown)} in {where}")


def _read_toml(path: Path) -> dict:
    """Parse task.toml, turning syntax errors into TaskDefinitionError."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise TaskDefinitionError(path, "missing task.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise TaskDefinitionError(path, f"invalid TOML: {exc}") from None


def _check_layout(root: Path, check_kind: str) -> None:
    """The folders a task needs, and a check of the kind task.toml declares."""
    for folder in ("repo", "check", "solution"):
        if not (root / folder).is_dir():
            raise TaskDefinitionError(root, f"missing {folder}/ folder")
    if check_kind == "pytest" and not list((root / "check").glob("test_*.py")):
        raise TaskDefinitionError(root, "check kind is pytest but check/ has no test_*.py file")
    if check_kind == "script" and not (root / "check" / "check.sh").is_file():
        raise TaskDefinitionError(root, "check kind is script but check/check.sh is missing")


def load_task(root: Path) -> TaskSpec:
    """Read and validate one task folder."""
    root = Path(root).resolve()  # setup.sh and the check run from inside the workspace, not from here
    toml_path = root / "task.toml"
    data = _read_toml(toml_path)
    _check_unknown(toml_path, data, _TOP_KEYS, "task.toml")
    shell, check = data.get("shell", {}), data.get("check", {})
    if not isinstance(shell, dict) or not isinstance(check, dict):
        raise TaskDefinitionError(toml_path, "[shell] and [check] must be tables")
    _check_unknown(toml_path, shell, _SHELL_KEYS, "[shell]")
    _check_unknown(toml_path, check, _CHECK_KEYS, "[check]")
    title = data.get("title")
    if not isinstance(title, str) or not title.strip():
        raise TaskDefinitionError(toml_path, "title must be a non-empty string")
    if data.get("category") not in CATEGORIES:
        raise TaskDefinitionError(toml_path, f"category must be one of {CATEGORIES}, got {data.get('category')!r}")
    if check.get("kind") not in CHECK_KINDS:
        raise TaskDefinitionError(toml_path, f"check.kind must be one of {CHECK_KINDS}, got {check.get('kind')!r}")
    prompt_path = root / "task.md"
    prompt = prompt_path.read_text(encoding="utf-8").strip() if prompt_path.is_file() else ""
    if not prompt:
        raise TaskDefinitionError(root, "task.md is missing or empty")
    _check_layout(root, check["kind"])
    return TaskSpec(
        name=root.name,
        root=root,
        title=title.strip(),
        category=data["category"],
        prompt=prompt,
        time_limit_s=_positive_number(toml_path, data, "time_limit_s"),
        shell_allow=_prefixes(toml_path, shell, "allow"),
        shell_deny=_prefixes(toml_path, shell, "deny"),
        check_kind=check["kind"],
        check_timeout_s=_positive_number(toml_path, check, "timeout_s", 120),
    )


def matches(task: TaskSpec, pattern: str | None) -> bool:
    """Whether --tasks selects a task: comma-separated globs on the name, or words (a name substring or a category)."""
    if not pattern:
        return True
    for item in (part.strip() for part in pattern.split(",")):
        if not item:
            continue
        if any(char in item for char in "*?["):
            if fnmatch.fnmatchcase(task.name, item):
                return True
        elif item in task.name or item == task.category:
            return True
    return False


def load_suite(root: Path | None = None, pattern: str | None = None) -> list[TaskSpec]:
    """Every task folder under root (default bench/tasks), sorted by name, filtered by pattern."""
    root = Path(root) if root is not None else default_suite_dir()
    if not root.is_dir():
        raise TaskDefinitionError(root, "task suite folder not found")
    tasks = [load_task(path) for path in sorted(root.iterdir()) if path.is_dir() and (path / "task.toml").exists()]
    if not tasks:
        raise TaskDefinitionError(root, "no task folders (with a task.toml) found")
    selected = [task for task in tasks if matches(task, pattern)]
    if not selected:
        raise TaskDefinitionError(root, f"no task matches {pattern!r}; tasks are: {', '.join(t.name for t in tasks)}")
    return selected
