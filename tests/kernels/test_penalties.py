"""The penalties on the device (kernels/penalties.cu through its numpy model, tests/kernels/penalties_model.py, and
engine/cuda/penalties.py's bookkeeping on a host-memory device): the penalised rows equal engine/sampling.py
apply_penalties bit for bit, row t with the drafts before it in its history, over a long prompt; the device's marks
follow a sequence that grows one cycle at a time with one small upload a cycle and are rebuilt for anything else.
The kernels' own arithmetic is checked on the GPU (bench/gpu_penalties.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import TokenSequence
from engine.cuda import penalties
from engine.sampling import SamplingParams, apply_penalties
from tests.bench.test_gpu_choose import _ChoosingDevice
from tests.kernels import penalties_model

# Values that float32 and binary fractions do not hold exactly (1.1, 0.1, 0.3) show any rounding step out of place.
CASES = (SamplingParams(repetition_penalty=1.3), SamplingParams(repetition_penalty=1.1),
         SamplingParams(repetition_penalty=0.7), SamplingParams(frequency_penalty=0.1, presence_penalty=0.3),
         SamplingParams(frequency_penalty=2.0), SamplingParams(presence_penalty=-1.7),
         SamplingParams(repetition_penalty=1.1, frequency_penalty=-0.3, presence_penalty=1.5))


def _inputs(vocab: int, prompt_len: int, seed: int = 0) -> tuple[np.ndarray, TokenSequence, np.ndarray]:
    """(logits [6, V] with large, tiny and negative values, a sequence of a long prompt and 2,000 generated tokens
    (some many times), drafts [6]: a token repeated inside the draft, one never seen before, the last slot -1)."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
    logits[:, :50] *= np.float32(1e-6)  # tiny magnitudes: a double rounding would show there
    prompt = rng.integers(0, vocab, prompt_len)
    generated = np.concatenate([rng.integers(0, 40, 1500), rng.integers(0, vocab, 500)])
    seq = TokenSequence([int(t) for t in (*prompt, *generated)], prompt_len)
    unseen = int(np.setdiff1d(np.arange(vocab), seq.tokens)[0])
    drafts = np.array([7, 7, unseen, int(prompt[0]), 7, -1], np.int32)
    return logits, seq, drafts


@pytest.mark.parametrize("params", CASES, ids=str)
def test_the_rows_are_apply_penalties_bit_for_bit(params):
    """248,320 tokens, a prompt of 100,000: each row as the host penalises it with its own history."""
    logits, seq, drafts = _inputs(248_320, 100_000)
    got = logits.copy()
    penalties_model.penalize_rows(got, penalties.host_marks(seq, 248_320), drafts, params.repetition_penalty,
                                  params.frequency_penalty, params.presence_penalty)
    for t in range(6):
        want = apply_penalties(logits[t], params, seq.generated + [int(x) for x in drafts[:t]], seq.prompt)
        assert np.array_equal(got[t].view(np.uint32), want.view(np.uint32)), (t, np.flatnonzero(got[t] != want))
    assert not np.array_equal(got[0], logits[0])


def test_drafts_count_in_the_rows_after_them_only():
    """A token only the drafts hold: untouched in the rows up to its first draft, then penalised once, twice."""
    logits = np.full((4, 16), 2.0, np.float32)
    marks = np.zeros(16, np.uint32)
    penalties_model.penalize_rows(logits, marks, np.array([5, 5, 9, -1]), 1.0, 0.5, 1.0)
    assert logits[:, 5].tolist() == [2.0, 0.5, 0.0, 0.0] and logits[:, 9].tolist() == [2.0, 2.0, 2.0, 0.5]
    assert (logits[:, [0, 15]] == 2.0).all()
    logits = np.full((2, 4), -2.0, np.float32)
    marks[:4] = [penalties.PROMPT_BIT, 0, 3, penalties.PROMPT_BIT | 2]
    penalties_model.penalize_rows(logits, marks[:4], np.array([1, -1]), 2.0, 0.0, 0.0)
    assert logits.tolist() == [[-4.0, -2.0, -4.0, -4.0], [-4.0, -4.0, -4.0, -4.0]]  # repetition: prompt or count


