"""qwen35 (Qwen3.5 / Qwen3.8 hybrid): the Gated DeltaNet layer and the MTP (nextn) head, in llama.cpp's math on
GGUF-stored weights. Its gated full-attention layers are transformer.attention_layer with has_attn_gate.

DeltaNet layer, per token t (heads: Hk key heads of size Dk, Hv value heads of size Dv, value head h reads key
head h % Hk):
  qkv = attn_qkv x -> causal conv1d (kernel K, state of the previous K-1 qkv rows) -> SiLU -> split q | k | v
  q = l2norm(q) / sqrt(Dk), k = l2norm(k)       (l2norm eps = rms_eps, as llama.cpp)
  g = ssm_a * softplus(ssm_alpha x + ssm_dt.bias)  (ssm_a is stored as -exp(A_log))
  beta = sigmoid(ssm_beta x)
  o = gated delta rule(q, k, v, g, beta; S)      (ops.gated_delta_rule)
  y = ssm_out( RMSNorm_per_head(o) * ssm_norm * silu(attn_gate x) )
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.reference import ops
from engine.reference.state import DeltaNetState, DeltaNetSteps, KVCache
from engine.reference.transformer import Weights, attention_layer, residual_ffn

if TYPE_CHECKING:
    from engine.model.config import ModelConfig


def value_head_dim(cfg: ModelConfig) -> int:
    """Dv: the inner size split over the value heads."""
    return cfg.ssm_inner_size // cfg.ssm_num_v_heads


def conv_channels(cfg: ModelConfig) -> int:
    """Channels of the causal conv: q and k (Hk * Dk each) and v (Hv * Dv)."""
    return 2 * cfg.ssm_num_k_heads * cfg.ssm_head_dim + cfg.ssm_inner_size


def empty_deltanet_state(cfg: ModelConfig) -> DeltaNetState:
    """The zero state of one DeltaNet layer."""
    return DeltaNetState.empty(
        cfg.ssm_conv_kernel, conv_channels(cfg), cfg.ssm_num_v_heads, cfg.ssm_head_dim, value_head_dim(cfg)
    )


def _run_delta_rule(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray,
    keep_steps: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Recurrent form keeping every step (verify), or the chunked form keeping the final state (prefill)."""
    # -> o: [T, Hv, Dv], states: [T, Hv, Dk, Dv] or [1, Hv, Dk, Dv]
    num_tokens = v.shape[0]
    if not keep_steps:
        rule = ops.gated_delta_rule if num_tokens == 1 else ops.gated_delta_rule_chunked
        out, final = rule(q, k, v, g, beta, state)
        return out, final[None]
    out = np.empty(v.shape, np.float32)
    states = np.empty((num_tokens, *state.shape), np.float32)
    for t in range(num_tokens):
        step = slice(t, t + 1)
        out[step], state = ops.gated_delta_rule(q[step], k[step], v[step], g[step], beta[step], state)
        states[t] = state
    return out, states


def deltanet_block(
    x: np.ndarray, w: Weights, cfg: ModelConfig, state: DeltaNetState, keep_steps: bool
) -> tuple[np.ndarray, DeltaNetSteps]:
    """The DeltaNet token mixer over T tokens from `state` (not modified); returns the output and the new states."""
    # x: [T, H] (already attn_norm-ed) -> [T, H]
    num_tokens = x.shape[0]
    num_k, num_v, dk, dv = cfg.ssm_num_k_heads, cfg.ssm_num_v_heads, cfg.ssm_head_dim, value_head_dim(cfg)
    qkv = ops.matmul(x, w["attn_qkv"])  # [T, C]
    z = ops.matmul(x, w["attn_gate"]).reshape(num_tokens, num_v, dv)
    beta = ops.sigmoid(ops.matmul(x, w["ssm_beta"]))  # [T, Hv]
    g = w["ssm_a"] * ops.softplus(ops.matmul(x, w["ssm_alpha"]) + w["ssm_dt.bias"])  # [T, Hv], <= 0
    conv, _ = ops.causal_conv1d(qkv, state.conv, w["ssm_conv1d"])
    conv = ops.silu(conv)
    key_dim = num_k * dk
    q = ops.l2_norm(conv[:, :key_dim].reshape(num_tokens, num_k, dk), cfg.rms_eps) / np.float32(np.sqrt(dk))
    k = ops.l2_norm(conv[:, key_dim : 2 * key_dim].reshape(num_tokens, num_k, dk), cfg.rms_eps)
    v = conv[:, 2 * key_dim :].reshape(num_tokens, num_v, dv)
    o, states = _run_delta_rule(q, k, v, g, beta, state.ssm, keep_steps)
    o = ops.gated_rms_norm(o, z, w["ssm_norm"], cfg.rms_eps)
    out = ops.matmul(o.reshape(num_tokens, num_v * dv), w["ssm_out"])
    window = np.concatenate([state.conv, qkv], axis=0)  # [K-1+T, C]
    if not keep_steps:
        window = window[num_tokens:]  # a prefill commits all its tokens: keep only the final conv state
    return out, DeltaNetSteps(window, states, num_tokens, keep_steps)


def deltanet_layer(
    x: np.ndarray, w: Weights, cfg: ModelConfig, state: DeltaNetState, keep_steps: bool
) -> tuple[np.ndarray, DeltaNetSteps]:
    """A full pre-norm decoder layer with the DeltaNet as the token mixer."""
    # x: [T, H] -> [T, H]
    mixed, steps = deltanet_block(ops.rms_norm(x, w["attn_norm"], cfg.rms_eps), w, cfg, state, keep_steps)
    return residual_ffn(x + mixed, w, cfg), steps


def mtp_block(
    embeddings: np.ndarray, hidden: np.ndarray, w: Weights, cfg: ModelConfig, cache: KVCache, start: int
) -> np.ndarray:
    """The MTP head at positions start..: token t's embedding with the hidden state that predicted it.

    Follows llama.cpp's graph_mtp: eh_proj([enorm(embedding) | hnorm(hidden)]) -> a gated-attention decoder block
    with its own KV cache -> shared_head_norm. `hidden` is the trunk's output-normed hidden of the previous
    position (or, when drafting further, this head's own output); the result feeds the shared output head and the
    next draft step.
    """
    # embeddings, hidden: [T, H] -> [T, H]
    e = ops.rms_norm(embeddings, w["nextn.enorm"], cfg.rms_eps)
    h = ops.rms_norm(hidden, w["nextn.hnorm"], cfg.rms_eps)
    x = ops.matmul(np.concatenate([e, h], axis=1), w["nextn.eh_proj"])
    x = attention_layer(x, w, cfg, cache, start)
    return ops.rms_norm(x, w["nextn.shared_head_norm"], cfg.rms_eps)
