"""The workspace: the one folder the agent may touch without asking. Every path is checked with symlinks resolved."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from openjet_tui.errors import WorkspaceError

# Folders no tool walks into: version control, environments, caches and build output.
IGNORED_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", ".hypothesis", ".tox", ".idea"})


class Workspace:
    """A root folder and the rules for paths inside it."""

    def __init__(self, root: str | Path):
        path = Path(root).expanduser()
        if not path.is_dir():
            raise WorkspaceError(f"workspace {str(root)!r} is not a folder")
        self.root = Path(os.path.realpath(path))

    def resolve(self, path: str | Path) -> Path:
        """An absolute path with every symlink resolved (a relative path is taken from the root)."""
        text = str(path)
        if not text.strip():
            raise WorkspaceError("empty path")
        if "\x00" in text:
            raise WorkspaceError(f"path {text!r} contains a NUL byte")
        candidate = Path(text).expanduser()
        if not candidate.is_absolute():
            candidate = self.root / candidate
        return Path(os.path.realpath(candidate))

    def contains(self, resolved: Path) -> bool:
        """True when a resolved path is the root or lies below it."""
        return resolved == self.root or self.root in resolved.parents

    def relative(self, resolved: Path) -> str:
        """The path as shown to people and the model: relative inside the workspace, absolute outside."""
        if self.contains(resolved):
            rel = resolved.relative_to(self.root).as_posix()
            return rel or "."
        return str(resolved)

    def walk_files(self, start: Path | None = None, limit: int = 20000) -> Iterator[Path]:
        """Files under start (default: the root), skipping ignored folders, without following folder symlinks."""
        top = start or self.root
        count = 0
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS)
            for name in sorted(files):
                yield Path(folder) / name
                count += 1
                if count >= limit:
                    return


def read_text(path: Path, shown: str) -> str:
    """A file's text, exactly (line endings kept); clear errors for missing, binary or non-UTF-8 files."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise WorkspaceError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise WorkspaceError(f"{shown}: is a folder, not a file") from None
    except PermissionError:
        raise WorkspaceError(f"{shown}: permission denied") from None
    if b"\x00" in data[:8192]:
        raise WorkspaceError(f"{shown}: binary file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkspaceError(f"{shown}: not UTF-8 text (byte {exc.start})") from None
