"""Backend.cycle with each verify row's token chosen where the logits are (Backend.verify_choose, RowChoices): which
rules take that way, what they emit, and that greedy decoding comes out token for token as the host's. A reference
backend makes the device's choices as the CUDA backend does for the requests it sends there (device_chooses: top_k,
top_p and the penalties too): the penalties through engine/cuda/penalties.py's PenaltyCounts on a host-memory device
running the kernels' numpy models (tests/kernels/penalties_model.py), then the numpy model of kernels/sample.cu
choose_rows (tests/kernels/choose_rows_model.py); it holds each row to the host's rule (engine/sampling.py
keep_or_resample, sample, with the row's history and the prompt) fed the same uniform numbers. The kernels' own
arithmetic is checked on the GPU (bench/gpu_ops.py check_choose_rows, bench/gpu_penalties.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import Draft, RowChoices, TokenSequence, accept_choices
from engine.cuda.backend import device_chooses
from engine.cuda.model import VERIFY_MAX
from engine.cuda.penalties import PenaltyCounts, has_penalties
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams, keep_or_resample, sample
from engine.server.generation import capture_logits, stop_at_ids
from engine.spec.verify import rule_for
from tests.bench.test_gpu_choose import _ChoosingDevice
from tests.engine.reference.conftest import tiny_model
from tests.engine.test_sampling import _Uniforms
from tests.kernels import choose_rows_model

GREEDY = SamplingParams(temperature=0)


class _ChoosingBackend(ReferenceBackend):
    """A reference backend that chooses each row's token as the CUDA backend's verify_choose does (penalties on the
    rows' logits, then choose_rows' numpy model on rng.random((T, 2)) a pass), and counts the rows whose choice is
    not the host rule's for the same uniforms (`differ`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chose, self.verified, self.differ, self.rows = 0, 0, 0, 0
        self.dev = _ChoosingDevice()
        self.penalties = PenaltyCounts(self.dev, self.vocab_size)
        self.logits_buf = self.dev.alloc(4 * VERIFY_MAX * self.vocab_size, "logits")
        self.drafts_buf = self.dev.alloc(4 * VERIFY_MAX, "drafts")

    def verify(self, tokens):
        self.verified += 1
        return super().verify(tokens)

    def verify_choose(self, tokens, draft, params, rng, seq=None):
        if not device_chooses(params) or (has_penalties(params) and seq is None):
            return None
        logits = super().verify(tokens)
        self.chose += 1
        drafts = np.array([*draft.tokens, -1], np.int32)
        rows = logits
        if has_penalties(params):  # as CudaBackend.verify_choose: the rows penalised in place on the device
            self.penalties.sync(seq)
            self.dev.upload(self.logits_buf, logits)
            self.dev.upload(self.drafts_buf, drafts)
            self.penalties.apply(self.logits_buf, self.drafts_buf, len(tokens), params)
            rows = self.dev.download(self.logits_buf, np.float32, logits.shape)
        u = np.zeros((len(tokens), 2)) if params.is_greedy else rng.random((len(tokens), 2))
        out = choose_rows_model.choose_rows(rows, drafts, u, params.temperature, params.min_p, params.top_k,
                                            params.top_p, params.is_greedy)
        assert (out[:, 0] >= 0).all(), "a tiny model's row is never the host's"
        prompt, generated = (seq.prompt, seq.generated) if seq is not None else ([], [])
        for i, x in enumerate(drafts):
            history = generated + [int(d) for d in drafts[:i]]
            self.differ += (int(out[i, 0]), bool(out[i, 1])) != _host_choice(logits[i], params, int(x), u[i],
                                                                             history, prompt)
            self.rows += 1
        return RowChoices([int(t) for t in out[:, 0]], [bool(k) for k in out[:, 1]])


def _host_choice(row: np.ndarray, params: SamplingParams, x: int, u: np.ndarray, history: list[int],
                 prompt: list[int]) -> tuple[int, bool]:
    """(token, kept) of the host's rule for a row (the raw logits: the rule applies the penalties itself)."""
    if params.is_greedy:
        token = sample(row, params, history=history, prompt=prompt)
        return token, token == x
    if x < 0:
        return sample(row, params, _Uniforms(u[0]), history, prompt), False
    kept, token = keep_or_resample(row, params, x, _Uniforms(*u), history, prompt)
    return token, kept


def _recent(seq: TokenSequence, step: int) -> Draft:
    """0-3 of the sequence's last tokens (a deterministic drafter; some kept, some not)."""
    return Draft(seq.tokens[-3:][: step % 4])


