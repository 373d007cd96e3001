"""Runtime tests never touch the real cache: every test gets its own OPENJET_CACHE_DIR."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `from tests.runtime.servers import ...` whatever the working directory
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Point OpenJet's cache at a fresh folder and hide any catalog override."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPENJET_CACHE_DIR", str(cache))
    monkeypatch.delenv("OPENJET_CATALOG", raising=False)
    return cache
