"""Sequence state of the reference engine: KV caches, DeltaNet conv and recurrent state, the MTP cache.

Everything a forward pass reads from the past lives in a ModelState, so a checkpoint is a deep copy of it and a
rollback puts that copy back: re-feeding the same tokens afterwards repeats the same float operations on the same
inputs and gives bit-identical results.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

F32 = np.float32


@dataclass(slots=True)
class KVCache:
    """Keys and values of one attention layer, row p = position p. Rows >= length are scratch (verify, drafts)."""

    k: np.ndarray  # [capacity, Hkv, D]
    v: np.ndarray  # [capacity, Hkv, D]
    length: int = 0

    @classmethod
    def empty(cls, num_kv_heads: int, head_dim: int, capacity: int = 64) -> KVCache:
        """An empty cache with room for `capacity` positions (it grows on demand)."""
        shape = (capacity, num_kv_heads, head_dim)
        return cls(np.zeros(shape, F32), np.zeros(shape, F32))

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store keys/values of positions start.. (beyond `length` they stay uncommitted until committed).

        Callers write contiguously: a pass writes from `length` on, a draft step right after the previous one.
        """
        # k, v: [T, Hkv, D]
        assert start >= self.length, "committed positions are never rewritten"
        end = start + k.shape[0]
        if end > self.k.shape[0]:
            # amortised doubling: a long generation copies the cache O(log n) times
            capacity = max(end, 2 * self.k.shape[0])
            self.k = np.concatenate([self.k, np.zeros((capacity - self.k.shape[0], *self.k.shape[1:]), F32)])
            self.v = np.concatenate([self.v, np.zeros((capacity - self.v.shape[0], *self.v.shape[1:]), F32)])
        self.k[start:end] = k
        self.v[start:end] = v

    def view(self, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of positions 0..end-1."""
        return self.k[:end], self.v[:end]

    def copy(self) -> KVCache:
        """A deep copy of the committed rows."""
        return KVCache(self.k[: self.length].copy(), self.v[: self.length].copy(), self.length)


@dataclass(slots=True)
class DeltaNetState:
    """One Gated DeltaNet layer: the last K-1 conv inputs and the recurrent state."""

    conv: np.ndarray  # [K-1, C]: qkv projections of the previous K-1 tokens
    ssm: np.ndarray  # [Hv, Dk, Dv]: o_t = S^T q_t

    @classmethod
    def empty(cls, conv_kernel: int, conv_channels: int, num_v_heads: int, k_dim: int, v_dim: int) -> DeltaNetState:
        """The state before the first token: all zeros."""
        return cls(np.zeros((conv_kernel - 1, conv_channels), F32), np.zeros((num_v_heads, k_dim, v_dim), F32))

    def copy(self) -> DeltaNetState:
        """A deep copy."""
        return DeltaNetState(self.conv.copy(), self.ssm.copy())


LayerState = KVCache | DeltaNetState


@dataclass(slots=True)
class ModelState:
    """Everything one sequence carries between forward passes.

    num_tokens: committed positions (0..num_tokens-1 are in every cache).
    last_hidden: the trunk's output-normed hidden state of the last committed token ([H], zeros before any token):
    the MTP head pairs it with the next token.
    """

    layers: list[LayerState]
    mtp: KVCache | None
    last_hidden: np.ndarray
    num_tokens: int = 0

    def copy(self) -> ModelState:
        """A deep copy (what a checkpoint holds)."""
        return ModelState(
            layers=[layer.copy() for layer in self.layers],
            mtp=self.mtp.copy() if self.mtp is not None else None,
            last_hidden=self.last_hidden.copy(),
            num_tokens=self.num_tokens,
        )

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every committed array by name, for comparing two states exactly."""
        for i, layer in enumerate(self.layers):
            if isinstance(layer, KVCache):
                yield f"blk.{i}.k", layer.k[: layer.length]
                yield f"blk.{i}.v", layer.v[: layer.length]
            else:
                yield f"blk.{i}.conv", layer.conv
                yield f"blk.{i}.ssm", layer.ssm
        if self.mtp is not None:
            yield "mtp.k", self.mtp.k[: self.mtp.length]
            yield "mtp.v", self.mtp.v[: self.mtp.length]
        yield "last_hidden", self.last_hidden


@dataclass(slots=True)
class DeltaNetSteps:
    """What a DeltaNet layer computed in an uncommitted pass: enough to commit any prefix (verify) or all of it."""

    conv_window: np.ndarray  # [K-1+T, C] old conv state then the T new inputs (verify); [K-1, C] final (prefill)
    ssm_states: np.ndarray  # [T, Hv, Dk, Dv] after each token (verify); [1, Hv, Dk, Dv] after the last (prefill)
    num_tokens: int
    has_every_step: bool

    def conv_after(self, n: int) -> np.ndarray:
        """The conv state after the first n tokens of the pass."""
        if not self.has_every_step:
            assert n == self.num_tokens, "a prefill pass keeps only its final state: commit all of its tokens"
            return self.conv_window.copy()
        kernel_minus_one = self.conv_window.shape[0] - self.num_tokens
        return self.conv_window[n : n + kernel_minus_one].copy()

    def ssm_after(self, n: int) -> np.ndarray:
        """The recurrent state after the first n tokens of the pass."""
        if not self.has_every_step:
            assert n == self.num_tokens, "a prefill pass keeps only its final state: commit all of its tokens"
            return self.ssm_states[-1].copy()
        return self.ssm_states[n - 1].copy()


@dataclass(slots=True)
class PendingPass:
    """A forward pass over T tokens at positions start.. whose state is computed but not yet committed."""

    start: int
    tokens: list[int]
    hidden: np.ndarray  # [T, H]: the trunk's output-normed hidden states
    deltanet: dict[int, DeltaNetSteps] = field(default_factory=dict)
