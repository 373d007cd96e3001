"""The drafter interface every draft source implements (n-gram lookup, MTP head, combinations of them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.backend import Draft


class Drafter(Protocol):
    """Proposes tokens to follow a sequence; verification decides which of them the model keeps."""

    def start(self, tokens: Sequence[int]) -> None:
        """Begin a new sequence (tokens: the prompt, pending token last)."""

    def propose(self, tokens: Sequence[int], num_draft: int) -> Draft:
        """Up to num_draft tokens to follow tokens (the whole sequence so far, pending token last)."""
