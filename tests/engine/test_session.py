"""Session: prefix reuse, truncation (attention-only) and checkpoint restore (DeltaNet), cancellation, bounds."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import TokenSequence
from engine.errors import ContextOverflowError
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams
from engine.session import Session

SMALL = dict(tokenizer=False, hidden_size=64, ffn_size=128, num_heads=2, num_kv_heads=1, head_dim=32)


@pytest.fixture(scope="module")
def qwen35(tiny_model_path) -> ReferenceBackend:
    return ReferenceBackend.from_gguf(tiny_model_path("qwen35", **SMALL), context_size=256)


@pytest.fixture(scope="module")
def qwen2(tiny_model_path) -> ReferenceBackend:
    return ReferenceBackend.from_gguf(tiny_model_path("qwen2", **SMALL), context_size=256)


def tokens(seed: int, count: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 512, size=count)]


def next_logits(session: Session, prompt: list[int]) -> np.ndarray:
    """Logits after the whole prompt, from the state prepare() left (feeds the pending token, then rolls back)."""
    checkpoint = session.backend.checkpoint()
    logits = session.backend.verify([prompt[-1]])[0]
    session.backend.rollback(checkpoint)
    return logits


def fresh_logits(backend: ReferenceBackend, prompt: list[int], boundaries: list[int]) -> np.ndarray:
    """The same prompt prefilled from zero with the same chunking (so the float operations are the same)."""
    session = Session(backend, chunk_size=16)
    session.prepare(prompt, boundaries)
    return next_logits(session, prompt)


def test_second_turn_prefills_only_new_tokens(qwen35: ReferenceBackend) -> None:
    session = Session(qwen35, chunk_size=16)
    first = tokens(1, 30)
    stats = session.prepare(first, [10])
    assert (stats.num_reused, stats.num_prefilled, stats.restored) == (0, 29, "prefix")  # a new session holds nothing
    # a reply is generated, then the next turn arrives carrying it
    seq = TokenSequence.start(first, SamplingParams(temperature=0))
    for _ in range(3):
        qwen35.cycle(seq, 0, SamplingParams(temperature=0))
        session.sync(seq)
    session.mark_boundary()
    second = seq.tokens + tokens(2, 12)
    stats = session.prepare(second, [10, 30, len(seq.tokens)])
    assert (stats.num_reused, stats.restored) == (len(seq.tokens) - 1, "prefix")
    assert stats.num_prefilled == len(second) - 1 - (len(seq.tokens) - 1)
    assert session.tokens == second[:-1] and qwen35.num_tokens == len(second) - 1


def test_edited_history_restores_the_nearest_checkpoint(qwen35: ReferenceBackend) -> None:
    session = Session(qwen35, chunk_size=16)
    original = tokens(3, 60)
    boundaries = [12, 25, 40]
    session.prepare(original, boundaries)
    edited = original[:30] + tokens(4, 25)  # changed from position 30 on: boundaries 12 and 25 still hold
    stats = session.prepare(edited, boundaries)
    assert (stats.restored, stats.num_reused, stats.num_prefilled) == ("checkpoint", 25, len(edited) - 1 - 25)
    # bit-identical to prefilling the edited prompt from zero with the same chunks
    assert np.array_equal(next_logits(session, edited), fresh_logits(qwen35, edited, boundaries))
    edited_early = original[:5] + tokens(5, 40)  # before every checkpoint
    stats = session.prepare(edited_early, boundaries)
    assert (stats.restored, stats.num_reused) == ("reset", 0)


def test_attention_only_models_truncate_to_the_exact_common_prefix(qwen2: ReferenceBackend) -> None:
    session = Session(qwen2, chunk_size=16)
    original = tokens(6, 50)
    session.prepare(original)
    assert session.num_checkpoints == 0  # truncation needs no checkpoints
    edited = original[:33] + tokens(7, 10)
    stats = session.prepare(edited)
    assert (stats.restored, stats.num_reused, stats.num_prefilled) == ("truncate", 33, len(edited) - 1 - 33)
    expected = fresh_logits(qwen2, edited, [])
    np.testing.assert_allclose(next_logits(session, edited), expected, rtol=1e-4, atol=1e-4)


def test_cancelled_prefill_stops_between_chunks_and_stays_consistent(qwen35: ReferenceBackend) -> None:
    session = Session(qwen35, chunk_size=8)
    prompt = tokens(8, 40)
    calls = []
    stats = session.prepare(prompt, should_stop=lambda: len(calls.append(1) or calls) > 2)
    assert stats.is_cancelled and stats.num_prefilled == 16 and qwen35.num_tokens == 16
    stats = session.prepare(prompt)  # the next request picks up where the cancelled one stopped
    assert (stats.restored, stats.num_reused, stats.num_prefilled) == ("prefix", 16, 23)


def test_checkpoints_are_bounded_least_recently_used_first(qwen35: ReferenceBackend) -> None:
    session = Session(qwen35, max_checkpoints=3, chunk_size=64)
    base = tokens(9, 40)
    session.prepare(base, [10, 20, 30])  # checkpoints at 10, 20, 30 and 39: the one at 10 is evicted
    assert session.num_checkpoints == 3
    stats = session.prepare(base[:15] + tokens(10, 5))
    assert (stats.restored, stats.num_reused) == ("reset", 0)  # 10 was evicted; nothing at or before 15 is left


def test_invalidate_and_limits(qwen35: ReferenceBackend) -> None:
    session = Session(qwen35, chunk_size=16)
    session.prepare(tokens(11, 20), [5])
    session.invalidate()
    assert session.tokens == [] and session.num_checkpoints == 0 and qwen35.num_tokens == 0
    with pytest.raises(ContextOverflowError, match="257 tokens do not fit the context window of 256"):
        session.prepare(tokens(12, 257))
    with pytest.raises(ValueError, match="no tokens"):
        session.prepare([])
    with pytest.raises(ValueError, match="chunk_size"):
        Session(qwen35, chunk_size=0)
