"""Random-weight GGUF test models for every supported architecture, loadable by llama.cpp and by our engine.

Tiny models (the default) hold gaussian weights quantized by our packers in a Q4_K_M-like mix; the vocabulary-sized
tensors and every tensor of a --fast / --preset model are written directly as random valid blocks (engine.gguf.synth),
in parallel and streamed to disk, which is what makes a full-size Qwen3.8-27B-shaped file take minutes, not hours.
Weight scales are chosen so activations stay O(1) through the layers and the logits have real margins.
"""

from __future__ import annotations

import argparse
import lzma
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, TokenType

from engine.gguf.quants import block_size, quantize, row_bytes
from engine.gguf.reader import GGUFFile
from engine.gguf.synth import SCALE_SPANS, fill_blocks, header_pool, random_tensor, scale_rows
from engine.gguf.writer import GGUFStreamWriter
from engine.model.config import ATTENTION, DELTANET, SUPPORTED_ARCHS, ModelConfig, qwen38_27b_config
from engine.model.weights import expected_tensors

Q = GGMLQuantizationType
VOCAB_ASSET = Path(__file__).resolve().parents[2] / "assets" / "vocab" / "qwen2.5-coder.gguf.xz"
PRESETS = {"qwen3.8-27b": qwen38_27b_config}
LOGIT_STD = 4.0  # std of the logits before row scaling (plain gaussian logits: median top-1 gap ~0.6 nat)
# Lognormal spread of output row norms: some tokens likelier, as in a trained model; it widens the top-1 gap
# (median ~2.4 nats; P(gap < 0.1 nat) falls from ~9 % to ~2 %) while keeping the argmax diverse.
LOGIT_ROW_SIGMA = 0.3
CHUNK_BYTES = 32 << 20  # unit of parallel generation in fast mode
NORM_KEYS = ("attn_norm", "ffn_norm", "post_attention_norm", "output_norm", "attn_q_norm", "attn_k_norm",
             "ssm_norm", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm")


def tiny_config(arch: str, *, num_layers: int | None = None, hidden_size: int = 256, ffn_size: int = 512,
                num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 64, context_length: int = 4096,
                vocab_size: int = 151936, tied_embeddings: bool | None = None) -> ModelConfig:
    """A small config of arch; qwen35 gets 3 DeltaNet + 1 attention layer per 4, partial rotary and one MTP layer."""
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    is_qwen35 = arch == "qwen35"
    if num_layers is None:
        num_layers = 4 if is_qwen35 else 2
    common: dict[str, Any] = dict(
        arch=arch, num_layers=num_layers, hidden_size=hidden_size, ffn_size=ffn_size, vocab_size=vocab_size,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, rope_theta=1e6 if arch != "llama" else 1e4,
        rope_neox=arch != "llama", rms_eps=1e-6, context_length=context_length,
        has_qkv_bias=arch == "qwen2", has_qk_norm=arch in ("qwen3", "qwen35"), has_attn_gate=is_qwen35,
        # llama models are tied (as SmolLM2 is) so the tied path is covered; the rest carry output.weight
        tied_embeddings=(arch == "llama") if tied_embeddings is None else tied_embeddings,
    )
    if not is_qwen35:
        return ModelConfig(**common, rope_dim=head_dim, layer_kinds=(ATTENTION,) * num_layers)
    pairs = head_dim // 8  # rotate a quarter of each head (64 of 256 in the real model)
    side = round(pairs * 11 / 32)  # M-RoPE sections in the real model's 11:11:10 proportions
    return ModelConfig(
        **common, rope_dim=2 * pairs, rope_sections=(side, side, pairs - 2 * side, 0), full_attention_interval=4,
        layer_kinds=tuple(ATTENTION if (i + 1) % 4 == 0 else DELTANET for i in range(num_layers)),
        ssm_num_k_heads=max(1, num_kv_heads), ssm_num_v_heads=2 * max(1, num_kv_heads), ssm_head_dim=head_dim,
        ssm_conv_kernel=4, ssm_inner_size=2 * max(1, num_kv_heads) * head_dim, num_nextn_layers=1,
    )


@lru_cache(maxsize=1)
def _vocab_file() -> GGUFFile:
    if not VOCAB_ASSET.is_file():
        raise FileNotFoundError(f"tokenizer asset {VOCAB_ASSET} is missing (it ships with the source tree)")
    return GGUFFile.from_bytes(lzma.decompress(VOCAB_ASSET.read_bytes()), VOCAB_ASSET)


def tokenizer_metadata(vocab_size: int | None = None) -> list[tuple[str, Any, GGUFValueType, GGUFValueType | None]]:
    """Every tokenizer.* key of the bundled Qwen2.5-Coder vocabulary, padded with unused tokens to vocab_size."""
    vocab = _vocab_file()
    tokens = vocab.metadata["tokenizer.ggml.tokens"]
    vocab_size = vocab_size or len(tokens)
    if vocab_size < len(tokens):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tokens)} tokens")
    pad = vocab_size - len(tokens)  # as converters do for padded embedding tables: [PADn] tokens, never produced
    out = []
    for key, value in vocab.metadata.items():
        if not key.startswith("tokenizer."):
            continue
        vtype, sub_type = vocab.value_types[key]
        if key == "tokenizer.ggml.tokens":
            value = value + [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
        elif key == "tokenizer.ggml.token_type":
            value = value + [int(TokenType.UNUSED)] * pad
        out.append((key, value, vtype, sub_type))
    return out


def use_more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's Q4_K_M rule for which attn_v / ffn_down layers get Q6_K."""
    return layer < num_layers // 8 or layer >= 7 * num_layers // 8 or (layer - num_layers // 8) % 3 == 2


def pick_qtype(key: str, layer: int | None, cfg: ModelConfig, shape: tuple[int, ...]) -> GGMLQuantizationType:
    """The Q4_K_M-like type of one tensor, falling back to Q8_0 / F16 when rows do not fill K-quant blocks."""
    if len(shape) == 1 or key == "ssm_conv1d":
        return Q.F32
    if key == "output":
        qtype = Q.Q6_K
    elif key in ("attn_v", "ffn_down"):
        qtype = Q.Q6_K if use_more_bits(layer or 0, cfg.num_total_layers) else Q.Q4_K
    elif key in ("ssm_alpha", "ssm_beta"):
        qtype = Q.Q8_0  # tiny gate projections: real files keep them at 8 bits
    elif key == "attn_k":
        qtype = Q.Q5_0  # legacy 32-weight blocks, as real Q4_K_M files carry
    else:
        qtype = Q.Q4_K
    for fallback in (qtype, Q.Q8_0, Q.F16):
        if shape[-1] % block_size(fallback) == 0:
            return fallback
    return Q.F32


@dataclass(slots=True)
class TensorPlan:
    """How to generate one tensor: table key, layer, GGUF name, shape, type and init."""

    key: str
    layer: int | None
    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    std: float
    mean: float = 0.0


def _init_std(key: str, shape: tuple[int, ...], cfg: ModelConfig) -> tuple[float, float]:
    """(std, mean) of a tensor's values; matrices get 1/sqrt(fan_in) so each projection keeps unit scale."""
    if key in NORM_KEYS:
        return 0.1, 1.0
    if key.endswith(".bias") and key != "ssm_dt.bias":
        return 0.3, 0.0
    if key == "ssm_conv1d":
        return 1.0 / np.sqrt(cfg.ssm_conv_kernel), 0.0
    if key == "token_embd":
        # tied: the embedding is also the LM head, so it carries the logit scale
        return (LOGIT_STD / np.sqrt(cfg.hidden_size), 0.0) if cfg.tied_embeddings else (1.0, 0.0)
    if key == "output":
        return LOGIT_STD / np.sqrt(cfg.hidden_size), 0.0
    gain = 0.5 if key == "ssm_alpha" else 1.0  # keeps the DeltaNet decay gate in its working range
    return gain / np.sqrt(shape[-1]), 0.0


def plan_tensors(cfg: ModelConfig) -> list[TensorPlan]:
    """Every tensor of cfg in file order with its type and init."""
    plans = []
    for name, shape in expected_tensors(cfg).items():
        parts = name.split(".")
        layer = int(parts[1]) if parts[0] == "blk" else None
        key = ".".join(parts[2:] if layer is not None else parts)
        key = key.removesuffix(".weight")
        std, mean = _init_std(key, shape, cfg)
        plans.append(TensorPlan(key, layer, name, shape, pick_qtype(key, layer, cfg, shape), float(std), mean))
    return plans


def _special_vector(plan: TensorPlan, rng: np.random.Generator) -> np.ndarray | None:
    """qwen35 DeltaNet decay parameters as a trained model has them (llama.cpp conventions), else None."""
    n = plan.shape[0]
    if plan.key == "ssm_a":  # stored as -exp(A_log), A_log ~ log U(1, 16)
        return -np.exp(rng.uniform(np.log(1.0), np.log(16.0), n)).astype(np.float32)
    if plan.key == "ssm_dt.bias":  # inverse softplus of dt ~ log U(1e-3, 1e-1)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    return None


def _row_factors(plan: TensorPlan, cfg: ModelConfig, rng: np.random.Generator) -> np.ndarray | None:
    """Per-row scale of an untied LM head, else None. (A tied head is left plain: scaling its rows would also scale
    the embeddings, and a big-norm token would then predict itself forever.)"""
    if plan.key != "output":
        return None
    return np.exp(rng.normal(0.0, LOGIT_ROW_SIGMA, plan.shape[0])).astype(np.float32)


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    return (int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1), shape[-1]


def _dense_tensor(plan: TensorPlan, cfg: ModelConfig, rng: np.random.Generator, synth: bool) -> np.ndarray:
    """The whole tensor at once: gaussian floats quantized by our packers, or random blocks when synth."""
    rows, cols = _rows_cols(plan.shape)
    special = _special_vector(plan, rng)
    factors = _row_factors(plan, cfg, rng)
    if special is not None:
        return quantize(special.reshape(rows, cols), plan.qtype)
    if synth and plan.qtype in SCALE_SPANS:
        data = random_tensor(plan.qtype, plan.shape, plan.std, rng)
        if factors is not None:
            scale_rows(plan.qtype, data, factors)
        return data
    values = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(plan.std) + np.float32(plan.mean)
    if factors is not None:
        values *= factors[:, None]
    return quantize(values, plan.qtype)


def _synth_chunk(plan: TensorPlan, pool: np.ndarray, factors: np.ndarray | None, start: int, stop: int,
                 seed: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = fill_blocks(plan.qtype, pool, stop - start, plan.shape[-1], rng)
    if factors is not None:
        scale_rows(plan.qtype, data, factors[start:stop])
    return data


def _chunked_synth(plan: TensorPlan, cfg: ModelConfig, seed: tuple[int, ...], executor: ThreadPoolExecutor,
                   max_in_flight: int) -> Iterator[np.ndarray]:
    """Yields a big quantized tensor in row chunks generated in parallel, at most max_in_flight chunks queued."""
    rng = np.random.default_rng(seed)
    pool, factors = header_pool(plan.qtype, plan.std, rng), _row_factors(plan, cfg, rng)
    rows, cols = _rows_cols(plan.shape)
    step = max(1, CHUNK_BYTES // row_bytes(plan.qtype, cols))
    starts = iter(range(0, rows, step))
    in_flight: deque = deque()
    while True:
        while len(in_flight) < max_in_flight and (start := next(starts, None)) is not None:
            stop = min(rows, start + step)
            in_flight.append(executor.submit(_synth_chunk, plan, pool, factors, start, stop, (*seed, start)))
        if not in_flight:
            return
        yield in_flight.popleft().result()


MetadataItem = tuple[str, Any, GGUFValueType, GGUFValueType | None]


def _metadata(cfg: ModelConfig, seed: int, tokenizer: bool) -> list[MetadataItem]:
    u32 = GGUFValueType.UINT32
    general = [
        ("general.type", "model", GGUFValueType.STRING, None),
        ("general.name", f"OpenJet random test model ({cfg.arch}, seed {seed})", GGUFValueType.STRING, None),
        ("general.file_type", 15, u32, None),  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        ("general.quantization_version", 2, u32, None),
    ]
    arch = [(k, v, t, GGUFValueType.INT32 if t == GGUFValueType.ARRAY else None)
            for k, v, t in cfg.to_gguf_metadata()]
    return general + arch + (tokenizer_metadata(cfg.vocab_size) if tokenizer else [])


def write_model(path: str | Path, cfg: ModelConfig, *, seed: int = 0, fast: bool = False,
                workers: int | None = None, tokenizer: bool = True) -> Path:
    """Writes a random-weight model of cfg to path, streaming tensor by tensor; returns the path.

    fast: every quantized matrix is random valid blocks generated in parallel chunks (the full-size path);
    otherwise matrices are gaussian floats quantized by our packers, except vocabulary-sized ones.
    tokenizer=False leaves out the tokenizer (any vocab_size then; llama.cpp will not load such a file).
    """
    plans = plan_tensors(cfg)
    workers = workers or min(32, os.cpu_count() or 1)
    with GGUFStreamWriter(path, cfg.arch) as writer, ThreadPoolExecutor(workers) as executor:
        for key, value, vtype, sub_type in _metadata(cfg, seed, tokenizer):
            writer.add_metadata(key, value, vtype, sub_type)
        for plan in plans:
            writer.add_tensor(plan.name, plan.shape, plan.qtype)
        writer.begin()
        for index, plan in enumerate(plans):
            tensor_seed = (seed, index)
            if fast and plan.qtype in SCALE_SPANS and len(plan.shape) == 2:
                for chunk in _chunked_synth(plan, cfg, tensor_seed, executor, 2 * workers):
                    writer.write(chunk)
            else:
                synth = fast or plan.shape[0] == cfg.vocab_size  # vocab-sized: too big to quantize quickly
                writer.write(_dense_tensor(plan, cfg, np.random.default_rng(tensor_seed), synth))
        return writer.finish()


def write_test_model(path: str | Path, arch: str, *, num_layers: int | None = None, hidden_size: int = 256,
                     ffn_size: int = 512, num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 64,
                     context_length: int = 4096, vocab_size: int | None = None,
                     tied_embeddings: bool | None = None, seed: int = 0, fast: bool = False,
                     workers: int | None = None, tokenizer: bool = True) -> Path:
    """Writes a tiny random-weight model of arch (defaults: hidden 256, 2 layers; qwen35 4 layers + MTP).

    vocab_size defaults to the bundled tokenizer's 151936 tokens (512 when tokenizer=False).
    """
    if vocab_size is None:
        vocab_size = len(_vocab_file().metadata["tokenizer.ggml.tokens"]) if tokenizer else 512
    cfg = tiny_config(arch, num_layers=num_layers, hidden_size=hidden_size, ffn_size=ffn_size, num_heads=num_heads,
                      num_kv_heads=num_kv_heads, head_dim=head_dim, context_length=context_length,
                      vocab_size=vocab_size, tied_embeddings=tied_embeddings)
    return write_model(path, cfg, seed=seed, fast=fast, workers=workers, tokenizer=tokenizer)


def write_preset(path: str | Path, preset: str, *, seed: int = 0, workers: int | None = None,
                 context_length: int | None = None) -> Path:
    """Writes a full-size random model of a named shape (e.g. "qwen3.8-27b") through the fast path."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    cfg = PRESETS[preset]() if context_length is None else PRESETS[preset](context_length)
    return write_model(path, cfg, seed=seed, fast=True, workers=workers)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `openjet-engine make-test-model`."""
    parser.add_argument("--arch", choices=SUPPORTED_ARCHS, default="qwen35", help="architecture (default qwen35)")
    parser.add_argument("--out", required=True, type=Path, help="output .gguf path")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="full-size shape (ignores the size options)")
    for flag, dest, default in (("--layers", "num_layers", None), ("--hidden", "hidden_size", 256),
                                ("--ffn", "ffn_size", 512), ("--heads", "num_heads", 4),
                                ("--kv-heads", "num_kv_heads", 2), ("--head-dim", "head_dim", 64),
                                ("--ctx", "context_length", None), ("--vocab", "vocab_size", None)):
        parser.add_argument(flag, dest=dest, type=int, default=default, help=f"default {default or 'per arch'}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fast", action="store_true", help="random blocks instead of quantized gaussians")
    parser.add_argument("--workers", type=int, default=None, help="generator threads (default: CPU count)")


def run(args: argparse.Namespace) -> int:
    """Writes the model the arguments describe and prints where, how big and how fast."""
    start = time.perf_counter()
    try:
        if args.preset:
            path = write_preset(args.out, args.preset, seed=args.seed, workers=args.workers,
                                context_length=args.context_length)
        else:
            path = write_test_model(
                args.out, args.arch, num_layers=args.num_layers, hidden_size=args.hidden_size,
                ffn_size=args.ffn_size, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
                head_dim=args.head_dim, context_length=args.context_length or 4096, vocab_size=args.vocab_size,
                seed=args.seed, fast=args.fast, workers=args.workers)
    except (ValueError, OSError) as exc:
        print(f"openjet-engine make-test-model: error: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1e9:.3f} GB) in {seconds:.1f} s ({size / 1e6 / max(seconds, 1e-9):.0f} MB/s)")
    return 0
