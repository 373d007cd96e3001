"""SamplingParams validation and sample(): every parameter changes the distribution the way it says."""

from __future__ import annotations

import numpy as np
import pytest

from engine.sampling import (InvalidSamplingParam, SamplingParams, UnsampleableLogits, _kept,
                             apply_penalties, draw, keep_or_resample, sample, sampling_probs)

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03], dtype=np.float32))


def empirical(params: SamplingParams, logits=LOGITS, draws: int = 4000, **kw) -> np.ndarray:
    rng = params.make_rng()
    counts = np.bincount([sample(logits, params, rng, **kw) for _ in range(draws)], minlength=len(logits))
    return counts / draws


@pytest.mark.parametrize(
    "field,value",
    [("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("min_p", 2.0), ("top_k", -1),
     ("presence_penalty", 3.0), ("frequency_penalty", -2.5), ("repetition_penalty", 0.0),
     ("temperature", float("nan")), ("seed", "7"), ("seed", -1)],
)
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(InvalidSamplingParam) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field and field in str(info.value)


def test_greedy_is_argmax_and_needs_no_rng():
    assert sample(LOGITS, SamplingParams(temperature=0)) == 0
    with pytest.raises(ValueError, match="rng"):
        sample(LOGITS, SamplingParams(temperature=1.0))


def test_plain_sampling_follows_softmax():
    freq = empirical(SamplingParams(seed=3), draws=6000)
    np.testing.assert_allclose(freq, [0.5, 0.25, 0.15, 0.07, 0.03], atol=0.025)


def test_temperature_sharpens_and_flattens():
    probs_cold = sampling_probs(LOGITS, SamplingParams(temperature=0.5))
    probs_hot = sampling_probs(LOGITS, SamplingParams(temperature=2.0))
    expected_cold = np.array([0.5, 0.25, 0.15, 0.07, 0.03]) ** 2
    np.testing.assert_allclose(probs_cold, expected_cold / expected_cold.sum(), rtol=1e-5)
    assert probs_hot[0] < 0.5 < probs_cold[0]


def test_top_k_top_p_min_p_truncate():
    assert np.count_nonzero(sampling_probs(LOGITS, SamplingParams(top_k=2))) == 2
    # top_p 0.7: 0.5 alone is short of it, 0.5 + 0.25 reaches it
    np.testing.assert_allclose(sampling_probs(LOGITS, SamplingParams(top_p=0.7))[:3], [2 / 3, 1 / 3, 0], rtol=1e-5)
    # min_p 0.2: keep p >= 0.1 -> the first three
    probs = sampling_probs(LOGITS, SamplingParams(min_p=0.2))
    np.testing.assert_allclose(probs, np.array([0.5, 0.25, 0.15, 0, 0]) / 0.9, rtol=1e-5)
    freq = empirical(SamplingParams(top_k=2, seed=1), draws=3000)
    assert freq[2:].sum() == 0 and abs(freq[0] - 2 / 3) < 0.03


def test_penalties():
    logits = np.array([2.0, -1.0, 0.5, 0.5], dtype=np.float32)
    rep = apply_penalties(logits, SamplingParams(repetition_penalty=2.0), history=[1], prompt=[0])
    np.testing.assert_allclose(rep, [1.0, -2.0, 0.5, 0.5])  # positive divided, negative multiplied
    pen = apply_penalties(logits, SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), history=[2, 2, 3], prompt=[0])
    np.testing.assert_allclose(pen, [2.0, -1.0, 0.5 - 1.0 - 0.25, 0.5 - 0.5 - 0.25])  # prompt not counted
    # penalties steer greedy decoding too
    assert sample(logits, SamplingParams(temperature=0, presence_penalty=2.0), history=[0]) == 2
    assert apply_penalties(logits, SamplingParams(repetition_penalty=2.0)).tolist() == logits.tolist()


def test_seed_makes_sampling_reproducible():
    def run(seed: int) -> list[int]:
        params = SamplingParams(seed=seed)
        rng = params.make_rng()
        return [sample(LOGITS, params, rng) for _ in range(50)]

    assert run(42) == run(42) and run(42) != run(43)


