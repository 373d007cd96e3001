"""The engine's operators in float32 numpy: the specification every CUDA kernel is checked against.

Conventions (those of llama.cpp on GGUF-stored weights):
- matrices are stored (out, in): y = x @ w.T;
- norm weights are used as stored (y = x_hat * w; any "1 + w" offset is already folded in by the converter);
- heads are contiguous slices of the projected vector: head h of a [T, nh * D] tensor is [:, h * D:(h + 1) * D];
- grouped heads differ by op: attention maps query head h to KV head h // (Hq // Hkv) (each KV head serves a run
  of adjacent query heads), while the gated delta rule maps value head h to key head h % Hk (key heads are tiled);
  GGUF files carry the value heads in the order that makes this tiling right.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = x @ w.T for a GGUF-layout weight; one matmul over all T tokens."""
    # x: [T, in]  w: [out, in]
    return np.matmul(x, w.T, dtype=F32)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    return x * sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), without overflow warnings for large |x|."""
    # exp of a large positive argument overflows to inf, which still gives the right limit 0; silence the warning.
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(F32)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), stable for large x."""
    return np.logaddexp(F32(0.0), x).astype(F32)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight."""
    # x: [..., H]  weight: [H]
    mean_sq = np.mean(np.square(x), axis=-1, keepdims=True, dtype=F32)
    return (x / np.sqrt(mean_sq + F32(eps))) * weight


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis (the DeltaNet q/k normalisation)."""
    # x: [..., D]
    sum_sq = np.sum(np.square(x), axis=-1, keepdims=True, dtype=F32)
    return (x / np.sqrt(sum_sq + F32(eps))).astype(F32)


def gated_rms_norm(x: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm of x (per head, last axis) times silu(z): the DeltaNet output norm."""
    # x, z: [..., D]  weight: [D]
    return rms_norm(x, weight, eps) * silu(z)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up: the FFN activation."""
    return silu(gate) * up


def rope_angles(positions: np.ndarray, rope_dim: int, theta: float) -> np.ndarray:
    """Rotation angles [T, rope_dim // 2]: position * theta^(-2i / rope_dim), computed in float64."""
    # positions: [T]. float64 keeps angles exact to ~1e-12 rad at 256K positions; the sin/cos are rounded to f32.
    inv_freq = float(theta) ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    return np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]


def rope(x: np.ndarray, positions: np.ndarray, rope_dim: int, theta: float, neox: bool) -> np.ndarray:
    """Rotary position embedding on the first rope_dim dims of every head; the rest pass through.

    neox=True rotates the pair (i, i + rope_dim/2) (qwen2, qwen3, qwen35: with equal M-RoPE positions for text,
    qwen35's interleaved M-RoPE is exactly this); neox=False rotates adjacent pairs (2i, 2i+1) (llama).
    """
    # x: [T, nh, D]  positions: [T]
    if rope_dim % 2 or rope_dim > x.shape[-1]:
        raise ValueError(f"rope_dim {rope_dim} must be even and at most the head size {x.shape[-1]}")
    angles = rope_angles(positions, rope_dim, theta)
    cos = np.cos(angles).astype(F32)[:, None, :]  # [T, 1, rope_dim/2]
    sin = np.sin(angles).astype(F32)[:, None, :]
    out = x.astype(F32, copy=True)
    if neox:
        half = rope_dim // 2
        x0, x1 = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:rope_dim] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = x0 * cos - x1 * sin
        out[..., 1:rope_dim:2] = x0 * sin + x1 * cos
    return out


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in float32 (rows of all -inf are not expected)."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(F32)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray, scale: float, block: int = 256
) -> np.ndarray:
    """Causal grouped-query attention: query at position p sees keys 0..p (key j sits at position j).

    Queries are processed `block` rows at a time so a long prefill never holds a [T, S] score matrix per head.
    """
    # q: [T, Hq, D]  k, v: [S, Hkv, D]  q_positions: [T] -> [T, Hq, D]
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    positions = np.asarray(q_positions)
    out = np.empty(q.shape, dtype=F32)
    for start in range(0, num_tokens, block):
        rows = slice(start, start + block)
        out[rows] = _attention_rows(q[rows], k, v, positions[rows], scale)
    return out


def _attention_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray, scale: float) -> np.ndarray:
    """attention() for one block of query rows."""
    # q: [T, Hq, D]  k, v: [S, Hkv, D]
    num_tokens, num_q_heads, head_dim = q.shape
    num_keys, num_kv_heads, _ = k.shape
    group = num_q_heads // num_kv_heads
    # query head h uses KV head h // group; keys beyond the last query's position are never visible
    num_keys = min(num_keys, int(q_positions.max()) + 1)
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim).transpose(1, 2, 0, 3)  # [Hkv, g, T, D]
    kh = k[:num_keys].transpose(1, 2, 0)  # [Hkv, D, S]
    vh = v[:num_keys].transpose(1, 0, 2)  # [Hkv, S, D]
    scores = np.matmul(qg, kh[:, None]) * F32(scale)  # [Hkv, g, T, S]
    masked = np.arange(num_keys)[None, :] > q_positions[:, None]  # [T, S]
    scores = np.where(masked, -np.inf, scores).astype(F32)
    out = np.matmul(softmax(scores), vh[:, None])  # [Hkv, g, T, D]
    return out.transpose(2, 0, 1, 3).reshape(num_tokens, num_q_heads, head_dim)


