"""The reference forward pass and its state: T-at-once equals one-by-one, prefix commits, exact rollback, MTP."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.reference.conftest import generate, tiny_model, tokens
from engine.backend import TokenSequence
from engine.errors import ContextOverflowError
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)


def one_by_one(backend: ReferenceBackend, ids: list[int]) -> np.ndarray:
    rows = []
    for token in ids:
        rows.append(backend.verify([token])[0])
        backend.accept(1)
    return np.stack(rows)


def state_of(backend: ReferenceBackend) -> dict[str, np.ndarray]:
    return {name: array.copy() for name, array in backend.state.arrays()}


def assert_states(a: dict, b: dict, exact: bool, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if exact:
            assert np.array_equal(a[name], b[name]), name
        else:
            np.testing.assert_allclose(a[name], b[name], atol=atol, rtol=1e-4, err_msg=name)


def test_t_tokens_at_once_equal_one_by_one(backend):
    ids = tokens(70)  # more than one 64-token DeltaNet chunk
    last = backend.prefill(ids)
    stepwise = ReferenceBackend(backend.model)
    rows = one_by_one(stepwise, ids)
    assert np.abs(last - rows[-1]).max() < 1e-4
    assert_states(state_of(backend), state_of(stepwise), exact=False, atol=1e-4)
    together = ReferenceBackend(backend.model)
    assert np.abs(together.verify(ids[:12]) - rows[:12]).max() < 1e-4
    # and the states keep agreeing: the next token's logits match too
    assert np.abs(backend.verify([5])[0] - stepwise.verify([5])[0]).max() < 1e-4


def test_rollback_then_refeed_is_bit_identical(backend):
    backend.prefill(tokens(9))
    saved, before = backend.checkpoint(), state_of(backend)

    def run() -> tuple[list[np.ndarray], dict]:
        out = [backend.prefill(tokens(6, seed=1)), backend.verify(tokens(4, seed=2))]
        backend.accept(2)
        out.append(backend.verify([3])[0])
        backend.accept(1)
        return out, state_of(backend)

    first_logits, first_state = run()
    backend.rollback(saved)
    assert_states(state_of(backend), before, exact=True)
    backend.prefill(tokens(20, seed=3))  # overwrite cache rows the checkpoint also covers, then come back
    backend.rollback(saved)
    second_logits, second_state = run()
    for a, b in zip(first_logits, second_logits, strict=True):
        assert np.array_equal(a, b)
    assert_states(first_state, second_state, exact=True)


def test_accept_commits_exactly_the_prefix(backend):
    backend.prefill(tokens(5))
    saved = backend.checkpoint()
    ids = tokens(5, seed=11)
    backend.verify(ids)
    backend.accept(3)
    partial = state_of(backend)
    assert backend.num_tokens == 8
    backend.rollback(saved)
    backend.verify(ids[:3])
    backend.accept(3)
    assert_states(partial, state_of(backend), exact=False, atol=1e-6)
    backend.rollback(saved)
    backend.verify(ids)
    backend.accept(5)
    full = state_of(backend)
    assert any(partial[k].shape != full[k].shape or not np.allclose(partial[k], full[k]) for k in partial)


def test_verify_leaves_state_until_accept(backend):
    backend.prefill(tokens(4))
    before = state_of(backend)
    backend.verify(tokens(3, seed=5))
    assert_states(before, state_of(backend), exact=True)
    assert backend.num_tokens == 4
    backend.verify(tokens(2, seed=6))  # a new verify discards the unaccepted one
    backend.accept(2)
    assert backend.num_tokens == 6
    with pytest.raises(ValueError, match="without a verify"):
        backend.accept(1)


def test_greedy_cycle_is_deterministic_and_matches_argmax(backend):
    prompt = tokens(6)
    out, _ = generate(backend, prompt, 10, GREEDY)
    again, _ = generate(ReferenceBackend(backend.model), prompt, 10, GREEDY)
    assert out == again
    backend.reset()
    logits, manual = backend.prefill(prompt), []
    for _ in range(10):
        manual.append(int(np.argmax(logits)))
        logits = backend.prefill([manual[-1]])
    assert out == manual


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.9, top_p=0.95, seed=4)])
def test_speculation_never_changes_the_output(backend, params):
    prompt = tokens(5)
    plain, _ = generate(backend, prompt, 12, params)
    # perfect drafts: everything accepted, same output
    oracle, stats = generate(backend, prompt, 12, params, n_draft=3, drafts=plain)
    assert oracle == plain and stats[0].num_accepted == 3
    # wrong drafts: rejected, same output
    wrong = [(t + 1) % 128 for t in plain]
    rejected, stats = generate(backend, prompt, 12, params, n_draft=3, drafts=wrong)
    assert rejected == plain and all(s.num_accepted == 0 for s in stats)
    if backend.can_draft:
        mtp, stats = generate(backend, prompt, 12, params, n_draft=2)
        assert mtp == plain and all(s.num_drafted == 2 for s in stats)


def test_mtp_drafts_run_and_leave_state_alone():
    backend = ReferenceBackend(tiny_model("qwen35"))
    assert backend.can_draft
    backend.prefill(tokens(10))
    before = state_of(backend)
    draft = backend.draft(17, 4)
    assert len(draft.tokens) == 4 and draft.logits.shape == (4, 128)
    assert draft.tokens == [int(np.argmax(row)) for row in draft.logits]
    assert_states(before, state_of(backend), exact=True)
    assert backend.draft(17, 4).tokens == draft.tokens
    stepwise = ReferenceBackend(backend.model)
    one_by_one(stepwise, tokens(10))
    assert stepwise.draft(17, 4).tokens == draft.tokens
    np.testing.assert_allclose(stepwise.draft(17, 4).logits, draft.logits, atol=1e-4)


def test_mtp_first_draft_matches_a_fresh_mtp_pass():
    """The cached MTP state plus a draft step equals one MTP pass over (token p, trunk hidden p-1) from scratch."""
    from engine.reference.qwen35 import mtp_block
    from engine.reference.state import KVCache

    backend = ReferenceBackend(tiny_model("qwen35"))
    ids = tokens(8)
    backend.prefill(ids[:4])
    backend.verify(ids[4:])
    backend.accept(4)  # the MTP cache was filled over two passes
    draft = backend.draft(42, 1)
    model = backend.model
    fresh = backend.__class__(model)
    hidden = fresh.model.forward(fresh.state, ids, keep_steps=True).hidden
    previous = np.concatenate([np.zeros((1, 64), np.float32), hidden])  # [9, H]
    cache = KVCache.empty(model.cfg.num_kv_heads, model.cfg.head_dim)
    out = mtp_block(model.weights.token_embd[ids + [42]], previous, model.weights.nextn[0], model.cfg, cache, 0)
    np.testing.assert_allclose(draft.logits[0], out[-1] @ model.weights.output.T, atol=1e-4)


def test_context_window_is_enforced():
    backend = ReferenceBackend(tiny_model("qwen35"), context_size=8)
    with pytest.raises(ContextOverflowError) as info:
        backend.prefill(tokens(9))
    assert info.value.num_tokens == 9 and info.value.context_size == 8
    backend.prefill(tokens(5))
    seq = TokenSequence.start(tokens(6), GREEDY)
    result = backend.cycle(seq, 4, GREEDY)  # room for the pending token and 2 drafts only
    assert result.num_drafted == 2 and backend.num_tokens <= 8
    while backend.num_tokens < 8:
        backend.cycle(seq, 4, GREEDY)
    with pytest.raises(ContextOverflowError):
        backend.cycle(seq, 0, GREEDY)


def test_bad_input_is_refused(backend):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        backend.prefill([1, 128])
    with pytest.raises(ValueError, match="no tokens"):
        backend.verify([])
    backend.verify([1, 2])
    with pytest.raises(ValueError, match="commit 3 of 2"):
        backend.accept(3)
    other = ReferenceBackend(backend.model)
    with pytest.raises(ValueError, match="not taken by this backend"):
        backend.rollback(other.checkpoint())
    with pytest.raises(ValueError, match="sequence expects"):
        backend.cycle(TokenSequence.start([1, 2, 3], GREEDY), 0, GREEDY)
