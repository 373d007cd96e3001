"""Backend.feed and a cycle without drafts: the pending token fed and committed in one step (feed, feed_choose), which
the CUDA backend runs as one committing pass instead of a verify pass and the commit's DeltaNet re-run. A backend
that feeds the way the CUDA backend does (a one-token prefill) must decode exactly as the contract's default
(verify, then accept) does, greedy and sampled, and a cycle with drafts must still verify them."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import Draft, TokenSequence
from engine.errors import ContextOverflowError
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams
from engine.spec.verify import rule_for
from tests.engine.reference.conftest import tiny_model

PROMPT = [5, 17, 3, 99, 42, 8, 61]


class _PrefillFeeding(ReferenceBackend):
    """Feeds a token as one committing pass (a one-token prefill), as CudaBackend.feed does, and counts calls."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def feed(self, token: int) -> np.ndarray:
        self.calls.append("feed")
        return self.prefill([token])

    def verify(self, tokens: list[int]) -> np.ndarray:
        self.calls.append("verify")
        return super().verify(tokens)


def _decode(backend: ReferenceBackend, params: SamplingParams, steps: int, drafts: list[Draft] | None = None
            ) -> list[int]:
    backend.reset()
    backend.prefill(PROMPT[:-1])
    seq = TokenSequence.start(PROMPT, params)
    for step in range(steps):
        draft = None if drafts is None else drafts[step]
        backend.cycle(seq, 0, params, draft=draft, rule=rule_for(params))
    return seq.generated


@pytest.mark.parametrize("arch", ["qwen35", "qwen2"])
def test_feed_leaves_the_state_of_verify_then_accept(arch: str) -> None:
    model = tiny_model(arch)
    fed, verified = ReferenceBackend(model), ReferenceBackend(model)
    for backend in (fed, verified):
        backend.prefill(PROMPT)
    for token in (7, 7, 120, 0, 33):
        row = fed.feed(token)
        want = verified.verify([token])[0]
        verified.accept(1)
        np.testing.assert_allclose(row, want, rtol=1e-6, atol=1e-6)
        assert fed.num_tokens == verified.num_tokens
    np.testing.assert_allclose(fed.verify([9, 10, 11]), verified.verify([9, 10, 11]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=0.9, top_p=0.95, seed=3),
                                    SamplingParams(temperature=0.8, presence_penalty=1.5, seed=4)])
def test_cycles_without_drafts_feed_once_and_decode_as_verify_and_accept(params: SamplingParams) -> None:
    model = tiny_model("qwen35")
    feeding = _PrefillFeeding(model)
    want = _decode(ReferenceBackend(model), params, 12)
    got = _decode(feeding, params, 12)
    assert got == want
    assert feeding.calls == ["feed"] * 12  # no verify pass, no second feed


def test_a_cycle_with_drafts_still_verifies_them() -> None:
    model = tiny_model("qwen35")
    params = SamplingParams(temperature=0.0)
    plain = _decode(ReferenceBackend(model), params, 6)
    drafts = [Draft([plain[i]] if i % 2 else []) for i in range(6)]  # every other cycle drafts the right token
    feeding = _PrefillFeeding(model)
    got = _decode(feeding, params, 6, drafts)
    assert got[:6] == plain
    assert feeding.calls.count("verify") == 3 and feeding.calls.count("feed") == 3


def test_feed_choose_that_declines_feeds_nothing() -> None:
    backend = ReferenceBackend(tiny_model("qwen35"))  # chooses nothing on a device: verify_choose gives None
    backend.prefill(PROMPT)
    before = backend.num_tokens
    assert backend.feed_choose(3, SamplingParams(temperature=0.0), np.random.default_rng(0)) is None
    assert backend.num_tokens == before


def test_feed_past_the_context_is_refused_and_loses_nothing() -> None:
    backend = ReferenceBackend(tiny_model("qwen35", context_length=len(PROMPT) + 1))
    backend.prefill(PROMPT)
    backend.feed(1)
    with pytest.raises(ContextOverflowError):
        backend.feed(2)
    assert backend.num_tokens == len(PROMPT) + 1
