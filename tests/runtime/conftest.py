"""Runtime tests never touch the real cache: every test gets its own OPENJET_CACHE_DIR."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Point OpenJet's cache at a fresh folder and hide any catalog override."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPENJET_CACHE_DIR", str(cache))
    monkeypatch.delenv("OPENJET_CATALOG", raising=False)
    return cache
