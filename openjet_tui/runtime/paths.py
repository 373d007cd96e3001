"""Where OpenJet keeps machine-local state: models, built engines, logs, the setup record."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The root of OpenJet's cache: $OPENJET_CACHE_DIR, else $XDG_CACHE_HOME/openjet, else ~/.cache/openjet."""
    override = os.environ.get("OPENJET_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "openjet"


def models_dir() -> Path:
    """Where verified model files live (one flat folder, catalog filenames)."""
    return cache_dir() / "models"


def llama_cpp_dir() -> Path:
    """Where llama-server builds are cached, one folder per build and backend (e.g. b11434-cpu)."""
    return cache_dir() / "llama.cpp"


def logs_dir() -> Path:
    """Where engine workers' stderr and setup logs go."""
    return cache_dir() / "logs"


def setup_record_path() -> Path:
    """The JSON record of the last completed setup (model file and engine decisions)."""
    return cache_dir() / "setup.json"


def ensure_dir(path: Path) -> Path:
    """Create a folder (and parents) if missing and return it."""
    path.mkdir(parents=True, exist_ok=True)
    return path
