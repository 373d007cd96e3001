"""The whole-model check's rule for a greedy flip (bench/gpu_models.py near_tie): a flip inside the logit noise the
backend shows is a near-tie; a flip where the logits are otherwise clean is a fault."""

from __future__ import annotations

import numpy as np

from bench.gpu_models import TIE_GAP, near_tie


def _rows(gap: float, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A reference row whose top two (tokens 7, 3) lie `gap` apart, and a backend row with the two swapped and
    every other logit moved by up to `noise`."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(64).astype(np.float32)
    ref[7], ref[3] = 5.0, 5.0 - gap
    cuda = ref + rng.uniform(-noise, noise, 64).astype(np.float32)
    cuda[7], cuda[3] = 5.0 - gap, 5.0
    return ref, cuda


def test_a_flip_inside_the_noise_at_the_same_position_is_a_near_tie() -> None:
    """Token 0 of a run (nothing before): the other logits moved by up to 8e-3, the top two 1.1e-2 apart."""
    equal, gap, noise = near_tie(*_rows(1.1e-2, 8e-3), noise_before=0.0)
    assert equal and abs(gap - 1.1e-2) < 1e-6 and 4e-3 < noise <= 8e-3


def test_a_flip_with_clean_logits_around_it_is_a_fault() -> None:
    equal, _, noise = near_tie(*_rows(1.1e-2, 1e-5), noise_before=0.0)
    assert not equal and noise <= 1e-5
    assert not near_tie(*_rows(1.1e-2, 1e-5), noise_before=4e-3)[0]  # noise before: under half the gap


def test_the_noise_before_and_the_floor_still_count() -> None:
    assert near_tie(*_rows(1.1e-2, 1e-5), noise_before=6e-3)[0]
    assert near_tie(*_rows(0.5 * TIE_GAP, 0.0), noise_before=0.0)[0]
