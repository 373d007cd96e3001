"""The backend contract's generic parts: the sample-and-match acceptance rule, drafts, sequences."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import Draft, TokenSequence, accept_matching
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)


def seq_with(prompt: list[int], params: SamplingParams) -> TokenSequence:
    return TokenSequence.start(prompt, params)


def test_token_sequence_views():
    seq = seq_with([5, 6, 7], GREEDY)
    assert seq.pending == 7 and seq.prompt == [5, 6, 7] and seq.generated == []
    seq.tokens += [8, 9]
    assert seq.pending == 9 and seq.prompt == [5, 6, 7] and seq.generated == [8, 9]
    with pytest.raises(ValueError, match="at least one prompt token"):
        TokenSequence.start([], GREEDY)


def test_draft_truncation_keeps_logits_aligned():
    draft = Draft([1, 2, 3], np.arange(12, dtype=np.float32).reshape(3, 4))
    cut = draft.truncated(2)
    assert cut.tokens == [1, 2] and cut.logits.shape == (2, 4) and cut.logits[1, 0] == 4
    assert Draft([4, 5]).truncated(1) == Draft([4], None)


def one_hot_rows(*winners: int, vocab: int = 6) -> np.ndarray:
    logits = np.zeros((len(winners), vocab), np.float32)
    logits[np.arange(len(winners)), winners] = 5.0
    return logits


def test_greedy_matching_accepts_the_agreeing_prefix():
    seq = seq_with([1], GREEDY)
    logits = one_hot_rows(3, 4, 5, 0)  # the model wants 3, 4, 5, then 0
    assert accept_matching(Draft([3, 4, 5]), logits, seq, GREEDY) == [3, 4, 5, 0]  # all accepted + bonus
    assert accept_matching(Draft([3, 2, 5]), logits, seq, GREEDY) == [3, 4]  # stops at the first disagreement
    assert accept_matching(Draft([1, 4, 5]), logits, seq, GREEDY) == [3]
    assert accept_matching(Draft([]), logits[:1], seq, GREEDY) == [3]


def test_penalties_see_tokens_accepted_earlier_in_the_cycle():
    params = SamplingParams(temperature=0, presence_penalty=2.0)
    logits = np.tile(np.array([3.0, 2.0, 0.0, 0.0], np.float32), (3, 1))  # every row prefers 0, then 1
    out = accept_matching(Draft([0, 0]), logits, seq_with([2], params), params)
    # after emitting 0 the presence penalty makes 1 the best: the second draft (0) is rejected
    assert out == [0, 1]


def test_sampled_matching_keeps_the_model_distribution():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 4)).astype(np.float32)
    params = SamplingParams(temperature=1.0, seed=11)
    seq = seq_with([0], params)
    firsts, seconds = [], []
    for _ in range(6000):
        out = accept_matching(Draft([1, 2]), logits, seq, params)
        firsts.append(out[0])
        if out[0] == 1:  # the draft was accepted: the next token comes from row 1
            seconds.append(out[1])
    p0 = np.exp(logits[0]) / np.exp(logits[0]).sum()
    p1 = np.exp(logits[1]) / np.exp(logits[1]).sum()
    np.testing.assert_allclose(np.bincount(firsts, minlength=4) / len(firsts), p0, atol=0.025)
    np.testing.assert_allclose(np.bincount(seconds, minlength=4) / len(seconds), p1, atol=0.04)
