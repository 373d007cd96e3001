"""Attention decoder layers: llama, qwen2 (q/k/v bias), qwen3 (per-head q/k RMSNorm), and the gated attention of
qwen35 (Q packed with a sigmoid output gate per head, partial rotary), in llama.cpp's math on GGUF-stored weights.

Weights come as a dict keyed by the GGUF name without "blk.N." and ".weight" ("attn_q", "attn_q.bias", ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.reference import ops
from engine.reference.state import KVCache

if TYPE_CHECKING:
    from engine.model.config import ModelConfig

Weights = dict[str, np.ndarray]


def _project(x: np.ndarray, w: Weights, name: str) -> np.ndarray:
    """x @ w[name].T plus w[name + ".bias"] where the file has one."""
    # x: [T, in] -> [T, out]
    y = ops.matmul(x, w[name])
    bias = w.get(f"{name}.bias")
    return y if bias is None else y + bias


def attention_qkv(
    x: np.ndarray, w: Weights, cfg: ModelConfig, start: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Q, K, V of T tokens at positions start.. after bias, q/k norm and rope; plus qwen35's output gate (or None)."""
    # x: [T, H] -> q: [T, Hq, D], k, v: [T, Hkv, D], gate: [T, Hq * D] | None
    num_tokens, head_dim = x.shape[0], cfg.head_dim
    q = _project(x, w, "attn_q")
    gate = None
    if cfg.has_attn_gate:
        # attn_q packs, per head, [Q (D) | gate (D)]
        packed = q.reshape(num_tokens, cfg.num_heads, 2 * head_dim)
        q, gate = packed[..., :head_dim], packed[..., head_dim:].reshape(num_tokens, -1)
    q = q.reshape(num_tokens, cfg.num_heads, head_dim)
    k = _project(x, w, "attn_k").reshape(num_tokens, cfg.num_kv_heads, head_dim)
    v = _project(x, w, "attn_v").reshape(num_tokens, cfg.num_kv_heads, head_dim)
    if cfg.has_qk_norm:
        q = ops.rms_norm(q, w["attn_q_norm"], cfg.rms_eps)
        k = ops.rms_norm(k, w["attn_k_norm"], cfg.rms_eps)
    positions = np.arange(start, start + num_tokens)
    q = ops.rope(q, positions, cfg.rope_dim, cfg.rope_theta, cfg.rope_neox)
    k = ops.rope(k, positions, cfg.rope_dim, cfg.rope_theta, cfg.rope_neox)
    return q, k, v, gate


def attention_block(x: np.ndarray, w: Weights, cfg: ModelConfig, cache: KVCache, start: int) -> np.ndarray:
    """Self-attention of T tokens at positions start..: writes their K/V to the cache, attends causally over it."""
    # x: [T, H] (already attn_norm-ed) -> [T, H]
    num_tokens = x.shape[0]
    q, k, v, gate = attention_qkv(x, w, cfg, start)
    cache.write(start, k, v)
    keys, values = cache.view(start + num_tokens)
    positions = np.arange(start, start + num_tokens)
    out = ops.attention(q, keys, values, positions, 1.0 / np.sqrt(cfg.head_dim)).reshape(num_tokens, -1)
    if gate is not None:
        out = out * ops.sigmoid(gate)
    return ops.matmul(out, w["attn_output"])


def ffn_block(x: np.ndarray, w: Weights) -> np.ndarray:
    """SwiGLU feed-forward: ffn_down(silu(ffn_gate x) * ffn_up x)."""
    # x: [T, H] -> [T, H]
    return ops.matmul(ops.swiglu(ops.matmul(x, w["ffn_gate"]), ops.matmul(x, w["ffn_up"])), w["ffn_down"])


def ffn_norm_name(cfg: ModelConfig) -> str:
    """The GGUF name of the norm in front of the FFN: qwen35 calls it post_attention_norm."""
    return "post_attention_norm" if cfg.arch == "qwen35" else "ffn_norm"


def residual_ffn(h: np.ndarray, w: Weights, cfg: ModelConfig) -> np.ndarray:
    """h + FFN(RMSNorm(h)): the second half of every decoder layer."""
    # h: [T, H] -> [T, H]
    return h + ffn_block(ops.rms_norm(h, w[ffn_norm_name(cfg)], cfg.rms_eps), w)


def attention_layer(x: np.ndarray, w: Weights, cfg: ModelConfig, cache: KVCache, start: int) -> np.ndarray:
    """A full pre-norm decoder layer with attention as the token mixer."""
    # x: [T, H] -> [T, H]
    h = x + attention_block(ops.rms_norm(x, w["attn_norm"], cfg.rms_eps), w, cfg, cache, start)
    return residual_ffn(h, w, cfg)
