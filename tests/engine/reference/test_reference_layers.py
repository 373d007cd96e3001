"""Token mixers against naive per-token, per-head float64 loops written from llama.cpp's graphs.

These pin the layouts a kernel must reproduce: Q and gate interleaved per head in qwen35's attn_q, partial NEOX rope
on the first rope_dim dims, KV head h // group for attention, key head h % Hk for DeltaNet value head h.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.reference.conftest import random_arrays, tiny_config
from engine.reference.qwen35 import deltanet_block, empty_deltanet_state
from engine.reference.state import KVCache
from engine.reference.transformer import attention_block
from engine.reference.weights import weights_from_arrays


def layer_weights(arch: str, layer: int):
    cfg = tiny_config(arch)
    return cfg, weights_from_arrays(random_arrays(cfg, seed=5), cfg.num_layers).layers[layer]


def rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + eps) * w


def rope_neox(x: np.ndarray, pos: int, rope_dim: int, theta: float) -> np.ndarray:
    half = rope_dim // 2
    z = (x[:half] + 1j * x[half:rope_dim]) * np.exp(1j * pos * theta ** (-np.arange(half) * 2.0 / rope_dim))
    return np.concatenate([z.real, z.imag, x[rope_dim:]])


def naive_attention_layer(x: np.ndarray, w: dict, cfg) -> np.ndarray:
    """One token at a time, one head at a time."""
    d, hq, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    w = {k: v.astype(np.float64) for k, v in w.items()}
    keys, values, out = [], [], []
    for pos, xt in enumerate(x.astype(np.float64)):
        q_full = w["attn_q"] @ xt + w.get("attn_q.bias", 0)
        k_full, v_full = w["attn_k"] @ xt + w.get("attn_k.bias", 0), w["attn_v"] @ xt + w.get("attn_v.bias", 0)
        stride = 2 * d if cfg.has_attn_gate else d
        heads = []
        for h in range(hq):
            qh = q_full[h * stride : h * stride + d]
            qh = rms(qh, w["attn_q_norm"], cfg.rms_eps) if cfg.has_qk_norm else qh
            heads.append(rope_neox(qh, pos, cfg.rope_dim, cfg.rope_theta))
        kt = [k_full[j * d : (j + 1) * d] for j in range(hkv)]
        kt = [rms(k, w["attn_k_norm"], cfg.rms_eps) if cfg.has_qk_norm else k for k in kt]
        keys.append([rope_neox(k, pos, cfg.rope_dim, cfg.rope_theta) for k in kt])
        values.append([v_full[j * d : (j + 1) * d] for j in range(hkv)])
        mixed = []
        for h, qh in enumerate(heads):
            kv = h // (hq // hkv)
            scores = np.array([qh @ keys[p][kv] for p in range(pos + 1)]) / np.sqrt(d)
            p = np.exp(scores - scores.max())
            o = sum(pi * values[j][kv] for j, pi in enumerate(p / p.sum()))
            if cfg.has_attn_gate:
                o = o / (1 + np.exp(-q_full[h * stride + d : (h + 1) * stride]))
            mixed.append(o)
        out.append(w["attn_output"] @ np.concatenate(mixed))
    return np.array(out)


@pytest.mark.parametrize("arch,layer", [("qwen35", 3), ("qwen3", 0), ("qwen2", 1)])
def test_attention_block_matches_naive(arch, layer):
    cfg, w = layer_weights(arch, layer)
    x = np.random.default_rng(2).standard_normal((6, cfg.hidden_size)).astype(np.float32)
    cache = KVCache.empty(cfg.num_kv_heads, cfg.head_dim, capacity=2)
    out = attention_block(x[:4], w, cfg, cache, 0)
    cache.length = 4
    out = np.concatenate([out, attention_block(x[4:], w, cfg, cache, 4)])  # continuing from the cache
    np.testing.assert_allclose(out, naive_attention_layer(x, w, cfg), rtol=1e-4, atol=1e-4)


def naive_deltanet(x: np.ndarray, w: dict, cfg) -> np.ndarray:
    """One token at a time, one value head at a time, explicit conv window and state matrices."""
    hk, hv, dk = cfg.ssm_num_k_heads, cfg.ssm_num_v_heads, cfg.ssm_head_dim
    dv, kernel = cfg.ssm_inner_size // hv, cfg.ssm_conv_kernel
    w = {k: v.astype(np.float64) for k, v in w.items()}
    history = [np.zeros(w["attn_qkv"].shape[0])] * (kernel - 1)
    states = np.zeros((hv, dk, dv))
    out = []
    for xt in x.astype(np.float64):
        history.append(w["attn_qkv"] @ xt)
        window = np.array(history[-kernel:])  # [K, C], oldest first
        conv = np.einsum("kc,ck->c", window, w["ssm_conv1d"])
        conv = conv / (1 + np.exp(-conv))
        z = w["attn_gate"] @ xt
        beta = 1 / (1 + np.exp(-(w["ssm_beta"] @ xt)))
        g = w["ssm_a"] * np.log1p(np.exp(w["ssm_alpha"] @ xt + w["ssm_dt.bias"]))
        heads = []
        for h in range(hv):
            j = h % hk  # value head h reads key head h % Hk
            q = conv[j * dk : (j + 1) * dk]
            k = conv[hk * dk + j * dk : hk * dk + (j + 1) * dk]
            v = conv[2 * hk * dk + h * dv : 2 * hk * dk + (h + 1) * dv]
            q = q / np.sqrt(q @ q + cfg.rms_eps) / np.sqrt(dk)
            k = k / np.sqrt(k @ k + cfg.rms_eps)
            s = np.exp(g[h]) * states[h]
            s = s + beta[h] * np.outer(k, v - s.T @ k)
            states[h] = s
            o = s.T @ q
            zh = z[h * dv : (h + 1) * dv]
            heads.append(rms(o, w["ssm_norm"], cfg.rms_eps) * zh / (1 + np.exp(-zh)))
        out.append(w["ssm_out"] @ np.concatenate(heads))
    return np.array(out)


@pytest.mark.parametrize("keep_steps", [False, True])
def test_deltanet_block_matches_naive(keep_steps):
    cfg, w = layer_weights("qwen35", 1)
    x = np.random.default_rng(4).standard_normal((7, cfg.hidden_size)).astype(np.float32)
    state = empty_deltanet_state(cfg)
    first, steps = deltanet_block(x[:5], w, cfg, state, keep_steps)
    state.conv, state.ssm = steps.conv_after(5), steps.ssm_after(5)
    rest, _ = deltanet_block(x[5:], w, cfg, state, keep_steps)  # continuing from the conv and recurrent state
    np.testing.assert_allclose(np.concatenate([first, rest]), naive_deltanet(x, w, cfg), rtol=1e-4, atol=1e-4)
