"""Speculation on the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M with n-gram drafts (slow: the numpy reference)."""

from __future__ import annotations

import pytest
from tests.engine.spec.codeedit import REQUESTS, plain_and_speculative

from engine.gguf.reader import GGUFFile
from engine.reference.backend import ReferenceBackend
from engine.spec import SpecStats
from engine.text.chat import ChatTemplate
from engine.text.tokenizer import Tokenizer


@pytest.mark.slow
def test_ngram_speculation_keeps_greedy_output_on_code_edits(real_model_path) -> None:
    f = GGUFFile.open(real_model_path)
    backend = ReferenceBackend.from_file(f, context_size=2048)
    stats = SpecStats()
    runs = list(plain_and_speculative(backend, Tokenizer.from_gguf(f), ChatTemplate.from_gguf(f), 8, stats))
    assert len(runs) == len(REQUESTS) == 20
    for run in runs:
        assert run.speculative == run.plain, run.request
    # the file in context is there to be copied: drafts must pay off, fewer passes than tokens
    assert stats.num_accepted > 0
    assert stats.tokens_per_pass > 1.5, stats
    print(f"\nn-gram on code edits: {stats.tokens_per_pass:.2f} tokens per pass, "
          f"{stats.num_accepted}/{stats.num_drafted} drafts accepted")
