"""The backend contract every engine implementation serves (numpy reference, CUDA per-op, CUDA megakernel).

Vocabulary, for one sequence:
- committed tokens: positions 0..num_tokens-1, whose effect is in every cache (KV, DeltaNet conv and recurrent
  state, the MTP head's KV);
- the pending token: the newest token of the sequence, already chosen but not yet fed. Its position is num_tokens,
  and the logits that predict the token after it come from the next verify();
- a cycle feeds the pending token plus d draft tokens in one verify pass, keeps the longest prefix the model agrees
  with, and leaves the last chosen token pending. Speculation never changes the output: the acceptance rule draws
  every emitted token from the model's own distribution.

Typical use: prefill(prompt[:-1]); seq = TokenSequence.start(prompt, params); then cycle(seq, d, params) until a
stop token. Servers that reuse a prefix take checkpoint()s at message boundaries and rollback() to the nearest one.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.errors import ContextOverflowError
from engine.sampling import SamplingParams, sample


@dataclass(slots=True)
class Draft:
    """Draft tokens for the positions after the pending token, with the drafter's logits for each ([d, V])."""

    tokens: list[int]
    logits: np.ndarray | None = None  # None when the drafter has no distribution (n-gram lookup)

    def truncated(self, num: int) -> Draft:
        """The first num drafts."""
        logits = None if self.logits is None else self.logits[:num]
        return Draft(self.tokens[:num], logits)


# The token ids an MTP head drafts from: the first N of the vocabulary (unset: every id). Drafts only propose: the
# acceptance rules draw every emitted token from the model's own distribution (accept_matching, accept_choices),
# so a smaller draft vocabulary changes how many drafts are kept, never the output. What it saves: a draft step's
# matmul reads only the head's first N rows (the 27B's output head is 1 GB of Q6_K, most of a draft step's bytes;
# ids are in merge order, so the first ones are a tokenizer's commonest).
DRAFT_VOCAB_ENV = "OPENJET_DRAFT_VOCAB"


def draft_vocab_size(vocab_size: int, asked: int | None = None) -> int:
    """The draft vocabulary's size: `asked`, else DRAFT_VOCAB_ENV's, else vocab_size (every id). ValueError for
    one outside 1..vocab_size, or an environment value that is not a whole number."""
    source = "draft_vocab"
    if asked is None:
        raw = os.environ.get(DRAFT_VOCAB_ENV, "").strip()
        if not raw:
            return vocab_size
        source = f"{DRAFT_VOCAB_ENV}={raw!r}"
        try:
            asked = int(raw)
        except ValueError:
            raise ValueError(f"{source}: not a whole number of token ids") from None
    if not 1 <= asked <= vocab_size:
        raise ValueError(f"{source}: a draft vocabulary of {asked} token ids; it must be 1..{vocab_size} (the model's)")
    return asked


def restrict_draft_logits(logits: np.ndarray, size: int) -> np.ndarray:
    """A drafter's logits [d, V] with the ids past its vocabulary's first `size` at -inf: what it never drafts."""
    if size < logits.shape[-1]:
        logits = np.array(logits, copy=True)
        logits[..., size:] = -np.inf
    return logits


@dataclass(slots=True)
class Checkpoint:
    """The complete state of a backend after num_tokens committed tokens. Backends subclass it with their payload."""

    num_tokens: int


@dataclass(slots=True)
class TokenSequence:
    """One sequence being generated: prompt + generated tokens (the last one is pending) and its sampling rng."""

    tokens: list[int]
    num_prompt_tokens: int
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    @classmethod
    def start(cls, prompt: list[int], params: SamplingParams) -> TokenSequence:
        """A sequence whose pending token is the prompt's last (prefill the others first)."""
        if not prompt:
            raise ValueError("a sequence needs at least one prompt token")
        return cls(list(prompt), len(prompt), params.make_rng())

    @property
    def pending(self) -> int:
        """The newest token, chosen but not yet fed to the model."""
        return self.tokens[-1]

    @property
    def prompt(self) -> list[int]:
        """The prompt tokens."""
        return self.tokens[: self.num_prompt_tokens]

    @property
    def generated(self) -> list[int]:
        """Tokens produced so far (what presence and frequency penalties look at)."""
        return self.tokens[self.num_prompt_tokens :]


@dataclass(slots=True)
class CycleResult:
    """What one cycle added: num_accepted drafts followed by one token drawn from the verify logits."""

    tokens: list[int]
    num_drafted: int
    num_accepted: int


AcceptRule = Callable[[Draft, np.ndarray, TokenSequence, SamplingParams], list[int]]


@dataclass(frozen=True, slots=True)
class RowChoices:
    """Each verify row's token as a rule chose it where the logits are (Backend.verify_choose): tokens[i] is the
    draft at row i if kept[i], else the token drawn in its place; the last row's token follows every draft. They may
    stop at the first row that is not kept: no later row can be emitted."""

    tokens: list[int]
    kept: list[bool]


def accept_choices(draft: Draft, choices: RowChoices) -> list[int]:
    """The tokens a cycle emits from its rows' choices: the kept drafts, then the first row's token that is not one
    (1..d+1 tokens). The rules that may emit this way carry it as their `on_choices` (engine/spec/verify.py)."""
    out: list[int] = []
    for i in range(len(draft.tokens) + 1):
        out.append(choices.tokens[i])
        if i == len(draft.tokens) or not choices.kept[i]:
            break
    return out


