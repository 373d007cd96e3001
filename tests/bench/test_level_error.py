"""The int8 checks' tolerance (bench/gpu_ops.py level_error) against the two int8 levels emulated here
in numpy (kernels/act8.cuh Act8Levels): the predicted error of a product must match what the levels do, for
gaussian rows and for the gated norm's heavier tails, so the GPU check neither passes a lost level nor fails an
exact kernel."""

from __future__ import annotations

import numpy as np
import pytest

from bench.gpu_ops import level_error


def _two_levels(values: np.ndarray) -> np.ndarray:
    """What the int8 mma sees of each 256-value superblock: q_hi s + q_lo s_lo (Act8Levels.quantize)."""
    blocks = values.reshape(-1, 256).astype(np.float32)
    mx = np.abs(blocks).max(axis=1, keepdims=True)
    s = mx / np.float32(127)
    s_lo = s / np.float32(254)
    qh = np.clip(np.rint(blocks * (np.float32(127) / mx)), -127, 127)
    ql = np.clip(np.rint((blocks - qh * s) * (np.float32(254) / s)), -127, 127)
    return (qh * s + ql * s_lo).reshape(-1).astype(np.float64)


def _gated(rng: np.random.Generator, cols: int) -> np.ndarray:
    x, z = rng.standard_normal(cols), rng.standard_normal(cols)
    heads = x.reshape(-1, 128)
    normed = (heads / np.sqrt(np.mean(heads * heads, axis=1, keepdims=True) + 1e-6)).reshape(-1)
    return normed * np.tile(1.0 + 0.2 * rng.standard_normal(128), cols // 128) * z / (1.0 + np.exp(-z))


@pytest.mark.parametrize("kind", ["gaussian", "gated"])
def test_the_predicted_error_is_what_the_two_levels_do(kind: str) -> None:
    rng = np.random.default_rng(11)
    values = rng.standard_normal(6144) if kind == "gaussian" else _gated(rng, 6144)
    weights = rng.standard_normal((512, values.size))
    exact = weights @ values
    measured = np.linalg.norm(weights @ _two_levels(values) - exact) / np.linalg.norm(exact)
    assert 0.5 < measured / level_error(values) < 2.0


def test_the_margin_still_fails_a_lost_low_level() -> None:
    rng = np.random.default_rng(12)
    values = _gated(rng, 6144)
    blocks = values.reshape(-1, 256)
    s = np.abs(blocks).max(axis=1, keepdims=True) / 127.0
    hi_only = (np.clip(np.rint(blocks / s), -127, 127) * s).reshape(-1)
    weights = rng.standard_normal((256, values.size))
    exact = weights @ values
    lost = np.linalg.norm(weights @ hi_only - exact) / np.linalg.norm(exact)
    from bench.gpu_ops import LEVEL_ERROR_MARGIN

    assert lost > 20 * LEVEL_ERROR_MARGIN * level_error(values)
