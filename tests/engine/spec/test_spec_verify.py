"""The acceptance rules on known distributions: exact speculative sampling keeps the target distribution."""

from __future__ import annotations

import numpy as np
import pytest
from tests.engine.spec.chisq import chi_square_pvalue

from engine.backend import Draft, TokenSequence
from engine.sampling import SamplingParams
from engine.spec.verify import (SampledDraft, accept_or_resample, greedy_accept, rule_for, speculative_accept,
                                with_logit_bias)

P = np.array([0.05, 0.4, 0.3, 0.15, 0.1, 0.0])
Q = np.array([0.3, 0.1, 0.1, 0.2, 0.2, 0.1])  # a poor proposal: mass where p has little, and on p's zero


def draws(num: int, seed: int, q: np.ndarray | None, fixed: int | None = None) -> np.ndarray:
    """Counts of the token accept_or_resample emits, with drafts from q (or always `fixed`)."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(P.shape[0], dtype=np.int64)
    for _ in range(num):
        x = fixed if q is None else int(rng.choice(P.shape[0], p=q))
        _, token = accept_or_resample(P, x, q, rng)
        counts[token] += 1
    return counts


def test_sampled_drafts_keep_the_target_distribution() -> None:
    counts = draws(20_000, seed=1, q=Q)
    assert chi_square_pvalue(counts, P) > 1e-3
    assert counts[5] == 0  # never a token the target gives probability 0, though q proposes it


@pytest.mark.parametrize("fixed", [1, 4, 5])
def test_deterministic_drafts_keep_the_target_distribution(fixed: int) -> None:
    # the n-gram / greedy-MTP case: q is one-hot at the draft, even a draft the target rules out
    counts = draws(20_000, seed=2 + fixed, q=None, fixed=fixed)
    assert chi_square_pvalue(counts, P) > 1e-3


def test_the_check_detects_a_wrong_rule() -> None:
    # keeping every sampled draft would emit q's distribution: the same statistic must reject it
    rng = np.random.default_rng(3)
    counts = np.bincount(rng.choice(6, size=20_000, p=Q), minlength=6)
    counts[5] = 0
    assert chi_square_pvalue(counts, P) < 1e-6


def test_acceptance_probability_is_min_of_one_and_p_over_q() -> None:
    rng = np.random.default_rng(4)
    kept = sum(accept_or_resample(P, 3, Q, rng)[0] for _ in range(20_000))
    assert kept / 20_000 == pytest.approx(min(1.0, P[3] / Q[3]), abs=0.015)


def make_seq(seed: int = 0, prompt: list[int] | None = None) -> TokenSequence:
    params = SamplingParams(temperature=1.0, seed=seed)
    return TokenSequence.start(prompt or [0, 1], params)


def test_sequence_rule_emits_target_distribution_at_a_rejected_position() -> None:
    # two positions, drafts [2, 3]; the first token's marginal must be softmax(logits[0]) whatever the drafts
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.5, 0.1, 0.1, 0.3]]))
    params = SamplingParams(temperature=1.0)
    counts = np.zeros(4, dtype=np.int64)
    lengths = []
    for seed in range(6000):
        out = speculative_accept(Draft([2, 3]), logits, make_seq(seed), params)
        counts[out[0]] += 1
        lengths.append(len(out))
    expected = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert chi_square_pvalue(counts, expected) > 1e-3
    assert set(lengths) == {1, 2, 3}  # rejections, one kept draft, both kept plus the bonus token


def test_greedy_keeps_drafts_while_they_are_the_argmax() -> None:
    logits = np.array([[0, 5, 1, 0], [0, 0, 7, 0], [3, 0, 0, 0], [0, 0, 0, 9]], dtype=np.float32)
    params = SamplingParams(temperature=0)
    assert greedy_accept(Draft([1, 2, 0]), logits, make_seq(), params) == [1, 2, 0, 3]
    assert greedy_accept(Draft([1, 3, 0]), logits, make_seq(), params) == [1, 2]
    assert greedy_accept(Draft([]), logits, make_seq(), params) == [1]
    assert rule_for(params) is greedy_accept
    assert rule_for(SamplingParams(temperature=0.7)) is speculative_accept


def test_greedy_applies_penalties_with_the_tokens_kept_so_far() -> None:
    # token 1 wins at both positions on raw logits; after the first 1 is kept, a strong frequency penalty at the
    # second position must turn the argmax to token 2, exactly as plain decoding would
    logits = np.array([[0, 5, 4.5, 0], [0, 5, 4.5, 0], [0, 0, 0, 0]], dtype=np.float32)
    params = SamplingParams(temperature=0, frequency_penalty=2.0)
    assert greedy_accept(Draft([1, 1]), logits, make_seq(prompt=[3]), params) == [1, 2]


def test_logit_bias_is_part_of_the_target() -> None:
    logits = np.array([[0, 5, 1, 0], [0, 0, 7, 0]], dtype=np.float32)
    bias = np.array([0, 0, 0, 100], dtype=np.float32)
    rule = with_logit_bias(greedy_accept, bias)
    assert rule(Draft([3]), logits, make_seq(), SamplingParams(temperature=0)) == [3, 3]


def test_sampled_draft_truncation_keeps_its_distributions() -> None:
    draft = SampledDraft([1, 2, 3], None, np.eye(4)[[1, 2, 3]])
    cut = draft.truncated(2)
    assert cut.tokens == [1, 2] and cut.probs is not None and cut.probs.shape == (2, 4)
    assert isinstance(cut, SampledDraft)