def _counts(vocab: int = 64) -> tuple[penalties.PenaltyCounts, _ChoosingDevice]:
    dev = _ChoosingDevice()
    return penalties.PenaltyCounts(dev, vocab), dev


def _marks(counts: penalties.PenaltyCounts) -> np.ndarray:
    return counts.dev.download(counts.marks, np.uint32, (counts.vocab,))


def test_a_growing_sequence_sends_only_its_new_tokens():
    counts, dev = _counts()
    seq = TokenSequence([1, 2, 3, 2], 3)
    counts.sync(seq)
    assert dev.uploads == [("penalties.marks", 4 * 64)] and counts.num_rebuilds == 1
    assert np.array_equal(_marks(counts), penalties.host_marks(seq, 64))
    assert _marks(counts)[[1, 2, 3, 4]].tolist() == [penalties.PROMPT_BIT, penalties.PROMPT_BIT | 1,
                                                      penalties.PROMPT_BIT, 0]
    dev.uploads.clear()
    for new in ([4, 4], [2], [5, 4, 1, 6]):  # cycles of 2, 1, 4 tokens; repeats inside one update too
        seq.tokens.extend(new)
        counts.sync(seq)
        assert dev.uploads == [("penalties.staging", 4 * len(new))] and dev.launched[-1] == "penalty_count"
        assert np.array_equal(_marks(counts), penalties.host_marks(seq, 64))
        dev.uploads.clear()
    launched = len(dev.launched)
    counts.sync(seq)  # nothing new: nothing sent
    assert dev.uploads == [] and len(dev.launched) == launched and counts.num_rebuilds == 1


@pytest.mark.parametrize("change", ["another sequence", "new list", "cut back", "cut and regrown", "too many new",
                                    "prompt moved"])
def test_anything_but_growth_rebuilds(change):
    counts, dev = _counts()
    seq = TokenSequence([1, 2, 3, 9, 8], 3)
    counts.sync(seq)
    if change == "another sequence":  # equal tokens, another request
        seq = TokenSequence(list(seq.tokens), 3)
    elif change == "new list":
        seq.tokens = seq.tokens + [7]
    elif change == "cut back":
        del seq.tokens[-1]
    elif change == "cut and regrown":  # as long as before, another last token
        seq.tokens[-1:] = [5]
    elif change == "too many new":
        seq.tokens.extend([4] * (penalties.STAGING_TOKENS + 1))
    else:
        seq.num_prompt_tokens = 4
    dev.uploads.clear()
    counts.sync(seq)
    assert dev.uploads == [("penalties.marks", 4 * 64)] and counts.num_rebuilds == 2
    assert np.array_equal(_marks(counts), penalties.host_marks(seq, 64))


def test_params_without_penalties_keep_the_rest():
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.05, seed=3, repetition_penalty=1.1,
                            frequency_penalty=0.2, presence_penalty=1.5)
    plain = penalties.without_penalties(params)
    assert penalties.has_penalties(params) and not penalties.has_penalties(plain)
    assert (plain.temperature, plain.top_k, plain.top_p, plain.min_p, plain.seed) == (0.7, 20, 0.8, 0.05, 3)
    assert not any(penalties.has_penalties(SamplingParams(**{name: value}))
                   for name, value in (("temperature", 0.0), ("top_k", 5), ("min_p", 0.1)))
    assert all(penalties.has_penalties(SamplingParams(**{name: value})) for name, value in
               (("repetition_penalty", 0.9), ("frequency_penalty", -0.1), ("presence_penalty", 0.1)))


def test_ids_outside_the_vocabulary_are_refused_before_anything_is_sent():
    counts, dev = _counts()
    with pytest.raises(ValueError, match="token id -1 of the sequence is outside the vocabulary of 64"):
        counts.sync(TokenSequence([1, -1, 2], 2))
    seq = TokenSequence([1, 2, 3], 2)
    counts.sync(seq)
    dev.uploads.clear()
    seq.tokens.append(64)
    with pytest.raises(ValueError, match="token id 64 "):
        counts.sync(seq)
    assert dev.uploads == [] and "penalty_count" not in dev.launched
