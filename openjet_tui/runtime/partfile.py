"""Partial-download files and the free-space check shared by every source."""

from __future__ import annotations

import shutil
from pathlib import Path

from openjet_tui.runtime.errors import DiskSpaceError


def part_paths(dest: Path) -> tuple[Path, Path]:
    """The partial file and its JSON sidecar (what the partial was made from) for a destination."""
    return dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")


def check_disk_space(folder: Path, needed: int, what: str) -> None:
    """Raise DiskSpaceError before a transfer if `folder`'s filesystem has less than `needed` bytes free."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise DiskSpaceError(
            f"{what} needs {needed / 2**30:.2f} GiB on {folder}, which has only {free / 2**30:.2f} GiB free; "
            f"free some space or set OPENJET_CACHE_DIR to a larger disk")
