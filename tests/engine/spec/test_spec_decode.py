"""Speculative decoding end to end on tiny generated models: greedy output unchanged, sampled distribution kept."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from tests.engine.spec.chisq import chi_square_pvalue

from engine.backend import Backend, Draft, TokenSequence
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams, sampling_probs
from engine.spec import (DraftLengthController, FallbackDrafter, MtpDrafter, NgramDrafter, SpecStats,
                         SpeculativeDecoder)

SMALL = dict(tokenizer=False, hidden_size=64, ffn_size=128, num_heads=2, num_kv_heads=1, head_dim=32)


@pytest.fixture(scope="module")
def qwen35(tiny_model_path) -> ReferenceBackend:
    return ReferenceBackend.from_gguf(tiny_model_path("qwen35", **SMALL))


def fixed(d: int) -> DraftLengthController:
    """Always d drafts (no adaptation), so every cycle verifies 1 + d tokens."""
    return DraftLengthController(max_draft=d, min_draft=d)


def decode(backend: Backend, decoder: SpeculativeDecoder, prompt: list[int], params: SamplingParams,
           num_tokens: int, stats: SpecStats | None = None) -> list[int]:
    backend.reset()
    backend.prefill(prompt[:-1])
    seq = TokenSequence.start(prompt, params)
    decoder.start(seq)
    while len(seq.generated) < num_tokens:
        result = decoder.step(seq, params, num_tokens - len(seq.generated))
        if stats is not None:
            stats.add(result)
    return seq.generated


def prompts(count: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(count):
        body = [int(t) for t in rng.integers(0, vocab, size=6 + i % 5)]
        out.append(body * 2 if i % 2 else body)  # repeats give the n-gram drafter something to find
    return out


@pytest.mark.parametrize("drafter", ["mtp", "ngram", "ngram+mtp"])
def test_greedy_speculation_changes_nothing(qwen35: ReferenceBackend, drafter: str) -> None:
    params = SamplingParams(temperature=0)
    plain = SpeculativeDecoder(qwen35)
    sources = {"mtp": MtpDrafter(qwen35), "ngram": NgramDrafter(min_ngram=1),
               "ngram+mtp": FallbackDrafter(NgramDrafter(), MtpDrafter(qwen35))}
    spec = SpeculativeDecoder(qwen35, sources[drafter], fixed(3))
    stats = SpecStats()
    for prompt in prompts(20, qwen35.vocab_size):
        expected = decode(qwen35, plain, prompt, params, 24)
        assert decode(qwen35, spec, prompt, params, 24, stats) == expected
    # both branches ran: drafts kept and drafts rejected
    assert 0 < stats.num_accepted < stats.num_drafted
    assert stats.num_cycles < 20 * 24


class FixedDrafter:
    """Proposes the same tokens every cycle: deterministic drafts, like n-gram lookup."""

    def __init__(self, tokens: Sequence[int]):
        self.tokens = list(tokens)

    def start(self, tokens: Sequence[int]) -> None:
        """Nothing to index."""

    def propose(self, tokens: Sequence[int], num_draft: int) -> Draft:
        """The fixed tokens, cut to num_draft."""
        return Draft(self.tokens[:num_draft])


def two_token_distribution(backend: Backend, prompt: list[int], params: SamplingParams) -> dict[tuple, float]:
    """Exact probabilities of the first two generated tokens under plain sampling with params."""
    backend.reset()
    logits = backend.prefill(prompt)
    first = sampling_probs(logits, params, prompt=prompt)
    out = {}
    checkpoint = backend.checkpoint()
    for t1 in np.flatnonzero(first):
        backend.rollback(checkpoint)
        second = sampling_probs(backend.prefill([int(t1)]), params, history=[int(t1)], prompt=prompt)
        for t2 in np.flatnonzero(second):
            out[(int(t1), int(t2))] = float(first[t1] * second[t2])
    return out


@pytest.mark.parametrize("source", ["mtp", "likely"])
def test_sampled_speculation_keeps_the_distribution(qwen35: ReferenceBackend, source: str) -> None:
    # top_k keeps the outcomes few; the presence penalty makes the second token depend on the first
    knobs = dict(temperature=2.0, top_k=3, presence_penalty=0.5)
    params = SamplingParams(**knobs)
    prompt = [1, 2, 3, 4, 5]
    expected = two_token_distribution(qwen35, prompt, params)
    if source == "mtp":
        spec = SpeculativeDecoder(qwen35, MtpDrafter(qwen35), fixed(2))
    else:  # the two likeliest tokens: most draws keep a draft, the rest resample from the residual
        likely = max(expected, key=expected.get)
        spec = SpeculativeDecoder(qwen35, FixedDrafter(likely), fixed(2))
    qwen35.reset()
    qwen35.prefill(prompt[:-1])
    after_prompt = qwen35.checkpoint()
    cells = sorted(expected)
    counts, stats = np.zeros(len(cells), dtype=np.int64), SpecStats()
    for seed in range(1000):
        qwen35.rollback(after_prompt)
        seq = TokenSequence.start(prompt, SamplingParams(**knobs, seed=seed))
        spec.start(seq)
        while len(seq.generated) < 2:
            stats.add(spec.step(seq, params, 8))
        counts[cells.index(tuple(seq.generated[:2]))] += 1
    assert chi_square_pvalue(counts, np.array([expected[c] for c in cells])) > 1e-3
    assert stats.num_drafted == 2 * stats.num_cycles
    if source == "likely":  # random MTP heads rarely hit the top 3; the likely drafts exercise keeping too
        assert 0 < stats.num_accepted < stats.num_drafted