def _repeating(seq: TokenSequence, step: int) -> Draft:
    """The last token drafted 1-3 times: a draft repeated inside the draft, each copy in the later rows' history."""
    return Draft([seq.tokens[-1]] * (1 + step % 3))


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def _decode(backend, params: SamplingParams, rule, steps: int = 12, prompt: list[int] = PROMPT,
            drafter=_recent) -> list[int]:
    """Cycles of drafts the drafter makes from the sequence, from a fresh prefill of the prompt."""
    backend.reset()
    backend.prefill(prompt[:-1])
    seq = TokenSequence.start(prompt, params)
    for step in range(steps):
        backend.cycle(seq, 0, params, draft=drafter(seq, step), rule=rule)
    return seq.generated


# Repetition alone; frequency with presence; Qwen's setting with its presence penalty; all three under top_k, top_p
# and min_p; below neutral (repeats favoured)
PENALISED = [SamplingParams(temperature=0.8, repetition_penalty=1.3, seed=5),
             SamplingParams(temperature=0.9, frequency_penalty=0.5, presence_penalty=1.5, seed=5),
             SamplingParams(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5, seed=5),
             SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
                            frequency_penalty=0.4, presence_penalty=1.0, seed=5),
             SamplingParams(temperature=1.2, repetition_penalty=0.7, presence_penalty=-2.0, seed=5)]
GREEDY_PENALISED = SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=1.5)


@pytest.mark.parametrize("params", [GREEDY, GREEDY_PENALISED], ids=str)
@pytest.mark.parametrize("drafter", [_recent, _repeating])
def test_greedy_cycles_from_the_rows_choices_equal_the_hosts(params, drafter):
    host = ReferenceBackend(tiny_model("qwen35"))
    device = _ChoosingBackend(tiny_model("qwen35"))
    want = _decode(host, params, rule_for(params), drafter=drafter)
    assert _decode(device, params, rule_for(params), drafter=drafter) == want
    assert device.chose == 12 and device.verified == 0 and device.differ == 0
    if params is GREEDY_PENALISED:  # the penalties change what greedy decoding emits
        assert want != _decode(host, GREEDY, rule_for(GREEDY), drafter=drafter)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, seed=5), SamplingParams(temperature=0.7, min_p=0.1, seed=5),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.95, seed=5),  # Qwen's recommended setting
    SamplingParams(temperature=0.7, top_p=0.8, seed=5), SamplingParams(top_k=1, seed=5),
    SamplingParams(top_p=1e-9, seed=5), SamplingParams(temperature=1.5, top_k=50, top_p=0.9, min_p=0.05, seed=5),
    *PENALISED,
], ids=str)
def test_sampled_cycles_take_the_choices_and_stay_reproducible(params):
    """Every cycle takes the device's way, each row's choice is the host rule's for the same uniforms, and a seeded
    request decodes the same tokens twice."""
    backends = [_ChoosingBackend(tiny_model("qwen35")) for _ in range(2)]
    runs = [_decode(backend, params, rule_for(params), steps=16) for backend in backends]
    assert runs[0] == runs[1] and len(runs[0]) >= 16
    assert backends[0].chose == 16 and backends[0].verified == 0
    assert backends[0].rows >= 30 and backends[0].differ == 0


@pytest.mark.parametrize("params", [PENALISED[3], GREEDY_PENALISED], ids=str)
def test_penalties_follow_the_sequence_across_cycles_and_rebuild_for_another(params):
    """One sequence's cycles update the device's counts from its new tokens (one full upload, at its first cycle);
    the next request's sequence, a long prompt over most of the vocabulary with repeated drafts, is rebuilt from
    scratch, and its rows are still the host rule's."""
    backend = _ChoosingBackend(tiny_model("qwen35", context_length=1024))
    _decode(backend, params, rule_for(params), steps=10)
    assert backend.penalties.num_rebuilds == 1 and backend.dev.launched.count("penalty_count") == 9
    assert max(n for what, n in backend.dev.uploads if what == "penalties.staging") <= 4 * 4  # a cycle's tokens
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, backend.vocab_size, 600)]
    got = _decode(backend, params, rule_for(params), steps=10, prompt=prompt, drafter=_repeating)
    assert backend.penalties.num_rebuilds == 2 and backend.differ == 0 and backend.rows >= 40
    if params.is_greedy:
        host = ReferenceBackend(tiny_model("qwen35", context_length=1024))
        assert got == _decode(host, params, rule_for(params), steps=10, prompt=prompt, drafter=_repeating)


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
    _decode(backend, SamplingParams(temperature=0, top_k=5000), rule_for(GREEDY), steps=3)
    assert (backend.chose, backend.verified) == (0, 3)
    assert ReferenceBackend(tiny_model("qwen35")).verify_choose([1], Draft([]), GREEDY, np.random.default_rng()) is None
    # penalties need the sequence (Backend.cycle passes it): a caller without it gets the host's way
    assert backend.verify_choose([1], Draft([]), GREEDY_PENALISED, np.random.default_rng()) is None
