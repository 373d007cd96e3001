"""Sampling parameters and token sampling from logits.

Order of operations (that of vLLM and transformers):
  1. penalties on the raw logits: repetition (over prompt and generated tokens), then frequency and presence
     (over generated tokens only);
  2. temperature 0 means greedy: the highest penalised logit;
  3. otherwise logits / temperature -> softmax -> top_k -> top_p -> min_p -> renormalise -> draw with the rng.
sampling_probs() returns the distribution of step 3, which exact speculative sampling compares against.
Logits with a NaN, or with every token at -inf, raise UnsampleableLogits rather than yield an arbitrary token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class InvalidSamplingParam(ValueError):
    """A sampling parameter out of range; .param names it (the server turns this into a 400)."""

    def __init__(self, param: str, message: str):
        self.param = param
        super().__init__(f"{param}: {message}")


@dataclass(slots=True)
class SamplingParams:
    """Every sampling knob a request can set. Defaults change nothing (plain sampling at temperature 1)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off; > 1 discourages tokens already seen

    def __post_init__(self) -> None:
        checks = [
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= 0, "must be an integer >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("repetition_penalty", self.repetition_penalty > 0, "must be > 0"),
            ("seed", self.seed is None or (isinstance(self.seed, int) and self.seed >= 0),
             "must be an integer >= 0 (None for a random seed)"),
        ]
        for name, ok, message in checks:
            value = getattr(self, name)
            if not ok or (isinstance(value, float) and not np.isfinite(value)):
                raise InvalidSamplingParam(name, f"{message}, got {value!r}")

    @property
    def is_greedy(self) -> bool:
        """Temperature 0: always the highest logit, no randomness."""
        return self.temperature == 0

    def make_rng(self) -> np.random.Generator:
        """A generator seeded from `seed` (fresh OS entropy when seed is None)."""
        return np.random.default_rng(self.seed)


def apply_penalties(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int] = (), prompt: Sequence[int] = ()
) -> np.ndarray:
    """Penalised copy of the logits: repetition over prompt + history, frequency/presence over history."""
    # logits: [V] -> [V]
    out = np.array(logits, dtype=np.float32)
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.fromiter((*prompt, *history), dtype=np.int64))
        if seen.size:
            # divide positive logits, multiply negative ones: both move the token towards unlikely
            vals = out[seen]
            out[seen] = np.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if history and (params.frequency_penalty or params.presence_penalty):
        counts = np.bincount(np.asarray(history, dtype=np.int64), minlength=out.shape[0])[: out.shape[0]]
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return out


def _penalised_view(logits: np.ndarray, params: SamplingParams, history: Sequence[int],
                    prompt: Sequence[int]) -> np.ndarray:
    """apply_penalties() where a penalty applies, else the float32 logits themselves (read only: the float32 path
    makes its own weights), saving a copy of the row."""
    if params.repetition_penalty != 1.0 or (history and (params.frequency_penalty or params.presence_penalty)):
        return apply_penalties(logits, params, history, prompt)
    return np.asarray(logits, dtype=np.float32)


