"""A kernel cache with every file compiled for sm_90 by `openjet-engine compile`, built once per test process.

The full compile is the slow part (about 18 s of CPU), so the kernel and setup tests share one and copy it where
they change it. The first run's JSON Lines events are kept beside it for the tests that check them.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class CompileRun:
    """One `openjet-engine compile --json` process: exit status, parsed events, stderr."""

    returncode: int
    events: list[dict]
    stderr: str

    def files(self) -> list[dict]:
        """The per-file events, in the order they arrived."""
        return [e for e in self.events if e["event"] == "file"]


def run_compile(cache: Path, *args: str, timeout: float = 300) -> CompileRun:
    """Run `python -m engine.cli compile --json ARGS` with its kernel cache at `cache`."""
    env = {**os.environ, "OPENJET_KERNEL_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "compile", "--json", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return CompileRun(done.returncode, events, done.stderr)


_FULL: tuple[Path, CompileRun] | None = None


def full_sm90_cache() -> tuple[Path, CompileRun]:
    """(cache folder, the run that filled it): every kernel file compiled for sm_90, two processes at a time."""
    global _FULL
    if _FULL is None:
        folder = Path(tempfile.mkdtemp(prefix="openjet-kernels-sm90-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        run = run_compile(folder, "--arch", "90", "--jobs", "2")
        assert run.returncode == 0, run.stderr
        _FULL = folder, run
    return _FULL


def copy_full_sm90_cache(destination: Path) -> Path:
    """A private copy of the shared sm_90 cache (for tests that add to it or delete from it)."""
    source, _ = full_sm90_cache()
    shutil.copytree(source, destination)
    return destination