def test_draw_never_picks_a_zero_probability_token():
    logits = np.array([0.0, -np.inf, 0.0, -np.inf], dtype=np.float32)
    freq = empirical(SamplingParams(seed=5), logits=logits, draws=500)
    assert freq[1] == 0 and freq[3] == 0 and abs(freq[0] - 0.5) < 0.08


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-30, 1e-8])
def test_a_tiny_temperature_is_greedy(temperature):
    # the largest logit is last-but-one; logits / 1e-310 overflowed to inf, and inf - inf made every probability NaN
    logits = np.array([3.0, -2.0, 7.5, 7.25, 1.0], dtype=np.float32)
    params = SamplingParams(temperature=temperature, seed=0)
    np.testing.assert_array_equal(sampling_probs(logits, params), [0, 0, 1, 0, 0])
    rng = params.make_rng()
    assert {sample(logits, params, rng) for _ in range(50)} == {2}
    with_truncation = SamplingParams(temperature=temperature, top_p=0.5, min_p=0.5, top_k=3)
    np.testing.assert_array_equal(sampling_probs(logits, with_truncation), [0, 0, 1, 0, 0])


def test_infinite_logits_sample_only_from_the_top():
    logits = np.array([np.inf, 1.0, np.inf, -np.inf], dtype=np.float32)
    np.testing.assert_array_equal(sampling_probs(logits, SamplingParams(top_p=0.9, min_p=0.1)), [0.5, 0, 0.5, 0])
    masked = np.array([-np.inf, 0.0, -np.inf, 0.0], dtype=np.float32)  # ruled-out tokens get no mass
    np.testing.assert_array_equal(sampling_probs(masked, SamplingParams(temperature=1e-310)), [0, 0.5, 0, 0.5])


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logits_nothing_can_be_drawn_from_raise(temperature):
    params = SamplingParams(temperature=temperature, seed=0)
    nan = np.array([1.0, np.nan, 0.5], dtype=np.float32)  # argmax would pick the NaN
    impossible = np.full(3, -np.inf, dtype=np.float32)
    for logits in (nan, impossible):
        with pytest.raises(UnsampleableLogits):
            sample(logits, params, params.make_rng())


