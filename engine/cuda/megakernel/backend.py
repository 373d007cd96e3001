"""MegakernelBackend: engine/backend.py's contract on the megakernel's launches, over an executor (the VM, or the
GPU runner): one launch per speculative cycle, the host reading back only the emitted tokens.

Launches and what they leave behind:
- cycle (MODE_CYCLE): the pending token and the drafts the previous launch made go through every layer; the device
  accepts, emits, commits, runs the MTP block over the committed rows plus the new pending token, and drafts the
  next cycle's tokens. The DeltaNet state is committed lazily: the buffers hold the state before the last pass plus
  that pass's rows, and CTL_COMMIT_N says how many of them count; the next pass (or the commit program) applies them.
- prefill (MODE_PREFILL, up to MAX_ROWS tokens a launch), verify (MODE_HOST) + accept (MODE_CATCHUP) for rules the
  device does not implement, and draft (MODE_DRAFT) when no drafts are waiting on the device.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.backend import AcceptRule, Backend, Checkpoint, CycleResult, Draft, TokenSequence, accept_matching
from engine.cuda.megakernel.errors import MegakernelError
from engine.cuda.megakernel.layout import MAX_DRAFT, MAX_ROWS, Ctl, Err, ModelSpec, Mode
from engine.cuda.megakernel.sampling import f32_bits
from engine.cuda.megakernel.schedule import Program
from engine.errors import ContextOverflowError
from engine.sampling import SamplingParams
from engine.spec.verify import greedy_accept, speculative_accept

DEVICE_RULES = (greedy_accept, speculative_accept, accept_matching)  # rules the device's VERIFY implements


class Executor(Protocol):
    """What the backend needs from the VM or the GPU runner."""

    def run(self, program: str | Program) -> None:
        """Run a program (by name or built by hand)."""

    def write_ctl(self, values: dict[int, int]) -> None:
        """Set control words."""

    def read_ctl(self) -> np.ndarray:
        """A copy of the control words (after the work queued before)."""

    def read(self, name: str, rows: int | None = None) -> np.ndarray:
        """A buffer in the VM's float32 form."""

    def write(self, name: str, array: np.ndarray) -> None:
        """Overwrite a buffer from the VM's form."""

    def snapshot(self) -> Any:
        """Copies of every state buffer."""

    def restore(self, snapshot: Any) -> None:
        """Put a snapshot back."""

    def reset_state(self) -> None:
        """Zero every state buffer."""

    def close(self) -> None:
        """Release what the executor holds."""


@dataclass(slots=True)
class MegakernelCheckpoint(Checkpoint):
    """The executor's copy of every state buffer (control words included), tagged with its backend."""

    snapshot: Any
    owner: int


def sampling_words(params: SamplingParams, seed: int) -> dict[int, int]:
    """The control words of a request's sampling parameters."""
    penalties = params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
    return {Ctl.GREEDY: int(params.is_greedy), Ctl.TEMPERATURE: f32_bits(params.temperature),
            Ctl.TOP_K: params.top_k, Ctl.TOP_P: f32_bits(params.top_p), Ctl.MIN_P: f32_bits(params.min_p),
            Ctl.REP_PENALTY: f32_bits(params.repetition_penalty), Ctl.FREQ_PENALTY: f32_bits(params.frequency_penalty),
            Ctl.PRES_PENALTY: f32_bits(params.presence_penalty), Ctl.PENALTIES: int(bool(penalties)),
            Ctl.SEED_LO: int(np.int32(np.uint32(seed & 0xFFFFFFFF))),
            Ctl.SEED_HI: int(np.int32(np.uint32((seed >> 32) & 0xFFFFFFFF)))}


