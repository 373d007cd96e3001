"""One sequence on a backend across requests: committed tokens, checkpoints at message boundaries, prefix reuse.

A chat client resends the whole conversation every turn. prepare(prompt) brings the backend to the state after
prompt[:-1] (the last prompt token stays pending, for the first decoding cycle) doing as little work as it can:

- the committed tokens already start the prompt: prefill only the rest (a second turn prefills only its new tokens);
- they diverge at position k (an edited or compacted history, a regenerated reply):
  - attention-only models truncate their KV caches to k (Backend.truncate), exact whatever k is;
  - models with recurrent state (Gated DeltaNet) cannot forget tokens, so they roll back to the latest checkpoint
    at or before k that this prompt shares, and prefill from there;
  - with no such checkpoint, start from zero.

Checkpoints are taken at message boundaries (positions the caller passes: where each chat message ends), at the end
of the prompt, and at the end of each reply (mark_boundary), and are kept up to max_checkpoints, least recently used
evicted first. Prefill runs in chunks that end at boundaries and every chunk_size tokens, so a cancelled request
stops within one chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.backend import Backend, Checkpoint, TokenSequence
from engine.errors import ContextOverflowError


@dataclass(slots=True)
class PrefillStats:
    """What prepare() did: tokens reused from before, tokens fed now, how it got there, seconds spent."""

    num_reused: int = 0
    num_prefilled: int = 0
    seconds: float = 0.0
    restored: str = "none"  # "prefix" | "truncate" | "checkpoint" | "reset"
    is_cancelled: bool = False


@dataclass(slots=True)
class _Saved:
    """A checkpoint with the tokens it holds (to check that a new prompt shares them) and its last use."""

    checkpoint: Checkpoint
    tokens: np.ndarray  # [num_tokens]
    last_used: int = 0


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(a.shape[0], b.shape[0])
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


@dataclass(slots=True)
class Session:
    """The one sequence a backend holds, kept in step with it; see the module docstring."""

    backend: Backend
    max_checkpoints: int = 8
    chunk_size: int = 512
    _tokens: list[int] = field(default_factory=list, init=False)  # mirrors the backend's committed tokens
    _saved: list[_Saved] = field(default_factory=list, init=False)
    _clock: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.max_checkpoints < 0 or self.chunk_size < 1:
            raise ValueError("max_checkpoints must be >= 0 and chunk_size >= 1")
        self.backend.reset()

    @property
    def tokens(self) -> list[int]:
        """The committed tokens (a copy)."""
        return list(self._tokens)

    @property
    def num_checkpoints(self) -> int:
        """Checkpoints held."""
        return len(self._saved)

    def prepare(self, prompt: Sequence[int], boundaries: Sequence[int] = (),
                should_stop: Callable[[], bool] | None = None) -> PrefillStats:
        """Make the backend hold prompt[:-1], reusing what it can; boundaries are token counts where messages end.

        Raises ContextOverflowError when the prompt does not fit. When should_stop() turns true between chunks, the
        prefill stops there (is_cancelled) with the session still consistent.
        """
        started = time.perf_counter()
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if len(prompt) > self.backend.context_size:
            raise ContextOverflowError(len(prompt), self.backend.context_size)
        target = np.asarray(prompt[:-1], dtype=np.int64)  # target: [P-1]
        stats = PrefillStats()
        stats.num_reused, stats.restored = self._restore(target)
        assert self.backend.num_tokens == stats.num_reused == len(self._tokens)
        stops = sorted({b for b in boundaries if stats.num_reused < b < target.shape[0]} | {target.shape[0]})
        stats.is_cancelled = not self._prefill(target, stops, should_stop)
        stats.num_prefilled = len(self._tokens) - stats.num_reused
        stats.seconds = time.perf_counter() - started
        return stats

    def _restore(self, target: np.ndarray) -> tuple[int, str]:
        """Bring the backend to the longest reusable prefix of target; (its length, how)."""
        held = np.asarray(self._tokens, dtype=np.int64)
        shared = common_prefix(held, target)
        if shared == held.shape[0]:
            return shared, "prefix"
        if self.backend.can_truncate:
            self.backend.truncate(shared)
            del self._tokens[shared:]
            return shared, "truncate"
        best = self._best_checkpoint(target, shared)
        if best is None:
            self.backend.reset()
            self._tokens = []
            return 0, "reset"
        self.backend.rollback(best.checkpoint)
        self._touch(best)
        self._tokens = [int(t) for t in best.tokens]
        return len(self._tokens), "checkpoint"

    def _best_checkpoint(self, target: np.ndarray, limit: int) -> _Saved | None:
        """The checkpoint with the most tokens, at most limit, all of them a prefix of target."""
        fits = [s for s in self._saved
                if s.tokens.shape[0] <= limit and np.array_equal(s.tokens, target[: s.tokens.shape[0]])]
        return max(fits, key=lambda s: s.tokens.shape[0], default=None)

    def _prefill(self, target: np.ndarray, stops: list[int], should_stop: Callable[[], bool] | None) -> bool:
        """Feed target from the committed length on, checkpointing at each stop; False if stopped early."""
        for stop in stops:
            while len(self._tokens) < stop:
                if should_stop is not None and should_stop():
                    return False
                chunk = [int(t) for t in target[len(self._tokens) : min(stop, len(self._tokens) + self.chunk_size)]]
                self.backend.prefill(chunk)
                self._tokens.extend(chunk)
            self.mark_boundary()
        return True

    def sync(self, seq: TokenSequence) -> None:
        """Record the tokens a decoding cycle committed: all of seq but its pending token."""
        committed = self.backend.num_tokens
        assert committed == len(seq.tokens) - 1, "the backend holds every token of the sequence but the pending one"
        self._tokens.extend(seq.tokens[len(self._tokens) : committed])

    def mark_boundary(self) -> None:
        """Checkpoint the current state (a message boundary) unless the backend truncates or one exists here."""
        if self.backend.can_truncate or self.max_checkpoints == 0 or not self._tokens:
            return
        num_tokens = len(self._tokens)
        for saved in self._saved:
            if saved.tokens.shape[0] == num_tokens and np.array_equal(saved.tokens, self._tokens):
                self._touch(saved)
                return
        if len(self._saved) >= self.max_checkpoints:
            self._saved.remove(min(self._saved, key=lambda s: s.last_used))
        saved = _Saved(self.backend.checkpoint(), np.asarray(self._tokens, dtype=np.int64))
        self._touch(saved)
        self._saved.append(saved)

    def _touch(self, saved: _Saved) -> None:
        self._clock += 1
        saved.last_used = self._clock

    def invalidate(self) -> None:
        """Forget everything (after a backend failure the state cannot be trusted)."""
        self._saved.clear()
        self._tokens = []
        self.backend.reset()
