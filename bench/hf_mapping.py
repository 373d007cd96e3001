"""GGUF -> Hugging Face transformers: the config and state dict of `Qwen3_5ForCausalLM` (GGUF arch qwen35) and
`Qwen3ForCausalLM` (qwen3) for the weights of a GGUF file, by inverting llama.cpp's converter (convert_hf_to_gguf.py).

numpy only: the comparison script (bench/compare_transformers.py) turns the arrays into torch tensors, and the tests
check the names and shapes without torch. What the converter does to a qwen35 checkpoint, and so what is undone here:
  - RMSNorm weights: HF's Qwen3_5RMSNorm computes x_hat * (1 + w); the converter stores 1 + w. Not the DeltaNet
    output norm (linear_attn.norm: a plain x_hat * w), and nothing for qwen3 (Qwen3RMSNorm is x_hat * w).
  - A_log is stored as ssm_a = -exp(A_log); dt_bias as ssm_dt.bias; conv1d [C, 1, K] squeezed to [C, K].
  - DeltaNet value heads: HF keeps them grouped by key head (value head j reads key head j // (Hv / Hk)); the
    converter reorders them tiled (position i * Hk + g holds HF head g * r + i, r = Hv / Hk) so that value head p reads
    key head p % Hk. Reordered: the v rows of in_proj_qkv, in_proj_z rows, in_proj_a / in_proj_b rows, A_log, dt_bias,
    the v channels of conv1d and the columns of out_proj.
  - q_proj (attn_q) is stored as it is: per head [Q (D) | gate (D)], which is how both sides unpack it.
The MTP block (blk.<num_layers>.nextn.*) has no counterpart in transformers' model (its loader drops `mtp.*`), so its
tensors are left out and listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.model.config import ATTENTION, ModelConfig

if TYPE_CHECKING:
    from engine.gguf.reader import GGUFFile

HF_CLASSES = {"qwen35": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}
COMMON_NAMES = {"ffn_gate": "mlp.gate_proj.weight", "ffn_up": "mlp.up_proj.weight", "ffn_down": "mlp.down_proj.weight"}
ATTENTION_NAMES = {"attn_q": "self_attn.q_proj.weight", "attn_k": "self_attn.k_proj.weight",
                   "attn_v": "self_attn.v_proj.weight", "attn_output": "self_attn.o_proj.weight",
                   "attn_q_norm": "self_attn.q_norm.weight", "attn_k_norm": "self_attn.k_norm.weight"}
# qwen35 RMSNorms whose HF module computes x_hat * (1 + w)
OFFSET_NORMS = ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm", "output_norm")


@dataclass(slots=True)
class MappingOptions:
    """Which converter conventions to undo; turning one off gives a deliberately wrong mapping (ablations)."""

    reorder_v_heads: bool = True
    norm_offset: bool = True


@dataclass(slots=True)
class HFWeights:
    """The transformers config (class name + keyword arguments), the state dict, and the GGUF tensors left out."""

    config_class: str
    model_class: str
    config: dict[str, Any]
    state_dict: dict[str, np.ndarray]
    skipped: list[str] = field(default_factory=list)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments of the transformers text config equivalent to cfg (qwen35 or qwen3)."""
    _check_arch(cfg)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    out: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_eps, max_position_embeddings=cfg.context_length,
        tie_word_embeddings=cfg.tied_embeddings, attention_bias=False, hidden_act="silu", rope_parameters=rope,
    )
    if cfg.arch == "qwen3":
        if cfg.rope_dim != cfg.head_dim:
            raise ValueError(f"qwen3 rotates whole heads; this file rotates {cfg.rope_dim} of {cfg.head_dim} dims")
        return out
    # Partial rotary: transformers rotates int(head_dim * factor) dims; M-RoPE sections count rotated pairs and, with
    # the equal positions of text, do not change the angles (they must still sum to rope_dim / 2).
    rope.update(partial_rotary_factor=cfg.rope_dim / cfg.head_dim, mrope_interleaved=True,
                mrope_section=[int(s) for s in cfg.rope_sections[:3]])
    if sum(rope["mrope_section"]) != cfg.rope_dim // 2:
        raise ValueError(f"M-RoPE sections {cfg.rope_sections} do not cover rope_dim {cfg.rope_dim} / 2")
    out.update(
        layer_types=["full_attention" if kind == ATTENTION else "linear_attention" for kind in cfg.layer_kinds],
        linear_conv_kernel_dim=cfg.ssm_conv_kernel, linear_key_head_dim=cfg.ssm_head_dim,
        linear_value_head_dim=cfg.ssm_v_head_dim, linear_num_key_heads=cfg.ssm_num_k_heads,
        linear_num_value_heads=cfg.ssm_num_v_heads,
    )
    return out


def _check_arch(cfg: ModelConfig) -> None:
    if cfg.arch not in HF_CLASSES:
        raise ValueError(f"architecture {cfg.arch!r} has no transformers mapping here (supported: "
                         f"{', '.join(HF_CLASSES)})")


def tiled_to_grouped(x: np.ndarray, axis: int, num_k_heads: int, num_v_heads: int, head_dim: int) -> np.ndarray:
    """Undo the converter's value-head reorder along axis: GGUF position i * Hk + g -> HF head g * r + i."""
    # x: [..., Hv * head_dim, ...] along axis
    axis = axis % x.ndim
    r = num_v_heads // num_k_heads
    shape = x.shape
    split = x.reshape(*shape[:axis], r, num_k_heads, head_dim, *shape[axis + 1:])
    return np.swapaxes(split, axis, axis + 1).reshape(shape)


