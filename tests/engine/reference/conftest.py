"""Tiny random models of every architecture, built in memory from the GGUF tensor table (no file needed)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import Draft, TokenSequence
from engine.model.config import ATTENTION, DELTANET, ModelConfig
from engine.model.weights import expected_tensors
from engine.reference.backend import ReferenceBackend
from engine.reference.model import ReferenceModel
from engine.reference.weights import weights_from_arrays
from engine.sampling import SamplingParams

ARCHS = ("qwen35", "qwen3", "qwen2", "llama")


def tiny_config(arch: str, num_layers: int = 4, context_length: int = 256) -> ModelConfig:
    """A small config with every feature of the architecture switched on (GQA, partial rope, 2 v heads per k head)."""
    common = dict(arch=arch, num_layers=num_layers, hidden_size=64, ffn_size=96, vocab_size=128, num_kv_heads=2,
                  rms_eps=1e-6, context_length=context_length, rope_neox=arch != "llama",
                  tied_embeddings=arch == "llama")
    if arch == "qwen35":
        kinds = tuple(ATTENTION if (i + 1) % 4 == 0 else DELTANET for i in range(num_layers))
        return ModelConfig(**common, num_heads=4, head_dim=32, rope_dim=8, rope_theta=1e7, layer_kinds=kinds,
                           has_qk_norm=True, has_attn_gate=True, ssm_num_k_heads=2, ssm_num_v_heads=4,
                           ssm_head_dim=16, ssm_conv_kernel=4, ssm_inner_size=64, num_nextn_layers=1,
                           rope_sections=(2, 1, 1, 0), full_attention_interval=4)
    return ModelConfig(**common, num_heads=4, head_dim=16, rope_dim=16, rope_theta=1e4,
                       layer_kinds=(ATTENTION,) * num_layers, has_qkv_bias=arch == "qwen2",
                       has_qk_norm=arch == "qwen3")


def random_arrays(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of the right shapes and plausible scales (norms near 1, ssm_a < 0, matrices ~ 1/sqrt(in))."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_tensors(cfg).items():
        if name.endswith("ssm_a"):
            value = -np.exp(rng.uniform(-1.0, 1.0, shape))  # stored as -exp(A_log)
        elif name.endswith("ssm_conv1d.weight"):
            value = rng.normal(0.0, 0.5, shape)
        elif len(shape) == 1:
            value = 1.0 + 0.1 * rng.standard_normal(shape) if "norm" in name else 0.1 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(shape[1])
        out[name] = value.astype(np.float32)
    out["token_embd.weight"] *= np.sqrt(cfg.hidden_size)  # embeddings are not followed by a 1/sqrt(in) matmul
    return out


def tiny_model(arch: str, seed: int = 0, **kwargs) -> ReferenceModel:
    """A ReferenceModel with random weights."""
    cfg = tiny_config(arch, **kwargs)
    return ReferenceModel(cfg, weights_from_arrays(random_arrays(cfg, seed), cfg.num_layers))


@pytest.fixture(params=ARCHS)
def arch(request) -> str:
    return request.param


@pytest.fixture
def backend(arch) -> ReferenceBackend:
    return ReferenceBackend(tiny_model(arch))


def tokens(n: int, seed: int = 7) -> list[int]:
    """n random ids of the tiny models' 128-token vocabulary."""
    return np.random.default_rng(seed).integers(0, 128, n).tolist()


def generate(backend: ReferenceBackend, prompt: list[int], count: int, params: SamplingParams, n_draft: int = 0,
             drafts: list[int] | None = None) -> tuple[list[int], list]:
    """count tokens after prompt by Backend.cycle (drafts: fixed draft tokens instead of the backend's own); the
    tokens and each cycle's result."""
    backend.reset()
    backend.prefill(prompt[:-1])
    seq = TokenSequence.start(prompt, params)
    stats = []
    while len(seq.generated) < count:
        draft = None
        if drafts is not None:
            done = len(seq.generated)
            draft = Draft(drafts[done : done + n_draft])
        stats.append(backend.cycle(seq, n_draft, params, draft=draft))
    return seq.generated[:count], stats