class MegakernelBackend(Backend):
    """One model, one sequence, one launch per cycle. `next_draft` (default: this cycle's n_draft) is how many drafts
    a cycle makes for the next one; `keep_logits` keeps each launch's logits in `last_logits` (tests, diagnostics)."""

    def __init__(self, executor: Executor, spec: ModelSpec, context_size: int):
        if not 0 < context_size <= spec.cfg.context_length:
            raise ValueError(f"context size {context_size} must be in 1..{spec.cfg.context_length}")
        self.ex, self.spec, self._context_size = executor, spec, context_size
        self.next_draft: int | None = None
        self.keep_logits = False
        self.last_logits: np.ndarray | None = None
        self.last_drafts: list[int] = []
        self.launches: Counter[str] = Counter()  # launches by program: one "cycle" per cycle in steady state
        self.reset()

    @classmethod
    def on_vm(cls, path: str | Path, context_size: int | None = None, config=None, use_mtp: bool = True,
              draft_vocab: int | None = None, order: str = "random", seed: int = 0) -> MegakernelBackend:
        """The backend on the Python VM (float32 reference weights of a GGUF file)."""
        from engine.cuda.megakernel.vm import VirtualMachine
        from engine.model.weights import load_model
        from engine.reference.weights import load_weights

        _, cfg, tensors = load_model(str(path))
        spec = ModelSpec.from_tensors(tensors, use_mtp=use_mtp, draft_vocab=draft_vocab)
        context = cfg.context_length if context_size is None else int(context_size)
        vm = VirtualMachine(spec, load_weights(tensors), capacity_for(context), config, order, seed)
        return cls(vm, spec, context)

    # ---- contract: sizes ----

    @property
    def vocab_size(self) -> int:
        """Rows of the logits."""
        return self.spec.cfg.vocab_size

    @property
    def context_size(self) -> int:
        """The most positions a sequence may use."""
        return self._context_size

    @property
    def num_tokens(self) -> int:
        """Committed positions."""
        return self._num_tokens

    @property
    def can_draft(self) -> bool:
        """True when the model has an MTP block."""
        return self.spec.has_mtp

    def reset(self) -> None:
        """Forget the sequence."""
        self.ex.reset_state()
        self._num_tokens, self._verified, self._penalty_key, self._seed_key = 0, None, None, None
        self._seed = 0

    # ---- launches ----

    def _launch(self, program: str | Program, mode: Mode, words: dict[int, int]) -> np.ndarray:
        """Write the control words, run a program (by name, or one built by hand), check the device's error word;
        returns the control words."""
        self.ex.write_ctl({Ctl.MODE: int(mode), Ctl.ERROR: 0, Ctl.SAMPLE_CLIPPED: 0, **words})
        self.ex.run(program)
        name = program if isinstance(program, str) else program.name
        self.launches[name] += 1
        ctl = self.ex.read_ctl()
        if ctl[Ctl.ERROR] != Err.NONE:
            info = ", ".join(str(int(v)) for v in ctl[Ctl.ERROR_INFO : Ctl.ERROR_INFO + 6])
            raise MegakernelError(f"megakernel {name} launch failed: {Err(int(ctl[Ctl.ERROR])).name} "
                                  f"(sm, instruction, wait stage, wait op, counter, expected = {info})")
        return ctl

    def _check(self, tokens: list[int]) -> None:
        """Reject empty input, ids outside the vocabulary, and input past the context window."""
        if not tokens:
            raise ValueError("no tokens to feed")
        bad = [t for t in tokens if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.vocab_size}")
        if self._num_tokens + len(tokens) > self._context_size:
            raise ContextOverflowError(self._num_tokens + len(tokens), self._context_size)

    def _pass_words(self, tokens: list[int]) -> dict[int, int]:
        """Rows, start and ids of a trunk pass."""
        words = {Ctl.NUM_ROWS: len(tokens), Ctl.START: self._num_tokens, Ctl.DRAFTS_READY: 0}
        words.update({Ctl.IDS + i: int(t) for i, t in enumerate(tokens)})
        return words

    def prefill(self, tokens: list[int]) -> np.ndarray:
        """Feed and commit tokens, MAX_ROWS a launch; logits [V] after the last one."""
        self._check(tokens)
        self._verified, self._penalty_key = None, None
        for lo in range(0, len(tokens), MAX_ROWS):
            chunk = [int(t) for t in tokens[lo : lo + MAX_ROWS]]
            self._launch("cycle", Mode.PREFILL, {**self._pass_words(chunk), Ctl.DRAFT_NEXT: 0, Ctl.GREEDY: 1,
                                                 Ctl.PENALTIES: 0})
            self._num_tokens += len(chunk)
        return self.ex.read("logits", len(chunk))[-1]

    def verify(self, tokens: list[int]) -> np.ndarray:
        """Feed up to MAX_ROWS tokens without committing (MODE_HOST); logits [T, V]."""
        self._check(tokens)
        if len(tokens) > MAX_ROWS:
            raise ValueError(f"verify takes at most {MAX_ROWS} tokens, got {len(tokens)}")
        self._launch("verify", Mode.HOST, {**self._pass_words([int(t) for t in tokens]), Ctl.GREEDY: 1,
                                           Ctl.PENALTIES: 0})
        # the pass applied the previous commit; nothing of this one counts until accept()
        self.ex.write_ctl({Ctl.COMMIT_N: 0})
        self._verified, self._penalty_key = [int(t) for t in tokens], None
        return self.ex.read("logits", len(tokens))

    def accept(self, n: int) -> None:
        """Commit the first n tokens of the last verify(): MTP catch-up of those rows (MODE_CATCHUP)."""
        if self._verified is None:
            raise ValueError("accept() without a verify() to accept from")
        if not 1 <= n <= len(self._verified):
            raise ValueError(f"cannot accept {n} of {len(self._verified)} tokens")
        tokens, self._verified = self._verified, None
        self.ex.write_ctl({Ctl.COMMIT_N: n})
        if self.spec.has_mtp:
            words = {Ctl.MTP_ROWS: n, Ctl.MTP_POS: self._num_tokens, Ctl.DRAFT_NEXT: 0}
            words.update({Ctl.MTP_IDS + i: t for i, t in enumerate(tokens[:n])})
            self._launch("mtp", Mode.CATCHUP, words)
        else:
            self.ex.write("last_hidden", self.ex.read("hidden")[n - 1])
        self._num_tokens += n

    def draft(self, token: int, num_draft: int) -> Draft:
        """num_draft greedy MTP drafts after `token`, the pending token (MODE_DRAFT; the state is unchanged)."""
        if not self.spec.has_mtp:
            raise ValueError("this model has no MTP block to draft with")
        if not 0 <= num_draft <= MAX_DRAFT:
            raise ValueError(f"the megakernel drafts 0..{MAX_DRAFT} tokens, not {num_draft}")
        if not 0 <= int(token) < self.vocab_size:
            raise ValueError(f"token id {token} is outside the vocabulary of {self.vocab_size}")
        if num_draft == 0:
            return Draft([])
        ctl = self._launch("mtp", Mode.DRAFT, {Ctl.MTP_ROWS: 1, Ctl.MTP_POS: self._num_tokens,
                                               Ctl.MTP_IDS: int(token), Ctl.DRAFT_NEXT: num_draft})
        return Draft([int(t) for t in ctl[Ctl.DRAFTS : Ctl.DRAFTS + num_draft]])

    # ---- the speculative cycle ----

    def cycle(self, seq: TokenSequence, n_draft: int, params: SamplingParams, draft: Draft | None = None,
              rule: AcceptRule = accept_matching) -> CycleResult:
        """One launch: verify the pending token and the drafts, accept on the device, commit, draft the next ones.

        Rules other than the device's (greedy / speculative sampling) go through verify() + accept() instead.
        """
        if rule not in DEVICE_RULES:
            self._penalty_key = None
            return super().cycle(seq, n_draft, params, draft, rule)
        if self._num_tokens != len(seq.tokens) - 1:
            raise ValueError(f"backend holds {self._num_tokens} tokens, sequence expects {len(seq.tokens) - 1}")
        room = self._context_size - len(seq.tokens)
        if room < 0:
            raise ContextOverflowError(len(seq.tokens), self._context_size)
        words = self._draft_words(seq.pending, min(n_draft, room, MAX_DRAFT), draft, room)
        words.update(self._penalty_words(seq, params))
        num_rows = words[Ctl.NUM_ROWS]
        if self.keep_logits:
            self.last_drafts = [int(t) for t in self.ex.read_ctl()[Ctl.IDS + 1 : Ctl.IDS + num_rows]]
        next_draft = n_draft if self.next_draft is None else self.next_draft
        words[Ctl.DRAFT_NEXT] = min(max(next_draft, 0), MAX_DRAFT) if self.spec.has_mtp else 0
        ctl = self._launch("cycle", Mode.CYCLE, words)
        emitted = [int(t) for t in ctl[Ctl.EMITTED : Ctl.EMITTED + int(ctl[Ctl.NUM_EMITTED])]]
        if self.keep_logits:
            self.last_logits = self.ex.read("logits", num_rows)
        self._num_tokens += len(emitted)
        seq.tokens.extend(emitted)
        self._penalty_key = (id(seq), len(seq.tokens))
        return CycleResult(emitted, num_rows - 1, len(emitted) - 1)

    def _draft_words(self, pending: int, wanted: int, draft: Draft | None, room: int) -> dict[int, int]:
        """Rows and (where the host supplies them) ids of this cycle's pass."""
        if draft is not None:  # drafts from the host (n-gram lookup): they replace the device's
            tokens = [int(pending)] + [int(t) for t in draft.truncated(max(room, 0)).tokens[: MAX_ROWS - 1]]
            return {Ctl.NUM_ROWS: len(tokens), Ctl.START: self._num_tokens,
                    **{Ctl.IDS + i: t for i, t in enumerate(tokens)}}
        ctl = self.ex.read_ctl()
        ready = int(ctl[Ctl.DRAFTS_READY]) if int(ctl[Ctl.IDS]) == int(pending) else 0
        if wanted > ready and self.spec.has_mtp:
            ready = len(self.draft(pending, wanted).tokens)  # leaves [pending, drafts] in CTL_IDS
        if ready == 0:
            return {Ctl.NUM_ROWS: 1, Ctl.START: self._num_tokens, Ctl.IDS: int(pending)}
        return {Ctl.NUM_ROWS: 1 + min(wanted, ready), Ctl.START: self._num_tokens}

    def _penalty_words(self, seq: TokenSequence, params: SamplingParams) -> dict[int, int]:
        """Sampling words; re-uploads the penalty history when the device's is not this sequence's."""
        key = (id(seq), seq.num_prompt_tokens)
        if self._seed_key != key:  # one seed per sequence: the request's, or drawn from the sequence's rng
            self._seed_key = key
            self._seed = int(params.seed) if params.seed is not None else int(seq.rng.integers(0, 2**63))
        words = sampling_words(params, self._seed)
        if words[Ctl.PENALTIES] and self._penalty_key != (id(seq), len(seq.tokens)):
            counts = np.bincount(np.asarray(seq.generated, np.int64), minlength=self.vocab_size)
            seen = np.zeros(self.vocab_size, np.uint8)
            seen[np.asarray(seq.tokens, np.int64)] = 1
            self.ex.write("counts", counts[: self.vocab_size].astype(np.int32))
            self.ex.write("seen", seen)
        return words

    # ---- checkpoints ----

    def materialize(self) -> None:
        """Apply a pending DeltaNet commit now (the commit program), so the buffers hold the committed state."""
        if int(self.ex.read_ctl()[Ctl.COMMIT_N]) and any(k == "deltanet" for k in self.spec.cfg.layer_kinds):
            self._launch("commit", Mode.CYCLE, {})
        self.ex.write_ctl({Ctl.COMMIT_N: 0})

    def checkpoint(self) -> MegakernelCheckpoint:
        """A copy of every state buffer (a pending commit travels with it)."""
        return MegakernelCheckpoint(self._num_tokens, self.ex.snapshot(), id(self))

    def rollback(self, checkpoint: Checkpoint) -> None:
        """Restore a checkpoint of this backend (it stays usable)."""
        if not isinstance(checkpoint, MegakernelCheckpoint) or checkpoint.owner != id(self):
            raise ValueError("checkpoint was not taken by this backend")
        self.ex.restore(checkpoint.snapshot)
        self._num_tokens, self._verified, self._penalty_key = checkpoint.num_tokens, None, None

    def close(self) -> None:
        """Release the executor."""
        self.ex.close()


def capacity_for(context_size: int) -> int:
    """KV rows per layer: the context, plus the rows a pass and the draft steps may write past it."""
    return context_size + MAX_ROWS + MAX_DRAFT