def _sorted_truncate(probs: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The truncation by one full stable sort (what sampling.py did before it sorted only candidates)."""
    order = np.argsort(-probs, kind="stable")
    num_keep = probs.shape[0] if params.top_k == 0 else min(params.top_k, probs.shape[0])
    if params.top_p < 1.0:
        kept = probs[order[:num_keep]]
        num_keep = min(num_keep, int(np.searchsorted(np.cumsum(kept / kept.sum()), params.top_p)) + 1)
    keep = np.zeros(probs.shape[0], dtype=bool)
    keep[order[:num_keep]] = True
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs[order[0]]
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


@pytest.mark.parametrize("seed", range(6))
def test_truncation_keeps_what_a_full_sort_keeps(seed):
    """top_k / top_p / min_p over a large vocabulary with ties (equal logits) and a long flat tail: the tokens kept,
    sorting only candidates, are the full stable sort's, ties broken by id; so is the distribution."""
    rng = np.random.default_rng(seed)
    size = 50_000
    logits = np.round(rng.standard_normal(size) * 2, 1).astype(np.float32)  # rounded: many exact ties
    logits[rng.integers(0, size, 40)] += rng.uniform(3, 12, 40).astype(np.float32)
    for params in (SamplingParams(top_k=1), SamplingParams(top_k=37), SamplingParams(top_p=0.5),
                   SamplingParams(top_p=0.999), SamplingParams(temperature=3.0, top_p=0.9),  # past 1024 candidates
                   SamplingParams(top_k=5000, top_p=0.8), SamplingParams(top_k=size + 5), SamplingParams(min_p=0.02),
                   SamplingParams(temperature=0.5, top_k=200, top_p=0.95, min_p=0.01)):
        got = sampling_probs(logits, params)
        x = logits.astype(np.float64)
        probs = np.exp((x - x.max()) / params.temperature)
        want = _sorted_truncate(probs / probs.sum(), params)
        assert np.array_equal(got > 0, want > 0), params
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


class _Uniforms:
    """An rng whose draws are the given numbers in turn."""

    def __init__(self, *us: float) -> None:
        self.us = list(us)

    def random(self) -> float:
        return self.us.pop(0)


def test_draw_is_the_inverse_cdf_over_every_token():
    """draw() runs its sums over the tokens with mass only: the same index as the inverse CDF over the whole row,
    for the same uniform number, at the edges too (a draw landing on the total takes the last token with mass)."""
    probs = np.zeros(1000)
    probs[[3, 4, 500, 998]] = [0.1, 0.2, 0.3, 0.4]
    cdf = np.cumsum(probs)
    for u in np.linspace(0.0, 1.0, 401):
        want = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        want = min(want, 999)
        while probs[want] == 0.0:
            want -= 1
        assert draw(probs, _Uniforms(u)) == want, u


FAST_PARAMS = (SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(top_k=50),
               SamplingParams(temperature=0.5, min_p=0.05), SamplingParams(temperature=1.3, top_k=3000, top_p=0.97),
               SamplingParams(temperature=3.0, top_p=0.99),  # past several threshold steps
               # min_p after top_p (top_p's mass is the uncut distribution's), and cutting most of a top_k
               SamplingParams(temperature=0.9, top_p=0.6, min_p=0.2), SamplingParams(top_k=500, min_p=0.3),
               SamplingParams(temperature=0.6, top_k=20, top_p=0.95))  # Qwen's recommended setting


def _peaked_logits(seed: int, size: int = 20_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = np.round(rng.standard_normal(size) * 2, 1).astype(np.float32)  # ties
    logits[rng.integers(0, size, 20)] += rng.uniform(3, 10, 20).astype(np.float32)
    return logits


@pytest.mark.parametrize("seed", range(3))
def test_sample_draws_sampling_probs_inverse_cdf(seed):
    """sample() (float32 weights, running sums by chunk, candidates above a threshold) picks the token the inverse
    CDF of sampling_probs() picks for the same uniform number, but within float32's rounding of a boundary."""
    logits = _peaked_logits(seed)
    for params in FAST_PARAMS:
        probs = sampling_probs(logits, params)
        cdf = np.cumsum(probs)
        for u in np.random.default_rng(seed).random(60):
            got = sample(logits, params, _Uniforms(u))
            assert probs[got] > 0, params
            lo, hi = (cdf[got - 1] if got else 0.0), cdf[got]
            assert lo - 1e-6 <= u * cdf[-1] <= hi + 1e-6, (params, u, got)


@pytest.mark.parametrize("seed", range(3))
def test_sample_keeps_exactly_the_tokens_with_mass(seed):
    """The tokens sample() draws among after top_k / top_p / min_p on the float32 weights are the ones
    sampling_probs() gives mass, ties by id included; each with a visible share is drawn at its interval's middle."""
    logits = _peaked_logits(seed)
    for params in FAST_PARAMS:
        probs = sampling_probs(logits, params)
        ids, kept = _kept(logits, float(logits.max()), params)  # top_k: from the candidates' weights only
        ids = np.arange(len(kept)) if ids is None else ids
        assert set(ids[kept > 0]) == set(np.flatnonzero(probs)), params
        cdf = np.cumsum(probs)
        for token in np.flatnonzero(probs > 1e-4):
            assert sample(logits, params, _Uniforms((cdf[token] - probs[token] / 2) / cdf[-1])) == token


def test_sample_takes_the_float64_path_where_float32_cannot():
    """A tiny temperature (float32 has no 1e-40) samples greedily; an infinite top, from the infinite tokens."""
    logits = np.array([0.0, 3.0, 2.999, -np.inf], np.float32)
    assert sample(logits, SamplingParams(temperature=1e-40), _Uniforms(0.999)) == 1
    inf = np.array([0.0, np.inf, 1.0, np.inf], np.float32)
    assert {sample(inf, SamplingParams(), _Uniforms(u)) for u in (0.1, 0.9)} == {1, 3}


@pytest.mark.parametrize("seed", range(2))
def test_keep_or_resample_is_speculative_sampling_on_sampling_probs(seed):
    """keep_or_resample (float32 weights) keeps and resamples as accept_or_resample does on sampling_probs() for a
    deterministic draft, for the same two uniform numbers: drafts likely, unlikely, and outside top_k / top_p."""
    from engine.spec.verify import accept_or_resample

    logits = _peaked_logits(seed)
    rng = np.random.default_rng(seed)
    likely = [int(t) for t in np.argsort(-logits)[:3]]
    for params in FAST_PARAMS:
        probs = sampling_probs(logits, params)
        outside = [int(t) for t in np.flatnonzero(probs == 0)[:2]]
        for token in likely + [int(rng.integers(len(logits)))] + outside:
            for u1, u2 in rng.random((8, 2)):
                want = accept_or_resample(probs.copy(), token, None, _Uniforms(u1, u2))
                got = keep_or_resample(logits, params, token, _Uniforms(u1, u2))
                if got != want:  # only at a boundary float32's rounding can move
                    kept_p = probs[token]
                    residual = probs.copy()
                    residual[token] = 0.0
                    cdf = np.cumsum(residual) / residual.sum()
                    assert abs(u1 - kept_p) < 1e-5 or np.min(np.abs(cdf - u2)) < 1e-5, (params, token, u1, u2)


def test_sampling_leaves_the_callers_logits_as_they_were():
    """The float32 path reads the logits in place where no penalty applies: it must never write them."""
    logits = _peaked_logits(7, size=5000)
    before = logits.copy()
    for params in FAST_PARAMS:
        sample(logits, params, np.random.default_rng(0))
        keep_or_resample(logits, params, int(np.argmax(logits)), np.random.default_rng(1))
    assert np.array_equal(logits, before)