def accept_matching(draft: Draft, logits: np.ndarray, seq: TokenSequence, params: SamplingParams) -> list[int]:
    """Sample-and-match verification: draw each position's token from the model; keep going while it equals the draft.

    logits[i] ([1 + d, V]) predicts the token after the pending token and drafts 0..i-1. Each emitted token is drawn
    from the model's distribution given everything before it, so the output is exactly plain sampling's (and, at
    temperature 0, exactly greedy decoding's) whatever the drafts were. Returns 1..d+1 tokens.
    """
    out: list[int] = []
    for i in range(len(draft.tokens) + 1):
        token = sample(logits[i], params, seq.rng, history=seq.generated + out, prompt=seq.prompt)
        out.append(token)
        if i == len(draft.tokens) or token != draft.tokens[i]:
            break
    return out


accept_matching.on_choices = accept_choices  # the same distribution: a row keeps its draft with probability p(draft)


class Backend(ABC):
    """One model, one sequence at a time. See the module docstring for pending/committed tokens."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Rows of the logits."""

    @property
    @abstractmethod
    def context_size(self) -> int:
        """The most positions a sequence may use."""

    @property
    @abstractmethod
    def num_tokens(self) -> int:
        """Committed positions."""

    @property
    @abstractmethod
    def can_draft(self) -> bool:
        """Whether draft() works (the model has an MTP head)."""

    def drop_draft_head(self) -> None:
        """Stop feeding the MTP head, before any sequence, where nothing will draft from it (the server's drafter is
        n-gram or none): a backend that feeds it every pass leaves that work out from then on, and can_draft is
        False. A backend without a head has nothing to stop."""

    @abstractmethod
    def reset(self) -> None:
        """Forget the sequence: num_tokens becomes 0."""

    @abstractmethod
    def prefill(self, tokens: list[int]) -> np.ndarray:
        """Feed and commit tokens at positions num_tokens..; return the logits [V] after the last one.

        Raises ContextOverflowError if num_tokens + len(tokens) > context_size, ValueError for no tokens or an id
        outside the vocabulary.
        """

    @abstractmethod
    def verify(self, tokens: list[int]) -> np.ndarray:
        """Feed T tokens (the pending token, then drafts) at positions num_tokens.. without committing them.

        Returns logits [T, V]: row i predicts the token after tokens[0..i]. The state stays as it was until
        accept(n); a new verify() or prefill() discards an unaccepted pass. Raises ContextOverflowError as prefill.
        """

    def verify_choose(self, tokens: list[int], draft: Draft, params: SamplingParams, rng: np.random.Generator,
                      seq: TokenSequence | None = None) -> RowChoices | None:
        """verify() with each row's token chosen where the logits are (greedy matching, or speculative sampling of
        the deterministic draft), so only token ids travel; None where this backend or these params cannot, and
        cycle() then verifies and runs the rule on the host. seq: the sequence verified (its prompt and generated
        tokens are the penalties' history, row t's with drafts 0..t-1); a backend may decline penalised requests
        without it. Optional: backends without it return None."""
        return None

    @abstractmethod
    def accept(self, n: int) -> None:
        """Commit the first n (1 <= n <= T) tokens of the last verify(): the state becomes exactly that after feeding
        those n tokens (KV, DeltaNet conv and recurrent state, MTP cache), with nothing recomputed."""

    @abstractmethod
    def draft(self, token: int, num_draft: int) -> Draft:
        """Draft num_draft tokens greedily after `token`, the pending token at position num_tokens (MTP head).

        Leaves the state unchanged. Raises ValueError when can_draft is False.
        """

    @abstractmethod
    def checkpoint(self) -> Checkpoint:
        """A snapshot of the complete committed state."""

    @abstractmethod
    def rollback(self, checkpoint: Checkpoint) -> None:
        """Restore a snapshot of this backend: re-feeding the same tokens then gives bit-identical logits."""

    # Added for the server's prefix reuse (engine/session.py): optional, so backends without it keep working.
    @property
    def can_truncate(self) -> bool:
        """Whether truncate() works: all sequence state is indexed by position (KV caches; no DeltaNet, no MTP)."""
        return False

    def truncate(self, num_tokens: int) -> None:
        """Forget committed positions >= num_tokens, keeping the rest as is (only when can_truncate).

        For attention-only models this reuses any common prefix exactly, with no checkpoint to keep.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot truncate its state; roll back to a checkpoint")

    def cycle(
        self,
        seq: TokenSequence,
        n_draft: int,
        params: SamplingParams,
        draft: Draft | None = None,
        rule: AcceptRule = accept_matching,
    ) -> CycleResult:
        """One speculative step: draft (MTP, or the given draft), verify 1 + d tokens, accept, commit.

        Needs num_tokens == len(seq.tokens) - 1. Appends the new tokens to seq (the last becomes pending). Drafts
        are cut to fit the context; ContextOverflowError when not even the pending token fits.
        """
        if self.num_tokens != len(seq.tokens) - 1:
            raise ValueError(f"backend holds {self.num_tokens} tokens, sequence expects {len(seq.tokens) - 1}")
        room = self.context_size - len(seq.tokens)  # positions left after the pending token's
        if room < 0:
            raise ContextOverflowError(len(seq.tokens), self.context_size)
        if draft is None:
            wanted = min(n_draft, room)
            draft = self.draft(seq.pending, wanted) if wanted > 0 and self.can_draft else Draft([])
        draft = draft.truncated(max(room, 0))
        tokens = [seq.pending, *draft.tokens]
        on_choices = getattr(rule, "on_choices", None)  # a rule that needs only the rows' choices, not their logits
        choices = None if on_choices is None else self.verify_choose(tokens, draft, params, seq.rng, seq)
        if choices is not None:
            new = on_choices(draft, choices)
        else:
            new = rule(draft, self.verify(tokens), seq, params)
        assert 1 <= len(new) <= len(draft.tokens) + 1, "an acceptance rule returns 1..d+1 tokens"
        self.accept(len(new))
        seq.tokens.extend(new)
        return CycleResult(new, len(draft.tokens), len(new) - 1)