def _truncate(probs: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Zero out what top_k, top_p and min_p exclude (the most likely token always survives)."""
    # probs: [V] float64 summing to 1
    keep = np.ones(probs.shape[0], dtype=bool)
    if params.top_k or params.top_p < 1.0:
        keep[:] = False
        keep[_nucleus(probs, params)] = True  # a full sort of a 248K-token vocabulary took ~30 ms a token
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs.max()
    if keep.all():
        return probs
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def sampling_probs(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int] = (), prompt: Sequence[int] = ()
) -> np.ndarray:
    """The distribution sample() draws from (float64 [V]); one-hot at the argmax when greedy."""
    penalised = _checked(apply_penalties(logits, params, history, prompt))
    if params.is_greedy:
        probs = np.zeros(penalised.shape[0])
        probs[int(np.argmax(penalised))] = 1.0
        return probs
    x = penalised.astype(np.float64)
    top = x.max()
    # shift before dividing: x / T overflows to inf for a tiny T and inf - inf is NaN; (x - top) / T goes to -inf at
    # worst, so a tiny temperature is greedy in the limit. The tokens at the top get exactly 0 (also when top is
    # +inf), so the argmax always keeps its mass. In place: each temporary of a 248K-token row costs the host time.
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.subtract(x, top, out=x)
        scaled /= params.temperature
    if not np.isfinite(top):
        scaled[penalised == top] = 0.0
    probs = np.exp(scaled, out=scaled)
    probs /= probs.sum()
    return _truncate(probs, params)


class UnsampleableLogits(ValueError):
    """Logits no token can be drawn from: a NaN (argmax would pick it) or every token at -inf."""


def _checked(logits: np.ndarray) -> np.ndarray:
    """The logits, or UnsampleableLogits instead of a silently chosen token."""
    # logits: [V]
    top = logits.max()  # one pass on the common path: NaN if any is, -inf if all are
    if np.isnan(top):
        raise UnsampleableLogits(f"the logits hold {int(np.isnan(logits).sum())} NaN values: no token can be chosen")
    if top == -np.inf:
        raise UnsampleableLogits("every logit is -inf (penalties or biases ruled out every token)")
    return logits


def sample(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator | None = None,
    history: Sequence[int] = (),
    prompt: Sequence[int] = (),
) -> int:
    """One token id from logits [V], honouring every parameter. history = generated tokens, prompt = prompt tokens."""
    if params.is_greedy:
        return int(np.argmax(_checked(apply_penalties(logits, params, history, prompt))))
    if rng is None:
        raise ValueError("sampling at temperature > 0 needs an rng (SamplingParams.make_rng())")
    penalised = _penalised_view(logits, params, history, prompt)
    top = penalised.max()  # NaN if any is; -inf if all are
    if not np.isfinite(top) or params.temperature < 1e-30:  # float64 for a NaN or infinite top, a T float32 lacks
        return draw(sampling_probs(logits, params, history, prompt), rng)
    ids, kept = _kept(penalised, top, params)
    return _draw_all(kept, rng) if ids is None else int(ids[_inverse_cdf(kept, rng.random())])


# sample() draws from sampling_probs()'s distribution in a few float32 passes over the row, without forming it:
# on a 248K-token vocabulary the float64 distribution's dozen passes cost ~3 ms a row on the GPU machine's host,
# a third of a verify pass, and the server samples every row a cycle keeps (bench/NOTES.md Z9). The weights
# exp((x - top) / T) are the probabilities times their sum (the top's exactly 1), each within float32's rounding.
SAMPLE_CHUNK = 4096  # tokens a running sum is formed over at once


def _weights(x: np.ndarray, top: float, params: SamplingParams) -> np.ndarray:
    """exp((x - top) / T) in float32 (x: penalised logits [V], finite top)."""
    w = np.subtract(x, np.float32(top), dtype=np.float32)
    w /= np.float32(params.temperature)
    return np.exp(w, out=w)


def _kept(x: np.ndarray, top: float, params: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """_kept_weights of the penalised logits x [V]: with top_k, of the candidates' weights only."""
    if params.top_k:
        among = _top_k_candidates(x, top, params)
        ids, kept = _kept_weights(_weights(x[among], top, params), params)
        return among[ids], kept
    return _kept_weights(_weights(x, top, params), params)


def _top_k_candidates(x: np.ndarray, top: float, params: SamplingParams) -> np.ndarray:
    """Ids (ascending) of every token whose logit is within a margin of the top wide enough to hold top_k of them,
    and a few ulps more, so that a weight tied with the k-th is among them: top_k keeps none of the rest, so only
    these tokens' weights are formed (a row's exp is most of a sampled row's cost on the host)."""
    size, margin = x.shape[0], params.temperature * np.log(16.0)
    need = min(params.top_k, size)
    while margin < 1e6 * params.temperature:  # past that, every weight is 0 in float32 anyway
        ids = np.flatnonzero(x >= top - margin * (1.0 + 1e-5) - 1e-6)
        if len(ids) >= need or len(ids) == size:
            return ids
        margin *= 2.0
    return np.flatnonzero(x > -np.inf)


def _kept_weights(w: np.ndarray, params: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """(indices into w, their weights) that top_k, top_p and then min_p keep, ascending; (None, w itself, cut by
    min_p in place) when top_k and top_p keep every token. min_p comes last, as in _truncate: top_p's mass is the
    uncut one."""
    ids = np.sort(_nucleus(w, params, top=1.0)) if params.top_k or params.top_p < 1.0 else None
    kept = w if ids is None else w[ids]
    if params.min_p > 0.0:
        kept[kept < params.min_p] = 0.0  # relative to the most likely token, whose weight is 1
    return ids, kept


def keep_or_resample(logits: np.ndarray, params: SamplingParams, token: int, rng: np.random.Generator,
                     history: Sequence[int] = (), prompt: Sequence[int] = ()) -> tuple[bool, int] | None:
    """Speculative sampling's step for a draft token proposed deterministically (engine/spec/verify.py): keep it
    with its probability p(token) under sample()'s distribution p, else draw from p without it. (kept?, token);
    None where the float32 weights cannot stand for p (a NaN or infinite top, a temperature float32 lacks, greedy):
    there the caller forms p (sampling_probs) and takes verify.accept_or_resample."""
    penalised = _penalised_view(logits, params, history, prompt)
    top = penalised.max()
    if not np.isfinite(top) or params.is_greedy or params.temperature < 1e-30:
        return None
    ids, w = _kept(penalised, top, params)
    if ids is not None:  # the kept tokens only, by id
        at = int(np.searchsorted(ids, token))
        token_weight = w[at] if at < len(ids) and ids[at] == token else 0.0
    else:
        at, token_weight = token, w[token]
    total = float(w.sum(dtype=np.float64))
    if rng.random() * total < token_weight:
        return True, token
    if token_weight:
        w[at] = 0.0
        if not w.any():  # only reachable through rounding: p(token) was ~1
            return True, token
    index = _inverse_cdf(w, rng.random()) if ids is not None else _draw_all(w, rng)
    return False, int(index if ids is None else ids[index])


def _draw_all(w: np.ndarray, rng: np.random.Generator) -> int:
    """One token by the inverse CDF of weights w [V] (some zero), the running sums formed a chunk at a time."""
    starts = np.arange(0, w.shape[0], SAMPLE_CHUNK)
    sums = np.add.reduceat(w, starts, dtype=np.float64)
    cum = np.cumsum(sums)
    target = rng.random() * cum[-1]
    chunk = min(int(np.searchsorted(cum, target, side="right")), len(sums) - 1)
    while sums[chunk] == 0.0:  # a target on the total: back to the last chunk with mass
        chunk -= 1
    lo = int(starts[chunk])
    seg = w[lo : lo + SAMPLE_CHUNK]
    return lo + _inverse_cdf(seg, target - (cum[chunk - 1] if chunk else 0.0), absolute=True)


def _inverse_cdf(w: np.ndarray, u: float, absolute: bool = False) -> int:
    """The index whose running sum of w first passes u (times the total unless absolute); never a zero weight."""
    cdf = np.cumsum(w, dtype=np.float64)
    target = u if absolute else u * cdf[-1]
    index = min(int(np.searchsorted(cdf, target, side="right")), w.shape[0] - 1)
    while w[index] == 0.0:
        index -= 1
    return index


def _nucleus(w: np.ndarray, params: SamplingParams, top: float | None = None) -> np.ndarray:
    """The ids top_k, then top_p, keep of probabilities or weights w [V], by falling value (ties by id): found among
    the tokens above a threshold, from a 16th of the top (w's largest, when known: weights' is 1) down 16x at a
    time, until they must hold the kept set, so only those are sorted."""
    size = w.shape[0]
    num_keep = size if params.top_k == 0 else min(params.top_k, size)
    total = float(w.sum(dtype=np.float64))
    threshold = float(w.max() if top is None else top) / 16
    while True:
        exhausted = threshold < 1e-45  # below float32's least weight: every token with a weight is a candidate
        candidates = np.flatnonzero(w >= threshold) if not exhausted else np.flatnonzero(w)
        enough = len(candidates) >= num_keep if params.top_k else (
            float(w[candidates].sum(dtype=np.float64)) >= params.top_p * total)
        if enough or exhausted:
            order = candidates[np.argsort(-w[candidates], kind="stable")][:num_keep]
            if params.top_p >= 1.0:
                return order
            mass = np.cumsum(w[order], dtype=np.float64)
            mass /= mass[-1] if params.top_k else total
            cut = int(np.searchsorted(mass, params.top_p)) + 1
            if cut <= len(order) or exhausted:
                return order[:cut]
        threshold /= 16


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from a distribution [V] with one uniform number (deterministic for a seeded rng)."""
    return _inverse_cdf(probs, rng.random())
