"""Benchmark-task failures a person can act on, turned into messages only at the CLI boundary."""

from __future__ import annotations

from pathlib import Path


class BenchTaskError(Exception):
    """Base class for task-suite failures."""


class TaskDefinitionError(BenchTaskError):
    """A task folder that is incomplete or whose task.toml is invalid."""

    def __init__(self, path: Path, message: str):
        self.path = path
        super().__init__(f"{path}: {message}")


class BrokenTaskError(BenchTaskError):
    """A task whose hidden check already passes on the starting repository, so it measures nothing."""

    def __init__(self, name: str, output: str = ""):
        self.name = name
        self.output = output
        super().__init__(f"task {name!r} is broken: its check passes before the agent has done anything")


class WorkspaceSetupError(BenchTaskError):
    """A task workspace that could not be built (copy, git init or the task's setup.sh failed)."""