def _deltanet_tensors(w: dict[str, np.ndarray], cfg: ModelConfig, opts: MappingOptions) -> dict[str, np.ndarray]:
    """One DeltaNet layer's GGUF tensors as HF linear_attn parameters."""
    num_k, num_v, dv = cfg.ssm_num_k_heads, cfg.ssm_num_v_heads, cfg.ssm_v_head_dim
    key_channels = 2 * cfg.ssm_key_dim  # q and k channels of the conv / in_proj_qkv come first, never reordered

    def heads(x: np.ndarray, axis: int, head_dim: int) -> np.ndarray:
        """x with its value heads along axis back in transformers' order (unless the ablation keeps them)."""
        return tiled_to_grouped(x, axis, num_k, num_v, head_dim) if opts.reorder_v_heads else x

    qkv, conv = w["attn_qkv"], w["ssm_conv1d"]  # qkv: [C, H]  conv: [C, K]
    if np.any(w["ssm_a"] >= 0):
        raise ValueError(f"ssm_a must be -exp(A_log) < 0, got {w['ssm_a']}")
    return {
        "in_proj_qkv.weight": np.concatenate([qkv[:key_channels], heads(qkv[key_channels:], 0, dv)]),
        "in_proj_z.weight": heads(w["attn_gate"], 0, dv),
        "in_proj_b.weight": heads(w["ssm_beta"], 0, 1),
        "in_proj_a.weight": heads(w["ssm_alpha"], 0, 1),
        "A_log": heads(np.log(-w["ssm_a"].astype(np.float64)).astype(np.float32), 0, 1),
        "dt_bias": heads(w["ssm_dt.bias"], 0, 1),
        "conv1d.weight": np.concatenate([conv[:key_channels], heads(conv[key_channels:], 0, dv)])[:, None, :],
        "norm.weight": w["ssm_norm"],
        "out_proj.weight": heads(w["ssm_out"], 1, dv),
    }


def _norm(value: np.ndarray, key: str, cfg: ModelConfig, opts: MappingOptions) -> np.ndarray:
    """A norm weight as the HF module wants it: minus the converter's + 1 where the module adds it back."""
    if cfg.arch == "qwen35" and key in OFFSET_NORMS and opts.norm_offset:
        return (value.astype(np.float64) - 1.0).astype(np.float32)
    return value


def _layer_tensors(i: int, w: dict[str, np.ndarray], cfg: ModelConfig, opts: MappingOptions) -> dict[str, np.ndarray]:
    """HF parameters of trunk layer i from its GGUF tensors (keys without "blk.i." and ".weight")."""
    prefix = f"model.layers.{i}."
    ffn_norm = "post_attention_norm" if cfg.arch == "qwen35" else "ffn_norm"
    out = {prefix + "input_layernorm.weight": _norm(w["attn_norm"], "attn_norm", cfg, opts),
           prefix + "post_attention_layernorm.weight": _norm(w[ffn_norm], ffn_norm, cfg, opts)}
    out.update({prefix + hf: w[key] for key, hf in COMMON_NAMES.items()})
    if cfg.layer_kinds[i] == ATTENTION:
        out.update({prefix + hf: _norm(w[key], key, cfg, opts) for key, hf in ATTENTION_NAMES.items()})
    else:
        out.update({prefix + "linear_attn." + name: value
                    for name, value in _deltanet_tensors(w, cfg, opts).items()})
    return out


def _split_layers(f: GGUFFile) -> tuple[dict[str, np.ndarray], dict[int, dict[str, np.ndarray]]]:
    """Every tensor of f dequantized to float32: (top-level by short name, per layer by short name)."""
    top: dict[str, np.ndarray] = {}
    layers: dict[int, dict[str, np.ndarray]] = {}
    for name in f.tensors:
        value = np.asarray(f.dequantize(name), dtype=np.float32)
        parts = name.removesuffix(".weight").split(".")
        if parts[0] == "blk":
            layers.setdefault(int(parts[1]), {})[".".join(parts[2:])] = value
        else:
            top[".".join(parts)] = value
    return top, layers


def hf_weights(f: GGUFFile, opts: MappingOptions | None = None) -> HFWeights:
    """The transformers config and state dict of a qwen35 / qwen3 GGUF file's dequantized weights."""
    opts = opts or MappingOptions()
    cfg = ModelConfig.from_gguf(f)
    config = hf_config(cfg)
    top, layers = _split_layers(f)
    state = {"model.embed_tokens.weight": top["token_embd"],
             "model.norm.weight": _norm(top["output_norm"], "output_norm", cfg, opts),
             "lm_head.weight": top["token_embd"] if cfg.tied_embeddings else top["output"]}
    for i in range(cfg.num_layers):
        mapped = _layer_tensors(i, layers[i], cfg, opts)
        if len(mapped) != len(layers[i]):  # the mapping is one to one: a GGUF tensor left over would go unchecked
            raise ValueError(f"{f.path}: layer {i} has tensors {sorted(layers[i])}, mapped {len(mapped)} of them")
        state.update(mapped)
    skipped = sorted(f"blk.{i}.{key}" for i in layers if i >= cfg.num_layers for key in layers[i])
    config_class, model_class = HF_CLASSES[cfg.arch]
    return HFWeights(config_class, model_class, config, state, skipped)
