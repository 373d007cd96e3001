"""The speculative decoding step: choose a draft length, draft, verify 1 + d tokens in one pass, keep what the model
agrees with. Backend.cycle does the verify-accept-commit; this module adds the drafter, the adaptive length and the
acceptance statistics, so the server and the tests drive generation through the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.backend import AcceptRule, Backend, CycleResult, Draft, TokenSequence
from engine.sampling import SamplingParams
from engine.spec.adaptive import DraftLengthController
from engine.spec.drafter import Drafter
from engine.spec.mtp import MtpDrafter
from engine.spec.verify import rule_for


@dataclass(slots=True)
class SpecStats:
    """Counts over cycles: forward passes, drafted and accepted tokens, tokens emitted."""

    num_cycles: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    num_emitted: int = 0

    def add(self, result: CycleResult) -> None:
        """Count one cycle."""
        self.num_cycles += 1
        self.num_drafted += result.num_drafted
        self.num_accepted += result.num_accepted
        self.num_emitted += len(result.tokens)

    @property
    def tokens_per_pass(self) -> float:
        """Tokens emitted per verify pass (the acceptance length; 1.0 without speculation)."""
        return self.num_emitted / self.num_cycles if self.num_cycles else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens the model kept."""
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0


class SpeculativeDecoder:
    """Runs cycles on a backend with an optional drafter; one instance serves many sequences, one at a time.

    The controller persists across sequences: acceptance is a property of the model and the workload more than of
    one request. With drafter None every cycle verifies the pending token alone (plain decoding).
    """

    def __init__(self, backend: Backend, drafter: Drafter | None = None,
                 controller: DraftLengthController | None = None, max_draft: int = 4):
        if drafter is not None and controller is None:
            controller = DraftLengthController(max_draft=max_draft)
        self.backend, self.drafter, self.controller = backend, drafter, controller

    def start(self, seq: TokenSequence) -> None:
        """Begin decoding seq (its prompt is prefilled: the backend holds every token but the pending one)."""
        if self.drafter is not None:
            self.drafter.start(seq.tokens)

    def step(self, seq: TokenSequence, params: SamplingParams, max_new: int,
             rule: AcceptRule | None = None) -> CycleResult:
        """One cycle emitting 1..max_new tokens (appended to seq); rule defaults to rule_for(params)."""
        if max_new < 1:
            raise ValueError(f"max_new must be >= 1, got {max_new}")
        rule = rule_for(params) if rule is None else rule
        num_draft = 0
        if self.drafter is not None and self.controller is not None:
            num_draft = min(self.controller.choose(), max_new - 1)
        started = time.perf_counter()
        if num_draft > 0 and isinstance(self.drafter, MtpDrafter):
            # the backend drafts with its own head inside cycle() (on the device, for the megakernel)
            result = self.backend.cycle(seq, num_draft, params, rule=rule)
        else:
            draft = self.drafter.propose(seq.tokens, num_draft) if num_draft > 0 else Draft([])
            result = self.backend.cycle(seq, 0, params, draft=draft, rule=rule)
        if self.controller is not None:
            self.controller.update(result.num_drafted, result.num_accepted, time.perf_counter() - started)
        return result
