"""Backend.cycle with each verify row's token chosen where the logits are (Backend.verify_choose, RowChoices): which
rules take that way, what they emit, and that greedy decoding comes out token for token as the host's. The device
arithmetic itself is checked on the GPU (bench/gpu_ops.py check_choose_rows); here a reference backend makes the
same choices in numpy (engine/sampling.py keep_or_resample, the host's own rule for a deterministic draft)."""

from __future__ import annotations

import numpy as np

from engine.backend import Draft, RowChoices, TokenSequence, accept_choices
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams, keep_or_resample, sample
from engine.server.generation import capture_logits, stop_at_ids
from engine.spec.verify import rule_for
from tests.engine.reference.conftest import tiny_model

GREEDY = SamplingParams(temperature=0)


class _ChoosingBackend(ReferenceBackend):
    """A reference backend that chooses each row's token itself, as the CUDA backend's choose_rows does."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chose, self.verified = 0, 0

    def verify(self, tokens):
        self.verified += 1
        return super().verify(tokens)

    def verify_choose(self, tokens, draft, params, rng):
        if params.presence_penalty:
            return None
        logits = super().verify(tokens)
        self.chose += 1
        if params.is_greedy:
            best = [int(np.argmax(row)) for row in logits]
            return RowChoices(best, [b == x for b, x in zip(best, draft.tokens)] + [False])
        rows = [keep_or_resample(logits[i], params, x, rng) for i, x in enumerate(draft.tokens)]
        last = sample(logits[len(draft.tokens)], params, rng)
        return RowChoices([t for _, t in rows] + [last], [k for k, _ in rows] + [False])


def _decode(backend, params: SamplingParams, rule, steps: int = 12) -> list[int]:
    """Greedy-drafted cycles: each cycle drafts the model's own last choices (a deterministic drafter)."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    backend.prefill(prompt[:-1])
    seq = TokenSequence.start(prompt, params)
    for step in range(steps):
        draft = Draft(seq.tokens[-3:][: step % 4])  # 0-3 drafts, some kept, some not
        backend.cycle(seq, 0, params, draft=draft, rule=rule)
    return seq.generated


def test_greedy_cycles_from_the_rows_choices_equal_the_hosts():
    host = ReferenceBackend(tiny_model("qwen35"))
    device = _ChoosingBackend(tiny_model("qwen35"))
    assert _decode(device, GREEDY, rule_for(GREEDY)) == _decode(host, GREEDY, rule_for(GREEDY))
    assert device.chose == 12 and device.verified == 0


def test_sampled_cycles_take_the_choices_and_stay_reproducible():
    params = SamplingParams(temperature=0.8, seed=5)
    runs = [_decode(_ChoosingBackend(tiny_model("qwen35")), params, rule_for(params)) for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) >= 12


def test_the_rules_that_may_take_the_choices():
    choices = RowChoices([7, 8, 9], [True, False, False])
    assert accept_choices(Draft([7, 5]), choices) == [7, 8]  # the kept draft, then the token drawn at row 1
    assert accept_choices(Draft([]), RowChoices([4], [False])) == [4]
    stop = stop_at_ids(rule_for(GREEDY), frozenset({7}))
    assert stop.on_choices(Draft([7, 5]), choices) == [7]  # a stop id ends the cycle on the choices' way too
    assert getattr(capture_logits(rule_for(GREEDY), []), "on_choices", None) is None  # it needs the logits


def test_rules_without_choices_and_backends_that_decline_verify_on_the_host():
    backend = _ChoosingBackend(tiny_model("qwen35"))
    _decode(backend, GREEDY, capture_logits(rule_for(GREEDY), []), steps=3)
    assert (backend.chose, backend.verified) == (0, 3)
    backend = _ChoosingBackend(tiny_model("qwen35"))
    _decode(backend, SamplingParams(temperature=0, presence_penalty=0.5), rule_for(GREEDY), steps=3)
    assert (backend.chose, backend.verified) == (0, 3)
    assert ReferenceBackend(tiny_model("qwen35")).verify_choose([1], Draft([]), GREEDY, np.random.default_rng()) is None
