"""Golden next-token distributions kept compactly, and how far ours are from them.

A golden distribution P (llama.cpp's) is kept as its top K token ids and log-probabilities plus the probability
mass outside them (the tail), per position. Ours, Q, is known in full. Then KL(P || Q) is bounded on both sides:

  KL = head + sum over tail tokens t of p_t log(p_t / q_t),  head = sum over the top K of p_k log(p_k / q_k) (exact)
  low:  the tail term >= P(tail) log(P(tail) / Q(tail))    (log-sum inequality)
  high: the tail term <= P(tail) log(p_K / min_tail q)     (every tail p_t <= p_K, the K-th largest, and
                                                            every tail q_t >= the smallest tail q)

`low` is the KL between P and Q coarse-grained to the K tokens plus one tail bucket: the usual estimate from top-K
data, never above the true KL, and off from it by P(tail) times the KL within the tail. `high` is a guaranteed upper
bound whatever the tail holds, tight only where the tail mass is small (~1e-4); with a fat tail it is loose. Both use
float64, but the stored log-probs are float32: values below ~1e-8 are rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

CHUNK_ROWS = 32  # rows of [T, V] logits turned into float64 at a time: bounds memory for big vocabularies


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of float logits along the last axis."""
    # logits: [T, V]
    x = np.asarray(logits, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


@dataclass(slots=True)
class TopK:
    """A distribution at T positions: top-K ids by descending probability, their log-probs, the tail mass, and
    the log-sum-exp of the raw logits (raw logit = logprob + logsumexp)."""

    ids: np.ndarray  # [T, K] int32
    logprobs: np.ndarray  # [T, K] float32
    tail_mass: np.ndarray  # [T] float64
    logsumexp: np.ndarray  # [T] float32

    @classmethod
    def from_logits(cls, logits: np.ndarray, k: int) -> TopK:
        """Keep the top k of each row of logits [T, V]."""
        rows = []
        for start in range(0, logits.shape[0], CHUNK_ROWS):
            chunk = np.asarray(logits[start:start + CHUNK_ROWS], dtype=np.float64)  # [C, V]
            lp = log_softmax(chunk)
            part = np.argpartition(-lp, k - 1, axis=-1)[:, :k]
            order = np.take_along_axis(-lp, part, axis=-1).argsort(axis=-1, kind="stable")
            ids = np.take_along_axis(part, order, axis=-1)  # [C, k] by descending probability
            kept = np.take_along_axis(lp, ids, axis=-1)
            probs = np.exp(lp)
            np.put_along_axis(probs, ids, 0.0, axis=-1)
            lse = chunk.max(-1) + np.log(np.exp(chunk - chunk.max(-1, keepdims=True)).sum(-1))
            rows.append((ids, kept, probs.sum(axis=-1), lse))
        ids, kept, tail, lse = (np.concatenate(part) for part in zip(*rows, strict=True))
        return cls(ids.astype(np.int32), kept.astype(np.float32), tail.astype(np.float64), lse.astype(np.float32))

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The fields as named arrays for np.savez ("<prefix>_ids", ...)."""
        return {f"{prefix}_ids": self.ids, f"{prefix}_logprobs": self.logprobs, f"{prefix}_tail_mass": self.tail_mass,
                f"{prefix}_logsumexp": self.logsumexp}

    @classmethod
    def from_arrays(cls, arrays: Any, prefix: str) -> TopK:
        """Read back what arrays(prefix) wrote (from an npz file or a dict)."""
        return cls(*(np.asarray(arrays[f"{prefix}_{name}"]) for name in ("ids", "logprobs", "tail_mass", "logsumexp")))

    def rows(self, start: int, stop: int) -> TopK:
        """Positions start..stop-1."""
        return TopK(self.ids[start:stop], self.logprobs[start:stop], self.tail_mass[start:stop],
                    self.logsumexp[start:stop])


@dataclass(slots=True)
class Agreement:
    """Ours against a golden TopK: top-1 agreement, KL(golden || ours) bounds, largest top-K log-prob gap."""

    num_positions: int
    top1: float  # fraction of positions where our argmax is the golden argmax
    mismatches: list[int] = field(default_factory=list)  # those positions
    kl_low_mean: float = 0.0
    kl_high_mean: float = 0.0  # a guaranteed upper bound of the mean KL
    kl_high_max: float = 0.0
    max_logprob_diff: float = 0.0  # over the golden top-K tokens
    tail_mass_max: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {name: getattr(self, name) for name in self.__slots__}


def _kl_bounds(golden: TopK, ours_lp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-position (low, high) KL bounds and the max |log-prob difference| over the top K, for one chunk."""
    # ours_lp: [C, V] float64
    lp = golden.logprobs.astype(np.float64)  # [C, K]
    lq = np.take_along_axis(ours_lp, golden.ids.astype(np.int64), axis=-1)
    head = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    q_tail = np.exp(ours_lp)
    np.put_along_axis(q_tail, golden.ids.astype(np.int64), np.inf, axis=-1)
    q_min = q_tail.min(axis=-1)  # smallest of our tail probabilities
    np.put_along_axis(q_tail, golden.ids.astype(np.int64), 0.0, axis=-1)
    q_mass = q_tail.sum(axis=-1)
    p_mass = golden.tail_mass
    with np.errstate(divide="ignore", invalid="ignore"):
        low_tail = np.where(p_mass > 0, p_mass * np.log(p_mass / q_mass), 0.0)
        high_tail = np.where(p_mass > 0, p_mass * (lp[:, -1] - np.log(q_min)), 0.0)
    return head + low_tail, head + high_tail, np.abs(lp - lq).max(axis=-1)


def compare(golden: TopK, ours_logits: np.ndarray) -> Agreement:
    """How ours (raw logits [T, V]) agrees with the golden distributions at the same T positions."""
    num = golden.ids.shape[0]
    if ours_logits.shape[0] != num:
        raise ValueError(f"{ours_logits.shape[0]} positions of logits against {num} golden ones")
    ours_top1 = np.asarray(ours_logits).argmax(axis=-1)
    mismatches = np.nonzero(ours_top1 != golden.ids[:, 0])[0]
    low, high, diff = [], [], []
    for start in range(0, num, CHUNK_ROWS):
        stop = min(num, start + CHUNK_ROWS)
        bounds = _kl_bounds(golden.rows(start, stop), log_softmax(ours_logits[start:stop]))
        for out, values in zip((low, high, diff), bounds, strict=True):
            out.append(values)
    low_all, high_all = np.concatenate(low), np.concatenate(high)
    return Agreement(
        num_positions=num, top1=float(1.0 - len(mismatches) / num), mismatches=[int(i) for i in mismatches],
        kl_low_mean=float(low_all.mean()), kl_high_mean=float(high_all.mean()), kl_high_max=float(high_all.max()),
        max_logprob_diff=float(np.concatenate(diff).max()), tail_mass_max=float(golden.tail_mass.max()),
    )


def full_kl(golden_logits: np.ndarray, ours_logits: np.ndarray) -> np.ndarray:
    """Exact KL(golden || ours) per position from two full [T, V] logit arrays (float64)."""
    out = []
    for start in range(0, golden_logits.shape[0], CHUNK_ROWS):
        lp = log_softmax(golden_logits[start:start + CHUNK_ROWS])
        lq = log_softmax(ours_logits[start:start + CHUNK_ROWS])
        out.append((np.exp(lp) * (lp - lq)).sum(axis=-1))
    return np.concatenate(out)
