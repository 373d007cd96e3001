"""A draft vocabulary smaller than the model's (engine/backend.py DRAFT_VOCAB_ENV): the MTP head drafts from the
first N token ids only. It changes which drafts are proposed and kept, never the output."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.reference.conftest import generate, tiny_model, tokens
from engine.backend import DRAFT_VOCAB_ENV, draft_vocab_size
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def test_the_size_comes_from_the_argument_then_the_environment_then_the_vocabulary(monkeypatch) -> None:
    monkeypatch.delenv(DRAFT_VOCAB_ENV, raising=False)
    assert draft_vocab_size(128) == 128
    monkeypatch.setenv(DRAFT_VOCAB_ENV, " 32 ")
    assert draft_vocab_size(128) == 32
    assert draft_vocab_size(128, 64) == 64  # the caller's own choice first


@pytest.mark.parametrize("raw, says", [("many", "not a whole number"), ("3.5", "not a whole number"),
                                       ("0", "1..128"), ("129", "1..128")])
def test_a_size_that_is_no_number_or_outside_the_vocabulary_is_refused_by_name(monkeypatch, raw, says) -> None:
    monkeypatch.setenv(DRAFT_VOCAB_ENV, raw)
    with pytest.raises(ValueError, match=f"{DRAFT_VOCAB_ENV}.*{says}"):
        draft_vocab_size(128)
    with pytest.raises(ValueError, match=f"{DRAFT_VOCAB_ENV}.*{says}"):
        ReferenceBackend(tiny_model("qwen35"))  # a backend with a head to draft with says so when made


def test_a_model_without_a_head_ignores_it(monkeypatch) -> None:
    monkeypatch.setenv(DRAFT_VOCAB_ENV, "many")
    assert not ReferenceBackend(tiny_model("qwen3")).can_draft


def test_the_head_drafts_only_from_the_first_ids() -> None:
    whole = ReferenceBackend(tiny_model("qwen35"))
    small = ReferenceBackend(tiny_model("qwen35"), draft_vocab=16)
    for backend in (whole, small):
        backend.prefill(tokens(10))
    full, cut = whole.draft(17, 4), small.draft(17, 4)
    assert all(t < 16 for t in cut.tokens) and any(t >= 16 for t in full.tokens)  # the model's own choices differ
    assert np.isneginf(cut.logits[:, 16:]).all() and np.isfinite(cut.logits[:, :16]).all()
    assert cut.tokens == [int(np.argmax(row)) for row in cut.logits]
    # step 0 sees the same inputs in both: its first 16 logits are the whole head's
    np.testing.assert_array_equal(cut.logits[0, :16], full.logits[0, :16])


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.9, top_p=0.95, seed=4)])
def test_the_output_is_the_same_whatever_the_draft_vocabulary(params) -> None:
    prompt = tokens(5)
    plain, _ = generate(ReferenceBackend(tiny_model("qwen35")), prompt, 16, params)
    drafted, stats = generate(ReferenceBackend(tiny_model("qwen35"), draft_vocab=16), prompt, 16, params, n_draft=3)
    assert drafted == plain and all(s.num_drafted == 3 for s in stats)


def test_the_cuda_heads_first_rows_are_read_straight_from_the_file(tiny_model_path) -> None:
    """engine/cuda/weights.py head_rows: the bytes a restricted draft head uploads are the first rows of the
    quantized table, so they dequantize to the first rows of the whole one."""
    from engine.cuda.weights import head_rows
    from engine.gguf.quants import dequantize
    from engine.gguf.reader import GGUFFile
    from engine.model.config import ModelConfig
    from engine.model.weights import bind_weights

    f = GGUFFile.open(tiny_model_path("qwen35", tokenizer=False, vocab_size=512))
    cfg = ModelConfig.from_gguf(f)
    head = bind_weights(f, cfg).global_tensors["output"]
    rows, cols = head.shape
    part = head_rows(head, 100)
    assert part.flags.c_contiguous and part.shape[0] == 100
    whole = dequantize(head.data, head.qtype, head.shape).reshape(rows, cols)
    np.testing.assert_array_equal(dequantize(part, head.qtype, (100, cols)).reshape(100, cols), whole[:100])
