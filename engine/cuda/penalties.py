"""Repetition, frequency and presence penalties on the device (kernels/penalties.cu): the sequence's tokens kept in
device memory between verify passes, and the verify rows' logits penalised in place before choose_rows.

The host's rule (engine/sampling.py apply_penalties) forms np.unique over prompt + history for every row, which
costs milliseconds a row on a long prompt; here the host only tells the device what the sequence grew by. `marks`
holds a word a vocabulary entry: the count of generated tokens in bits 0-30, PROMPT_BIT where the prompt holds
the token. The host remembers which TokenSequence (and which tokens list) it folded in and how far: a sequence that
only grew since sends its new tokens (one small upload, a scatter kernel); any other (a new request, a sequence
cut back, more new tokens than the staging buffer holds) is rebuilt from scratch (one upload of the vocabulary).
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np

from engine.backend import TokenSequence
from engine.cuda.device import Buffer, Device
from engine.sampling import SamplingParams

PROMPT_BIT = 1 << 31  # kernels/penalties.cu PENALTY_PROMPT_BIT
PENALTY_THREADS = 256  # kernels/penalties.cu PENALTY_THREADS
# New tokens one incremental update takes (a cycle adds at most VERIFY_MAX); more is a rebuild.
STAGING_TOKENS = 256


def has_penalties(params: SamplingParams) -> bool:
    """Whether any penalty changes the logits."""
    return params.repetition_penalty != 1.0 or params.frequency_penalty != 0 or params.presence_penalty != 0


def without_penalties(params: SamplingParams) -> SamplingParams:
    """params with the penalties off: for the host's rules on logits the device has penalised already."""
    return dataclasses.replace(params, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)


def host_marks(seq: TokenSequence, vocab: int) -> np.ndarray:
    """The marks of seq's tokens, as the device holds them (uint32 [vocab])."""
    marks = np.bincount(_ids(seq.generated, vocab), minlength=vocab).astype(np.uint32)
    marks[_ids(seq.prompt, vocab)] |= np.uint32(PROMPT_BIT)
    return marks


def _ids(tokens: list[int], vocab: int) -> np.ndarray:
    """tokens as an array, each checked to be in the vocabulary (penalty_count's atomics would write outside the
    marks, and numpy would take a negative id from the end)."""
    ids = np.asarray(tokens, np.int64)
    if ids.size and not (0 <= ids.min() and ids.max() < vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise ValueError(f"token id {bad} of the sequence is outside the vocabulary of {vocab}")
    return ids


def penalty_count(dev: Device, marks: Buffer, tokens: Buffer, num_tokens: int) -> None:
    """marks[tokens[i]] += 1 for i < num_tokens (kernels/penalties.cu penalty_count)."""
    dev.launch(dev.kernel("penalty_count"), 1, PENALTY_THREADS, [marks, tokens, num_tokens])


def penalize_rows(dev: Device, logits: Buffer, marks: Buffer, drafts: Buffer, num_rows: int, vocab: int, ld: int,
                  params: SamplingParams) -> None:
    """logits[t] (t < num_rows) penalised in place as apply_penalties would with the history of marks and
    drafts[0..t-1] (kernels/penalties.cu penalize_rows)."""
    # frequency and presence in float64: the host multiplies the counts by the Python floats unrounded
    dev.launch(dev.kernel("penalize_rows"), (vocab + PENALTY_THREADS - 1) // PENALTY_THREADS, PENALTY_THREADS,
               [logits, vocab, ld, num_rows, marks, drafts, float(params.repetition_penalty),
                ctypes.c_double(params.frequency_penalty), ctypes.c_double(params.presence_penalty)])


class PenaltyCounts:
    """One backend's device copy of a sequence's tokens for the penalties (allocated at the first penalised
    request). The sequence must be the one being verified: sync() before penalising its pass's rows."""

    def __init__(self, dev: Device, vocab: int):
        self.dev, self.vocab = dev, vocab
        self.marks: Buffer | None = None  # uint32 [vocab]
        self.staging: Buffer | None = None  # int32 [STAGING_TOKENS]: the new tokens of an incremental update
        self._seq: TokenSequence | None = None  # held, so that its id cannot pass to another sequence
        self._tokens: list[int] | None = None
        self._num_prompt, self._num_folded, self._last = 0, 0, -1
        self.num_rebuilds = 0  # full uploads (tests and the bench read it)

    def sync(self, seq: TokenSequence) -> None:
        """Make `marks` hold seq's prompt and generated tokens (the pending one included)."""
        if self.marks is None:
            self.marks = self.dev.alloc(4 * self.vocab, "penalties.marks")
            self.staging = self.dev.alloc(4 * STAGING_TOKENS, "penalties.staging")
        num = len(seq.tokens)
        new = num - self._num_folded
        if self._has_only_grown(seq) and new <= STAGING_TOKENS:
            if new:
                self.dev.upload(self.staging, _ids(seq.tokens[self._num_folded:], self.vocab).astype(np.int32))
                penalty_count(self.dev, self.marks, self.staging, new)
        else:
            self.dev.upload(self.marks, host_marks(seq, self.vocab))
            self.num_rebuilds += 1
        self._seq, self._tokens, self._num_prompt = seq, seq.tokens, seq.num_prompt_tokens
        self._num_folded, self._last = num, seq.tokens[-1]

    def _has_only_grown(self, seq: TokenSequence) -> bool:
        """Whether seq is the sequence folded in last, its tokens appended to since: cycles extend the same list.
        A list cut back shows in its length, one cut and regrown past it in the last folded token (nothing in the
        engine goes on decoding a sequence it cut, but a retried cycle cuts back to where it began)."""
        return (seq is self._seq and seq.tokens is self._tokens and seq.num_prompt_tokens == self._num_prompt
                and self._num_folded <= len(seq.tokens) and seq.tokens[self._num_folded - 1] == self._last)

    def apply(self, logits: Buffer, drafts: Buffer, num_rows: int, params: SamplingParams) -> None:
        """Penalise the verify pass's rows in place (sync() first): row t's history holds drafts 0..t-1."""
        assert self.marks is not None, "sync() a sequence before penalising its rows"
        penalize_rows(self.dev, logits, self.marks, drafts, num_rows, self.vocab, self.vocab, params)
