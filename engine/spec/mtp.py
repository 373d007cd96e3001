"""The MTP drafter: the model's own next-token-prediction head (qwen35 `nextn` block) behind the drafter interface.

The backend owns the MTP head and its cache (Backend.draft); this wrapper gives it the same start()/propose() shape
as the n-gram drafter, so the generation loop treats every drafter alike. MTP drafts are greedy, a function of the
context, so verification treats them as deterministic proposals; their logits ride along for inspection only.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.backend import Backend, Draft
from engine.spec.drafter import Drafter


class MtpDrafter:
    """Drafts with the backend's MTP head; the backend's state must hold every token but the pending one."""

    def __init__(self, backend: Backend):
        if not backend.can_draft:
            raise ValueError("this model has no MTP head (nextn layers) to draft with")
        self.backend = backend

    def start(self, tokens: Sequence[int]) -> None:
        """Nothing to index: the MTP head reads the backend's own state."""

    def propose(self, tokens: Sequence[int], num_draft: int) -> Draft:
        """num_draft greedy MTP drafts after tokens[-1], the pending token."""
        if num_draft < 0:
            raise ValueError(f"num_draft must be >= 0, got {num_draft}")
        if self.backend.num_tokens != len(tokens) - 1:
            raise ValueError(f"backend holds {self.backend.num_tokens} tokens, the sequence expects {len(tokens) - 1}")
        if num_draft == 0:
            return Draft([])
        return self.backend.draft(tokens[-1], num_draft)


class FallbackDrafter:
    """Takes the first drafter's proposal when it has one (an n-gram match), else the second's (MTP)."""

    def __init__(self, first: Drafter, second: Drafter):
        self.first, self.second = first, second

    def start(self, tokens: Sequence[int]) -> None:
        """Start both drafters on a new sequence."""
        self.first.start(tokens)
        self.second.start(tokens)

    def propose(self, tokens: Sequence[int], num_draft: int) -> Draft:
        """The first drafter's draft if non-empty, else the second's."""
        draft = self.first.propose(tokens, num_draft)
        return draft if draft.tokens else self.second.propose(tokens, num_draft)

