"""Each reference op against an independent formulation (float64 loops, complex numbers, the other DeltaNet form)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from engine.reference import ops


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def test_matmul_and_swiglu(rng):
    x, w = rand(rng, 3, 8), rand(rng, 5, 8)
    expected = np.array([[sum(float(x[t, i]) * float(w[o, i]) for i in range(8)) for o in range(5)] for t in range(3)])
    np.testing.assert_allclose(ops.matmul(x, w), expected, rtol=1e-5, atol=1e-5)
    gate, up = rand(rng, 4, 6), rand(rng, 4, 6)
    g64 = gate.astype(np.float64)
    np.testing.assert_allclose(ops.swiglu(gate, up), g64 / (1 + np.exp(-g64)) * up, rtol=1e-5, atol=1e-6)


def test_softplus_and_sigmoid_extremes():
    x = np.array([-200.0, -30.0, 0.0, 1.5, 30.0, 200.0], dtype=np.float32)
    expected = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20).astype(np.float64))))
    np.testing.assert_allclose(ops.softplus(x), expected, rtol=1e-6, atol=1e-30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow RuntimeWarning for large |x|
        s = ops.sigmoid(x)
    assert s[0] == 0.0 and s[-1] == 1.0 and s[2] == 0.5


def test_rms_norm_against_float64(rng):
    x, w = rand(rng, 5, 3, 16, scale=3.0), rand(rng, 16)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-6), expected, rtol=1e-5, atol=1e-6)
    # eps matters for tiny inputs: a zero row stays finite
    assert np.all(ops.rms_norm(np.zeros((1, 16), np.float32), w, 1e-6) == 0)


def test_l2_norm_and_gated_rms_norm(rng):
    x, z, w = rand(rng, 4, 2, 32), rand(rng, 4, 2, 32), rand(rng, 32)
    y = ops.l2_norm(x, 1e-6)
    np.testing.assert_allclose(np.linalg.norm(y.astype(np.float64), axis=-1), 1.0, rtol=1e-5)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, x64 / np.sqrt((x64**2).sum(-1, keepdims=True) + 1e-6), rtol=1e-5, atol=1e-7)
    normed = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * w
    z64 = z.astype(np.float64)
    expected = normed * z64 / (1 + np.exp(-z64))
    np.testing.assert_allclose(ops.gated_rms_norm(x, z, w, 1e-6), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rope_dim", [16, 8])
def test_rope_is_complex_rotation(rng, neox, rope_dim):
    x, pos, theta = rand(rng, 6, 3, 16), np.array([0, 1, 7, 100, 4095, 65535]), 10000.0
    y = ops.rope(x, pos, rope_dim, theta, neox)
    half = rope_dim // 2
    if neox:
        zx, zy = x[..., :half] + 1j * x[..., half:rope_dim], y[..., :half] + 1j * y[..., half:rope_dim]
    else:
        zx, zy = x[..., 0:rope_dim:2] + 1j * x[..., 1:rope_dim:2], y[..., 0:rope_dim:2] + 1j * y[..., 1:rope_dim:2]
    freq = theta ** (-np.arange(half) * 2.0 / rope_dim)
    expected = zx * np.exp(1j * pos[:, None, None] * freq)
    np.testing.assert_allclose(zy, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(y[..., rope_dim:], x[..., rope_dim:])  # partial rotary: the tail passes through


def test_rope_scores_depend_on_relative_position(rng):
    q, k = rand(rng, 1, 1, 32), rand(rng, 1, 1, 32)

    def score(pq: int, pk: int) -> float:
        rq = ops.rope(q, np.array([pq]), 32, 1e6, True)
        rk = ops.rope(k, np.array([pk]), 32, 1e6, True)
        return float(np.sum(rq * rk))

    assert score(10, 3) == pytest.approx(score(1007, 1000), rel=1e-4, abs=1e-4)
    assert score(10, 3) != pytest.approx(score(10, 9), rel=1e-3)


def naive_attention(q, k, v, q_positions, scale):
    num_tokens, num_q_heads, _ = q.shape
    group = num_q_heads // k.shape[1]
    out = np.zeros(q.shape)
    for t in range(num_tokens):
        for h in range(num_q_heads):
            kv = h // group
            keys = range(q_positions[t] + 1)
            s = np.array([np.dot(q[t, h].astype(np.float64), k[j, kv]) * scale for j in keys])
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h] = sum(p[j] * v[j, kv] for j in keys)
    return out


def test_attention_matches_naive_loop(rng):
    num_keys, q, k, v = 9, rand(rng, 4, 6, 8), rand(rng, 9, 2, 8), rand(rng, 9, 2, 8)
    positions = np.array([5, 6, 7, 8])  # a verify pass after 5 cached tokens
    out = ops.attention(q, k, v, positions, 0.35)
    np.testing.assert_allclose(out, naive_attention(q, k, v, positions, 0.35), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.attention(q, k, v, positions, 0.35, block=3), out, rtol=1e-6, atol=1e-7)
    # a query never sees a later key: changing key 8 leaves the first three queries untouched
    k2 = k.copy()
    k2[num_keys - 1] += 5
    np.testing.assert_array_equal(ops.attention(q, k2, v, positions, 0.35)[:3], out[:3])


def test_causal_conv1d_matches_convolution_and_streams(rng):
    x, state, w = rand(rng, 7, 5), rand(rng, 3, 5), rand(rng, 5, 4)
    y, new_state = ops.causal_conv1d(x, state, w)
    full = np.concatenate([state, x]).astype(np.float64)
    for c in range(5):
        # np.convolve flips the kernel; the model's conv is a correlation, so flip it back
        expected = np.convolve(full[:, c], w[c, ::-1], mode="valid")
        np.testing.assert_allclose(y[:, c], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(new_state, x[-3:])
    y1, s1 = ops.causal_conv1d(x[:4], state, w)
    y2, s2 = ops.causal_conv1d(x[4:], s1, w)
    np.testing.assert_allclose(np.concatenate([y1, y2]), y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(s2, new_state)
    with pytest.raises(ValueError, match="conv state shape"):
        ops.causal_conv1d(x, state[:2], w)


def delta_inputs(rng, num_tokens, num_k_heads=2, num_v_heads=6, dk=8, dv=8):
    q = ops.l2_norm(rand(rng, num_tokens, num_k_heads, dk), 1e-6) / np.sqrt(dk)
    k = ops.l2_norm(rand(rng, num_tokens, num_k_heads, dk), 1e-6)
    v = rand(rng, num_tokens, num_v_heads, dv)
    g = -ops.softplus(rand(rng, num_tokens, num_v_heads)) * 0.5
    beta = ops.sigmoid(rand(rng, num_tokens, num_v_heads))
    state = rand(rng, num_v_heads, dk, dv, scale=0.3)
    return q, k, v, g, beta, state


def naive_delta_rule(q, k, v, g, beta, state):
    """Per head, per token, float64, with explicit matrices: S <- exp(g) (I - b k k^T) S + b k v^T."""
    num_tokens, num_v_heads, _ = v.shape
    s = state.astype(np.float64).copy()
    out = np.zeros(v.shape)
    for h in range(num_v_heads):
        kh = h % q.shape[1]  # value head h reads key head h % Hk
        for t in range(num_tokens):
            kt = k[t, kh].astype(np.float64)
            decayed = np.exp(g[t, h]) * s[h]
            s[h] = (np.eye(len(kt)) - beta[t, h] * np.outer(kt, kt)) @ decayed + beta[t, h] * np.outer(kt, v[t, h])
            out[t, h] = s[h].T @ q[t, kh]
    return out, s


def test_gated_delta_rule_recurrent_matches_naive(rng):
    args = delta_inputs(rng, 5)
    out, state = ops.gated_delta_rule(*args)
    ref_out, ref_state = naive_delta_rule(*args)
    np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, ref_state, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_tokens,chunk_size", [(1, 4), (11, 4), (16, 8), (37, 64)])
def test_gated_delta_rule_chunked_matches_recurrent(rng, num_tokens, chunk_size):
    args = delta_inputs(rng, num_tokens)
    out, state = ops.gated_delta_rule(*args)
    c_out, c_state = ops.gated_delta_rule_chunked(*args, chunk_size=chunk_size)
    np.testing.assert_allclose(c_out, out, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(c_state, state, rtol=1e-4, atol=2e-5)


def test_gated_delta_rule_strong_decay_stays_finite(rng):
    q, k, v, g, beta, state = delta_inputs(rng, 24)
    g = np.full_like(g, -60.0)  # exp(-60 * 24) underflows: the chunked form must not produce inf * 0
    c_out, c_state = ops.gated_delta_rule_chunked(q, k, v, g, beta, state, chunk_size=8)
    out, r_state = ops.gated_delta_rule(q, k, v, g, beta, state)
    assert np.all(np.isfinite(c_out)) and np.all(np.isfinite(c_state))
    np.testing.assert_allclose(c_out, out, rtol=1e-4, atol=1e-5)
