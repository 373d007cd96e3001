"""Prompt-lookup drafting: propose the tokens that followed the latest earlier occurrence of the sequence's tail.

Code editing repeats its context: a model rewriting a function copies most of it from the file in the prompt. When
the last n tokens of the sequence occurred before, the tokens that followed that occurrence are a cheap, often right
guess of what comes next. The drafter tries the longest tail first (max_ngram) down to min_ngram, takes the most
recent match (the latest copy of a passage is the likeliest one being edited), and proposes up to num_draft tokens.

These drafts come with no distribution: verification treats them as deterministic proposals (engine.spec.verify).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.backend import Draft


class NgramDrafter:
    """Prompt-lookup drafter over one growing sequence; start() it per sequence, then propose() each cycle."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._buf = np.zeros(1024, np.int64)  # the sequence so far; grows by doubling
        self._len = 0

    def start(self, tokens: Sequence[int]) -> None:
        """Forget the previous sequence and index tokens (prompt and pending token)."""
        self._len = 0
        self._append(tokens)

    def _append(self, tokens: Sequence[int]) -> None:
        end = self._len + len(tokens)
        if end > self._buf.shape[0]:
            grown = np.zeros(max(end, 2 * self._buf.shape[0]), np.int64)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : end] = tokens
        self._len = end

    def _sync(self, tokens: Sequence[int]) -> None:
        """Append what tokens adds to the indexed copy; re-index when tokens is not an extension of it."""
        n = self._len
        if len(tokens) >= n and (n == 0 or tokens[n - 1] == self._buf[n - 1]):
            self._append(tokens[n:])
        else:
            self.start(tokens)

    def propose(self, tokens: Sequence[int], num_draft: int) -> Draft:
        """Up to num_draft tokens to follow tokens (the sequence, pending token last); empty when nothing matches."""
        if num_draft < 0:
            raise ValueError(f"num_draft must be >= 0, got {num_draft}")
        self._sync(tokens)
        if num_draft == 0:
            return Draft([])
        seq = self._buf[: self._len]  # seq: [L]
        for n in range(min(self.max_ngram, self._len - 1), self.min_ngram - 1, -1):
            start = self._latest_match(seq, n)
            if start is not None:
                follow = seq[start + n : start + n + num_draft]
                return Draft([int(t) for t in follow])
        return Draft([])

    @staticmethod
    def _latest_match(seq: np.ndarray, n: int) -> int | None:
        """Start of the latest earlier occurrence of seq's last n tokens that has at least one token after it."""
        # seq: [L]. Candidates start at i = 0 .. L-n-1, so seq[i + n] exists and the tail itself is excluded.
        num_candidates = seq.shape[0] - n
        if num_candidates <= 0:
            return None
        tail = seq[-n:]
        hits = seq[:num_candidates] == tail[0]
        for j in range(1, n):
            hits &= seq[j : j + num_candidates] == tail[j]
        found = np.flatnonzero(hits)
        return int(found[-1]) if found.size else None
