"""bench/gpu_bench27b.py verify_agreement: a verify pass of T tokens against the T one-token passes that chose them,
the 27B part's end-to-end check of the verify path. Here on the reference backend (where the two are the same
arithmetic) and on one whose multi-token pass is wrong."""

from __future__ import annotations

import numpy as np

from bench.gpu_bench27b import verify_agreement
from engine.reference.backend import ReferenceBackend

PROMPT = [11, 201, 35, 90, 400, 17, 3, 250]


def test_the_reference_backends_verify_pass_agrees_with_its_one_token_passes(tiny_model_path) -> None:
    backend = ReferenceBackend.from_gguf(tiny_model_path("qwen35", tokenizer=False, vocab_size=512), context_size=256)
    agree = verify_agreement(backend, PROMPT, counts=(2, 5, 8))
    assert sorted(agree) == [2, 5, 8]
    for t, (error, flips) in agree.items():
        assert error < 1e-5 and flips == 0, (t, error, flips)  # float32 sums in another order: ~1e-6
    # left reset: the next prefill starts from an empty context
    first = backend.prefill(PROMPT)
    backend.reset()
    assert np.array_equal(first, backend.prefill(PROMPT))


class _ShiftedVerify:
    """A backend whose passes of several tokens return each row one position late (the first row repeated): the
    kind of fault a verify kernel's token indexing would make."""

    def __init__(self, inner: ReferenceBackend) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def verify(self, tokens: list[int]) -> np.ndarray:
        rows = np.asarray(self.inner.verify(tokens))
        return rows if len(tokens) == 1 else np.concatenate([rows[:1], rows[:-1]])


def test_a_verify_pass_that_returns_its_rows_out_of_place_is_caught(tiny_model_path) -> None:
    inner = ReferenceBackend.from_gguf(tiny_model_path("qwen35", tokenizer=False, vocab_size=512), context_size=256)
    agree = verify_agreement(_ShiftedVerify(inner), PROMPT, counts=(2, 5))
    assert all(error > 1e-2 for error, _ in agree.values()), agree
    assert agree[5][1] > 0  # and some argmaxes differ
