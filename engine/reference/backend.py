"""ReferenceBackend: the backend contract (engine.backend) on the numpy reference model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.backend import Backend, Checkpoint, Draft, draft_vocab_size
from engine.errors import ContextOverflowError
from engine.reference.model import ReferenceModel
from engine.reference.state import KVCache, ModelState, PendingPass

if TYPE_CHECKING:
    from engine.gguf.reader import GGUFFile


@dataclass(slots=True)
class ReferenceCheckpoint(Checkpoint):
    """A deep copy of the reference state, tagged with the backend that took it."""

    state: ModelState
    owner: int


class ReferenceBackend(Backend):
    """The numpy float32 engine: slow, exact, and the yardstick for every other backend."""

    def __init__(self, model: ReferenceModel, context_size: int | None = None, draft_vocab: int | None = None):
        limit = model.cfg.context_length
        self.model = model
        self._context_size = limit if context_size is None else int(context_size)
        if not 0 < self._context_size <= limit:
            raise ValueError(f"context size {context_size} must be in 1..{limit} (the model's context length)")
        self.state = model.new_state()
        self._pending: PendingPass | None = None
        # the ids the MTP head drafts from (engine/backend.py DRAFT_VOCAB_ENV); without a head, nothing to check
        self.draft_vocab = draft_vocab_size(self.vocab_size, draft_vocab) if model.has_mtp else self.vocab_size

    @classmethod
    def from_gguf(cls, path: str | Path, context_size: int | None = None, use_mtp: bool = True,
                  draft_vocab: int | None = None) -> ReferenceBackend:
        """Open a GGUF file, validate it, dequantize every weight to float32 once."""
        from engine.gguf.reader import GGUFFile

        return cls.from_file(GGUFFile.open(path), context_size, use_mtp, draft_vocab)

    @classmethod
    def from_file(cls, f: GGUFFile, context_size: int | None = None, use_mtp: bool = True,
                  draft_vocab: int | None = None) -> ReferenceBackend:
        """The backend of an open GGUF file (ModelFileError / UnsupportedModelError for a file it cannot run)."""
        from engine.model.config import ModelConfig
        from engine.model.weights import bind_weights
        from engine.reference.weights import load_weights

        cfg = ModelConfig.from_gguf(f)
        model = ReferenceModel(cfg, load_weights(bind_weights(f, cfg)), use_mtp=use_mtp)
        return cls(model, context_size, draft_vocab)

    @property
    def vocab_size(self) -> int:
        """Rows of the logits."""
        return int(self.model.weights.output.shape[0])

    @property
    def context_size(self) -> int:
        """The most positions a sequence may use."""
        return self._context_size

    @property
    def num_tokens(self) -> int:
        """Committed positions."""
        return self.state.num_tokens

    @property
    def can_draft(self) -> bool:
        """True when the model has an MTP head."""
        return self.model.has_mtp

    def drop_draft_head(self) -> None:
        """The passes feed the head no more (the model's has_mtp off, the state without the head's cache)."""
        self.model.has_mtp = False
        self.state.mtp = None

    def reset(self) -> None:
        """Forget the sequence."""
        self.state = self.model.new_state()
        self._pending = None

    def _check_fits(self, tokens: list[int]) -> None:
        """Reject empty input and input past the context window."""
        if not tokens:
            raise ValueError("no tokens to feed")
        if self.state.num_tokens + len(tokens) > self._context_size:
            raise ContextOverflowError(self.state.num_tokens + len(tokens), self._context_size)

    def prefill(self, tokens: list[int]) -> np.ndarray:
        """Feed and commit tokens (chunked DeltaNet form); logits [V] after the last one."""
        self._check_fits(tokens)
        self._pending = None
        pending = self.model.forward(self.state, tokens, keep_steps=False)
        self.model.commit(self.state, pending, len(tokens))
        return self.model.logits(pending.hidden[-1:])[0]

    def verify(self, tokens: list[int]) -> np.ndarray:
        """Feed tokens without committing (recurrent DeltaNet form, every step kept); logits [T, V]."""
        self._check_fits(tokens)
        self._pending = self.model.forward(self.state, tokens, keep_steps=True)
        return self.model.logits(self._pending.hidden)

    def accept(self, n: int) -> None:
        """Commit the first n tokens of the last verify()."""
        if self._pending is None:
            raise ValueError("accept() without a verify() to accept from")
        pending, self._pending = self._pending, None
        self.model.commit(self.state, pending, n)

    def draft(self, token: int, num_draft: int) -> Draft:
        """Greedy MTP drafts after the pending token; the state is unchanged."""
        self.model.embed([token])  # validates the id
        tokens, logits = self.model.draft(self.state, token, num_draft, vocab=self.draft_vocab)
        return Draft(tokens, logits)

    @property
    def can_truncate(self) -> bool:
        """True for attention-only models without an MTP head: their state is KV rows indexed by position."""
        return all(isinstance(layer, KVCache) for layer in self.state.layers) and self.state.mtp is None

    def truncate(self, num_tokens: int) -> None:
        """Forget positions >= num_tokens: the caches keep their first num_tokens rows."""
        if not self.can_truncate:
            raise NotImplementedError("this model has DeltaNet or MTP state: roll back to a checkpoint instead")
        if not 0 <= num_tokens <= self.state.num_tokens:
            raise ValueError(f"cannot truncate {self.state.num_tokens} tokens to {num_tokens}")
        for layer in self.state.layers:
            assert isinstance(layer, KVCache)
            layer.length = num_tokens
        self.state.num_tokens = num_tokens
        self._pending = None

    def checkpoint(self) -> ReferenceCheckpoint:
        """A deep copy of the committed state."""
        return ReferenceCheckpoint(self.state.num_tokens, self.state.copy(), id(self))

    def rollback(self, checkpoint: Checkpoint) -> None:
        """Restore a checkpoint taken by this backend (the checkpoint stays usable)."""
        if not isinstance(checkpoint, ReferenceCheckpoint) or checkpoint.owner != id(self):
            raise ValueError("checkpoint was not taken by this backend")
        self.state = checkpoint.state.copy()
        self._pending = None
