"""Fixtures for the text tests: the real Qwen2.5-Coder vocabulary (assets/vocab) and llama.cpp's golden ids."""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from engine.gguf.reader import GGUFFile
from engine.text.tokenizer import Tokenizer

HERE = Path(__file__).resolve().parent
VOCAB_XZ = HERE.parents[2] / "assets" / "vocab" / "qwen2.5-coder.gguf.xz"


@pytest.fixture(scope="session")
def qwen_vocab_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vocabulary-only Qwen2.5-Coder GGUF, decompressed once per session."""
    path = tmp_path_factory.mktemp("vocab") / "qwen2.5-coder.gguf"
    path.write_bytes(lzma.decompress(VOCAB_XZ.read_bytes()))
    return path


@pytest.fixture(scope="session")
def qwen_metadata(qwen_vocab_path: Path) -> dict[str, Any]:
    """Its metadata (treat as read-only: tests that change keys copy it first)."""
    return GGUFFile.open(qwen_vocab_path).metadata


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_vocab_path: Path) -> Tokenizer:
    """Its tokenizer, built through the GGUF reader like the engine does."""
    return Tokenizer.from_gguf(GGUFFile.open(qwen_vocab_path))


@pytest.fixture(scope="session")
def golden() -> dict[str, Any]:
    """llama.cpp's ids for the corpus in make_llama_cpp_golden.py."""
    return json.loads((HERE / "llama_cpp_golden.json").read_text(encoding="utf-8"))
