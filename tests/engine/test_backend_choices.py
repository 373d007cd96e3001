"""Backend.cycle with each verify row's token chosen where the logits are (Backend.verify_choose, RowChoices): which
rules take that way, what they emit, and that greedy decoding comes out token for token as the host's. A reference
backend makes the device's choices with the numpy model of kernels/sample.cu choose_rows (tests/kernels/
choose_rows_model.py) for the requests the CUDA backend sends there (device_chooses: top_k and top_p too), and holds
each sampled row to the host's rule (engine/sampling.py keep_or_resample, sample) fed the same uniform numbers. The
kernel's own arithmetic is checked on the GPU (bench/gpu_ops.py check_choose_rows)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import Draft, RowChoices, TokenSequence, accept_choices
from engine.cuda.backend import device_chooses
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams, keep_or_resample, sample
from engine.server.generation import capture_logits, stop_at_ids
from engine.spec.verify import rule_for
from tests.engine.reference.conftest import tiny_model
from tests.engine.test_sampling import _Uniforms
from tests.kernels import choose_rows_model

GREEDY = SamplingParams(temperature=0)


class _ChoosingBackend(ReferenceBackend):
    """A reference backend that chooses each row's token as the CUDA backend's choose_rows does (its numpy model, on
    rng.random((T, 2)) a pass), and counts the sampled rows whose choice is not the host rule's for the same
    uniforms (`differ`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chose, self.verified, self.differ, self.rows = 0, 0, 0, 0

    def verify(self, tokens):
        self.verified += 1
        return super().verify(tokens)

    def verify_choose(self, tokens, draft, params, rng):
        if not device_chooses(params):
            return None
        logits = super().verify(tokens)
        self.chose += 1
        drafts = np.array([*draft.tokens, -1])
        u = np.zeros((len(tokens), 2)) if params.is_greedy else rng.random((len(tokens), 2))
        out = choose_rows_model.choose_rows(logits, drafts, u, params.temperature, params.min_p, params.top_k,
                                            params.top_p, params.is_greedy)
        assert (out[:, 0] >= 0).all(), "a tiny model's row is never the host's"
        if not params.is_greedy:
            for i, x in enumerate(drafts):
                want = (keep_or_resample(logits[i], params, int(x), _Uniforms(*u[i])) if x >= 0
                        else (False, sample(logits[i], params, _Uniforms(u[i, 0]))))
                self.differ += (int(out[i, 0]), bool(out[i, 1])) != (want[1], want[0])
                self.rows += 1
        return RowChoices([int(t) for t in out[:, 0]], [bool(k) for k in out[:, 1]])


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


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, seed=5), SamplingParams(temperature=0.7, min_p=0.1, seed=5),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.95, seed=5),  # Qwen's recommended setting
    SamplingParams(temperature=0.7, top_p=0.8, seed=5), SamplingParams(top_k=1, seed=5),
    SamplingParams(top_p=1e-9, seed=5), SamplingParams(temperature=1.5, top_k=50, top_p=0.9, min_p=0.05, seed=5),
], ids=str)
def test_sampled_cycles_take_the_choices_and_stay_reproducible(params):
    """Every cycle takes the device's way, each row's choice is the host rule's for the same uniforms, and a seeded
    request decodes the same tokens twice."""
    backends = [_ChoosingBackend(tiny_model("qwen35")) for _ in range(2)]
    runs = [_decode(backend, params, rule_for(params), steps=16) for backend in backends]
    assert runs[0] == runs[1] and len(runs[0]) >= 16
    assert backends[0].chose == 16 and backends[0].verified == 0
    assert backends[0].rows >= 30 and backends[0].differ == 0


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