def causal_conv1d(x: np.ndarray, state: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal convolution over time with a rolling state of the previous K-1 inputs (no bias, no act)."""
    # x: [T, C]  state: [K-1, C]  weight: [C, K] -> y: [T, C], new_state: [K-1, C]
    kernel = weight.shape[1]
    if state.shape != (kernel - 1, x.shape[1]):
        raise ValueError(f"conv state shape {state.shape} does not match kernel {kernel} over {x.shape[1]} channels")
    window = np.concatenate([state, x], axis=0)  # [K-1+T, C]
    num_tokens = x.shape[0]
    y = np.zeros_like(x, dtype=F32)
    for j in range(kernel):
        y += window[j : j + num_tokens] * weight[:, j]
    return y, window[num_tokens:].copy()


def _key_heads_for_values(x: np.ndarray, num_v_heads: int) -> np.ndarray:
    """Tile key heads to value heads: value head h reads key head h % Hk (the GGUF/llama.cpp order)."""
    # x: [T, Hk, D] -> [T, Hv, D]
    return x[:, np.arange(num_v_heads) % x.shape[1]]


def gated_delta_rule(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Gated delta rule, recurrent form: one token at a time (the decode / verify path).

    Per value head, with S [Dk, Dv]: S *= exp(g_t); u = beta_t * (v_t - S^T k_t); S += k_t u^T; o_t = S^T q_t.
    q and k are already L2-normalised and q already scaled by 1/sqrt(Dk). llama.cpp keeps S transposed in memory
    ([Hv, Dv, Dk]); the math is the same.
    """
    # q, k: [T, Hk, Dk]  v: [T, Hv, Dv]  g, beta: [T, Hv]  state: [Hv, Dk, Dv] -> o: [T, Hv, Dv], state
    num_v_heads = v.shape[1]
    qv, kv = _key_heads_for_values(q, num_v_heads), _key_heads_for_values(k, num_v_heads)
    s = state.astype(F32, copy=True)
    out = np.empty(v.shape, dtype=F32)
    for t in range(v.shape[0]):
        s *= np.exp(g[t]).astype(F32)[:, None, None]
        predicted = np.einsum("hk,hkv->hv", kv[t], s)  # what the state already recalls for k_t
        update = (v[t] - predicted) * beta[t][:, None]
        s += kv[t][:, :, None] * update[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", qv[t], s)
    return out, s


def gated_delta_rule_chunked(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray,
    chunk_size: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """Gated delta rule, chunked form (the prefill path): same result as gated_delta_rule up to rounding.

    Within a chunk, with c_t = cumsum(g)_t and the writes u_t of the recurrent form:
      (I + A) U = beta * (V - exp(c) * (K S0)),  A[t, i] = beta_t exp(c_t - c_i) k_t.k_i  (i < t)
      o_t = exp(c_t) S0^T q_t + sum_{i<=t} exp(c_t - c_i) (q_t.k_i) u_i
      S_end = exp(c_end) S0 + sum_i exp(c_end - c_i) k_i u_i^T
    """
    # q, k: [T, Hk, Dk]  v: [T, Hv, Dv]  g, beta: [T, Hv]  state: [Hv, Dk, Dv]
    num_v_heads = v.shape[1]
    # per-head layout: [Hv, T, D]
    qh = _key_heads_for_values(q, num_v_heads).transpose(1, 0, 2)
    kh = _key_heads_for_values(k, num_v_heads).transpose(1, 0, 2)
    vh, gh, bh = v.transpose(1, 0, 2), g.T, beta.T
    s = state.astype(F32, copy=True)
    out = np.empty_like(vh, dtype=F32)
    for start in range(0, v.shape[0], chunk_size):
        part = slice(start, start + chunk_size)
        out[:, part], s = _delta_chunk(qh[:, part], kh[:, part], vh[:, part], gh[:, part], bh[:, part], s)
    return out.transpose(1, 0, 2), s


def _delta_chunk(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, s0: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One chunk of the chunked gated delta rule (see gated_delta_rule_chunked)."""
    # q, k: [H, C, Dk]  v: [H, C, Dv]  g, beta: [H, C]  s0: [H, Dk, Dv]
    size = v.shape[1]
    cum = np.cumsum(g, axis=1, dtype=F32)  # [H, C]
    lower = np.tril(np.ones((size, size), dtype=bool))  # i <= t
    diff = cum[:, :, None] - cum[:, None, :]  # [H, C(t), C(i)]: c_t - c_i, <= 0 on and below the diagonal
    decay = np.exp(np.where(lower, diff, -np.inf)).astype(F32)
    kk = np.matmul(k, k.transpose(0, 2, 1))  # [H, C, C]
    strict = decay * ~np.eye(size, dtype=bool)
    system = np.eye(size, dtype=F32) + beta[:, :, None] * kk * strict
    rhs = beta[:, :, None] * (v - np.exp(cum)[:, :, None] * np.matmul(k, s0))  # [H, C, Dv]
    u = np.linalg.solve(system, rhs).astype(F32)
    qk = np.matmul(q, k.transpose(0, 2, 1)) * decay  # [H, C, C]
    out = np.exp(cum)[:, :, None] * np.matmul(q, s0) + np.matmul(qk, u)
    tail = np.exp(cum[:, -1:] - cum).astype(F32)  # [H, C]: decay from each token to the chunk's end
    s_end = np.exp(cum[:, -1])[:, None, None] * s0 + np.matmul((k * tail[:, :, None]).transpose(0, 2, 1), u)
    return out.astype(F32), s_end.astype(F32)
