"""Token choice as the megakernel makes it on the device (verify.cuh), in numpy: the specification the VM runs.

Penalties and greedy choice are engine.sampling's exactly, with the parameters as float32 (the control words carry
them so). Sampling differs from engine.sampling only where a
device must: the uniforms come from a counter-based generator keyed by (seed, position, purpose) instead of a
numpy Generator, and the distribution is formed over candidates, the tokens whose logit / temperature is within
SAMPLE_CUTOFF (30) of the largest, at most CAND_MAX (4096) of them. A token left out has probability below e^-30
relative to the most likely one; when more than CAND_MAX qualify the largest CAND_MAX are kept and the row is
counted in CTL_SAMPLE_CLIPPED (the one documented departure from the exact distribution).

Acceptance of deterministic drafts (MTP and n-gram drafts are functions of the context, so their proposal
probability is one) is engine.spec.verify.speculative_accept's: keep draft x with probability p(x); on rejection
draw from p with x removed. Every emitted token is then distributed as p.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.megakernel.layout import CAND_MAX, SAMPLE_CUTOFF, Ctl

MASK64 = (1 << 64) - 1
PURPOSE_ACCEPT, PURPOSE_DRAW = 0, 1


def f32_bits(value: float) -> int:
    """The int32 word holding a float32 (how ctl carries floats)."""
    return int(np.array(value, np.float32).view(np.int32))


def bits_f32(word: int) -> float:
    """The float32 an int32 ctl word holds."""
    return float(np.array(word, np.int32).view(np.float32))


@dataclass(frozen=True, slots=True)
class DeviceSampling:
    """The sampling parameters as the device reads them from ctl."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition: float
    frequency: float
    presence: float
    seed: int
    penalties: bool

    @classmethod
    def from_ctl(cls, ctl: np.ndarray) -> DeviceSampling:
        """Read the parameters from the control words."""
        seed = (int(np.uint32(ctl[Ctl.SEED_HI])) << 32) | int(np.uint32(ctl[Ctl.SEED_LO]))
        return cls(bool(ctl[Ctl.GREEDY]), bits_f32(ctl[Ctl.TEMPERATURE]), int(ctl[Ctl.TOP_K]),
                   bits_f32(ctl[Ctl.TOP_P]), bits_f32(ctl[Ctl.MIN_P]), bits_f32(ctl[Ctl.REP_PENALTY]),
                   bits_f32(ctl[Ctl.FREQ_PENALTY]), bits_f32(ctl[Ctl.PRES_PENALTY]), seed, bool(ctl[Ctl.PENALTIES]))


def splitmix64(x: int) -> int:
    """One step of splitmix64 (the device's mixing function)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int, purpose: int) -> float:
    """U[0, 1) for the token at `position`: independent per (seed, position, purpose), reproducible."""
    r = splitmix64((seed ^ splitmix64(((position << 2) | purpose) & MASK64)) & MASK64)
    return (r >> 11) * (1.0 / 9007199254740992.0)


def penalize(logits: np.ndarray, first: int, counts: np.ndarray, seen: np.ndarray, extra: list[int],
             params: DeviceSampling) -> np.ndarray:
    """engine.sampling.apply_penalties on tokens first .. first + len(logits) - 1, with the history given as counts
    of generated tokens, `seen` (prompt or generated) and the extra tokens emitted earlier in this cycle."""
    # logits: [n] float32
    out = np.array(logits, dtype=np.float32)
    if not params.penalties:
        return out
    ids = np.arange(first, first + out.shape[0])
    count = counts[ids].astype(np.int64)
    for token in extra:
        if first <= token < first + out.shape[0]:
            count[token - first] += 1
    if params.repetition != 1.0:
        hit = (seen[ids] != 0) | (count > 0)
        vals = out[hit]
        out[hit] = np.where(vals > 0, vals / np.float32(params.repetition), vals * np.float32(params.repetition))
    if params.frequency or params.presence:
        out -= params.frequency * count + params.presence * (count > 0)
    return out


def candidates(z: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray, bool]:
    """(token ids by index, unnormalised probabilities e^(s - max) as float32, clipped?) of one row's candidates."""
    s = z.astype(np.float32) / np.float32(temperature)
    m = s.max()
    ids = np.nonzero(s >= m - np.float32(SAMPLE_CUTOFF))[0]
    clipped = ids.size > CAND_MAX
    if clipped:
        order = np.lexsort((ids, -s[ids]))  # largest first, lower id first on ties
        ids = np.sort(ids[order[:CAND_MAX]])
    return ids, np.exp(s[ids] - m).astype(np.float32), clipped


def kept_weights(w: np.ndarray, ids: np.ndarray, params: DeviceSampling) -> np.ndarray:
    """The candidates' weights after top_k, top_p and min_p (zero where cut), float64."""
    order = np.lexsort((ids, -w))  # most likely first, lower id first on ties
    num_keep = order.size if params.top_k == 0 else min(params.top_k, order.size)
    if params.top_p < 1.0:
        top = w[order[:num_keep]].astype(np.float64)
        cum = np.cumsum(top / np.cumsum(top)[-1])  # sequential sums, as the device adds them
        num_keep = min(num_keep, int(np.searchsorted(cum, params.top_p)) + 1)
    keep = np.zeros(w.size, bool)
    keep[order[:num_keep]] = True
    if params.min_p > 0.0:
        keep &= w >= np.float32(params.min_p) * w[order[0]]
    return np.where(keep, w.astype(np.float64), 0.0)


def draw_index(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw over p (in index order) with one uniform: engine.sampling.draw's rule."""
    cdf = np.cumsum(p)
    index = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), p.size - 1)
    while p[index] == 0.0:
        index -= 1
    return index


def sample_row(z: np.ndarray, draft: int | None, position: int, params: DeviceSampling) -> tuple[bool, int, bool]:
    """One verify row at temperature > 0: (draft kept?, emitted token, clipped?). draft None: a plain draw."""
    ids, w, clipped = candidates(z, params.temperature)
    p = kept_weights(w, ids, params)
    total = p.sum()
    if draft is not None:
        hit = np.nonzero(ids == draft)[0]
        p_x = p[hit[0]] / total if hit.size else 0.0
        if uniform(params.seed, position, PURPOSE_ACCEPT) < p_x:
            return True, draft, clipped
        if hit.size:
            p = p.copy()
            p[hit[0]] = 0.0
        if p.sum() <= 0.0:  # only rounding when p is (almost) one-hot at the draft: keep it
            return True, draft, clipped
    return False, int(ids[draw_index(p, uniform(params.seed, position, PURPOSE_DRAW))]), clipped


def greedy_token(part_v: np.ndarray, part_i: np.ndarray) -> int:
    """The argmax from per-instruction (max, index) partials: larger value, then lower index."""
    best = int(np.lexsort((part_i, -part_v))[0])
    return int(part_i[best])
