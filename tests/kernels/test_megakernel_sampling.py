"""Token choice as the megakernel makes it (engine/cuda/megakernel/sampling.py, the spec of verify.cuh): the same
penalties as engine.sampling, and exact speculative sampling that keeps the model's distribution."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.megakernel.layout import CAND_MAX, Ctl
from engine.cuda.megakernel.sampling import (DeviceSampling, candidates, greedy_token, penalize, sample_row,
                                             uniform)
from engine.cuda.megakernel.backend import sampling_words
from engine.sampling import SamplingParams, apply_penalties, sampling_probs


def device_params(params: SamplingParams, seed: int = 0) -> DeviceSampling:
    """The parameters as the device reads them back from the control words."""
    ctl = np.zeros(64, np.int32)
    for index, value in sampling_words(params, seed).items():
        ctl[index] = value
    return DeviceSampling.from_ctl(ctl)


def test_control_words_carry_every_parameter() -> None:
    params = SamplingParams(temperature=0.7, top_k=13, top_p=0.85, min_p=0.02, repetition_penalty=1.3,
                            frequency_penalty=-0.5, presence_penalty=0.25)
    got = device_params(params, seed=2**63 + 12345)
    assert (got.temperature, got.top_k, got.repetition) == (np.float32(0.7), 13, np.float32(1.3))
    assert got.seed == 2**63 + 12345 and got.penalties and not got.greedy
    assert not device_params(SamplingParams(temperature=0.0)).penalties


def test_penalties_are_engine_samplings() -> None:
    """Counts of generated tokens, `seen` prompt tokens and the cycle's extra tokens give apply_penalties (for
    parameters a float32 holds exactly: the control words carry them as float32)."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(64).astype(np.float32) * 3
    prompt, history, extra = [1, 5, 9, 9], [5, 7, 7, 40], [7, 63]
    params = SamplingParams(temperature=1.0, repetition_penalty=1.375, frequency_penalty=0.625, presence_penalty=-0.25)
    counts = np.bincount(history, minlength=64).astype(np.int32)
    seen = np.zeros(64, np.uint8)
    seen[prompt + history] = 1
    want = apply_penalties(logits, params, history=history + extra, prompt=prompt)
    got = np.concatenate([penalize(logits[:32], 0, counts, seen, extra, device_params(params)),
                          penalize(logits[32:], 32, counts, seen, extra, device_params(params))])
    np.testing.assert_array_equal(got, want)


def test_greedy_token_takes_the_lowest_index_on_ties() -> None:
    assert greedy_token(np.array([1.0, 3.0, 3.0, 2.0]), np.array([4, 90, 17, 3])) == 17


def test_candidates_keep_the_largest_when_too_many_qualify() -> None:
    z = np.zeros(CAND_MAX + 500, np.float32)
    z[[10, CAND_MAX + 400]] = 0.5  # two tokens above a flat floor
    ids, w, clipped = candidates(z, 1.0)
    assert clipped and ids.size == CAND_MAX
    assert {10, CAND_MAX + 400} <= set(ids.tolist())
    assert ids[-2] == CAND_MAX - 2 and np.all(np.diff(ids) > 0)  # the ties that stay are the lowest ids


def test_uniforms_are_independent_per_position_and_purpose() -> None:
    draws = np.array([uniform(11, p, 0) for p in range(4000)])
    assert abs(draws.mean() - 0.5) < 0.02 and 0 <= draws.min() and draws.max() < 1
    assert uniform(11, 5, 0) != uniform(11, 5, 1) != uniform(12, 5, 1)


def chi_square_limit(dof: int, z: float = 3.09) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 3.09: p = 0.001)."""
    return dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize("case", ["likely_draft", "unlikely_draft", "excluded_draft", "no_draft"])
def test_speculative_sampling_keeps_the_distribution(case: str) -> None:
    """Whatever the draft, the emitted token is distributed as engine.sampling.sampling_probs (chi-square)."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(12) * 1.5).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_k=8, top_p=0.95, min_p=0.02)
    p = sampling_probs(logits, params)
    order = np.argsort(-p)
    draft = {"likely_draft": int(order[0]), "unlikely_draft": int(order[5]), "excluded_draft": int(order[-1]),
             "no_draft": None}[case]
    trials, counts, kept = 12000, np.zeros(12), 0
    for trial in range(trials):
        ok, token, _ = sample_row(logits, draft, 100, device_params(params, seed=trial))
        counts[token] += 1
        kept += ok
    mask = p * trials >= 5
    stat = float(np.sum((counts[mask] - p[mask] * trials) ** 2 / (p[mask] * trials)))
    assert stat < chi_square_limit(int(mask.sum()) - 1), (counts, p * trials)
    assert counts[~mask].sum() <= 10  # tokens top-k / top-p cut never appear (rare ones barely)
    if draft is not None:  # the draft is kept with its probability
        assert abs(kept / trials - p[draft]) < 4 * np.sqrt(p[draft] * (1 - p[draft]) / trials) + 1e-9
