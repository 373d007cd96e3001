"""The megakernel with the per-op path behind it.

A megakernel launch that fails at run time (a fault the device reports, a launch error) does not fail the request:
the sequence moves to the per-op backend, whose state is rebuilt by prefilling the committed tokens again, the
call is repeated there, and the new backend and its reason are reported (log line, and `on_switch` for /health and
/metrics). Only MegakernelError switches; any other error (a request past the context window, a bad token) is the
caller's and passes through unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from engine.backend import AcceptRule, Backend, Checkpoint, CycleResult, Draft, TokenSequence, accept_matching
from engine.cuda.megakernel.errors import MegakernelError
from engine.sampling import SamplingParams

log = logging.getLogger("openjet.engine")
T = TypeVar("T")


@dataclass
class FallbackCheckpoint(Checkpoint):
    """A checkpoint of whichever backend served then, with the tokens to rebuild it on the other one."""

    inner: Checkpoint | None = None
    tokens: list[int] = field(default_factory=list)
    generation: int = 0  # which backend took it (0: the megakernel, 1: the per-op path)


class FallbackBackend(Backend):
    """Serves on `primary` (the megakernel) until it raises MegakernelError, then on `make_fallback()` for good."""

    def __init__(self, primary: Backend, reason: str, make_fallback: Callable[[], Backend], fallback_name: str,
                 on_switch: Callable[[str, str], None] | None = None, name: str = "cuda-megakernel"):
        self.inner, self.name, self.reason = primary, name, reason
        self._make_fallback, self._fallback_name, self.on_switch = make_fallback, fallback_name, on_switch
        self._generation = 0
        self._tokens: list[int] = []  # committed
        self._pending: list[int] | None = None  # verified, not yet accepted

    # ---- switching ----

    def _switch(self, exc: MegakernelError) -> None:
        """Leave the megakernel for the per-op backend, rebuilt at the committed tokens."""
        self.reason = f"cuda: per-op kernels; the megakernel failed at run time ({exc})"
        log.error("backend %s: %s", self._fallback_name, self.reason)
        try:
            self.close()
        except Exception as close_exc:  # a faulted device may refuse to free; the per-op backend still starts
            log.warning("closing the failed megakernel: %s", close_exc)
        self.inner, self.name, self._generation = self._make_fallback(), self._fallback_name, 1
        if self._tokens:
            self.inner.prefill(list(self._tokens))
        if self.on_switch is not None:
            self.on_switch(self.name, self.reason)

    def _guarded(self, attempt: Callable[[], T], after_switch: Callable[[], T] | None = None) -> T:
        """attempt() on the megakernel; on its failure, switch and run after_switch() (default: attempt again) on
        the per-op path. A failure there, or any other error, is the caller's."""
        try:
            return attempt()
        except MegakernelError as exc:
            if self._generation:
                raise
            self._switch(exc)
            return (after_switch or attempt)()

    def _call(self, method: str, *args):
        return self._guarded(lambda: getattr(self.inner, method)(*args))

    # ---- contract ----

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def context_size(self) -> int:
        return self.inner.context_size

    @property
    def num_tokens(self) -> int:
        return self.inner.num_tokens

    @property
    def can_draft(self) -> bool:
        return self.inner.can_draft

    @property
    def can_truncate(self) -> bool:
        return self.inner.can_truncate

    def reset(self) -> None:
        self._tokens, self._pending = [], None
        self._call("reset")

    def prefill(self, tokens: list[int]) -> np.ndarray:
        logits = self._call("prefill", tokens)
        self._tokens.extend(int(t) for t in tokens)
        self._pending = None
        return logits

    def verify(self, tokens: list[int]) -> np.ndarray:
        logits = self._call("verify", tokens)
        self._pending = [int(t) for t in tokens]
        return logits

    def accept(self, n: int) -> None:
        pending = self._pending or []

        def verify_again() -> None:  # the verify ran on the megakernel: repeat it before accepting
            self.inner.verify(pending)
            self.inner.accept(n)

        self._guarded(lambda: self.inner.accept(n), verify_again)
        self._tokens.extend(pending[:n])
        self._pending = None

    def draft(self, token: int, num_draft: int) -> Draft:
        return self._call("draft", token, num_draft)

    def cycle(self, seq: TokenSequence, n_draft: int, params: SamplingParams, draft: Draft | None = None,
              rule: AcceptRule = accept_matching) -> CycleResult:
        before = len(seq.tokens)

        def cycle_again() -> CycleResult:
            del seq.tokens[before:]  # nothing of the failed launch counts
            return self.inner.cycle(seq, n_draft, params, draft, rule)

        result = self._guarded(lambda: self.inner.cycle(seq, n_draft, params, draft, rule), cycle_again)
        self._tokens = [int(t) for t in seq.tokens[:-1]]
        self._pending = None
        return result

    def checkpoint(self) -> FallbackCheckpoint:
        inner = self._call("checkpoint")
        return FallbackCheckpoint(self.num_tokens, inner, list(self._tokens), self._generation)

    def rollback(self, checkpoint: Checkpoint) -> None:
        if not isinstance(checkpoint, FallbackCheckpoint):
            raise TypeError(f"not a checkpoint of this backend: {type(checkpoint).__name__}")

        def rebuild() -> None:  # a checkpoint of the megakernel, on the per-op path: prefill its tokens
            self.inner.reset()
            if checkpoint.tokens:
                self.inner.prefill(list(checkpoint.tokens))

        if checkpoint.generation == self._generation:
            self._guarded(lambda: self.inner.rollback(checkpoint.inner), rebuild)
        else:
            rebuild()
        self._tokens, self._pending = list(checkpoint.tokens), None

    def truncate(self, num_tokens: int) -> None:
        self._call("truncate", num_tokens)
        del self._tokens[num_tokens:]
        self._pending = None

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()
