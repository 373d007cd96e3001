"""ModelConfig: the hyperparameters of one supported architecture, read from (and written to) GGUF metadata."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from gguf import GGUFValueType

from engine.errors import ModelFileError, UnsupportedModelError

if TYPE_CHECKING:
    from engine.gguf.reader import GGUFFile

SUPPORTED_ARCHS = ("qwen35", "qwen3", "qwen2", "llama")
ATTENTION, DELTANET = "attention", "deltanet"


@dataclass(slots=True)
class ModelConfig:
    """Hyperparameters with llama.cpp's meaning; num_layers counts trunk layers only (MTP layers excluded).

    rope_neox: rotate the two halves of the rotated dims (NEOX; qwen2/qwen3/qwen35) rather than adjacent pairs (llama).
    rope_dim: rotated dims per head (qwen35: 64 of 256). layer_kinds: "attention" | "deltanet" per trunk layer.
    ssm_*: qwen35 Gated DeltaNet sizes (0 elsewhere): ssm_num_k_heads = ssm.group_count, ssm_num_v_heads =
    ssm.time_step_rank, ssm_head_dim = ssm.state_size (the q/k head dim), ssm_inner_size = v heads * v head dim.
    """

    arch: str
    num_layers: int
    hidden_size: int
    ffn_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_dim: int
    rope_theta: float
    rope_neox: bool
    rms_eps: float
    context_length: int
    layer_kinds: tuple[str, ...]
    has_qkv_bias: bool = False
    has_qk_norm: bool = False
    has_attn_gate: bool = False
    ssm_num_k_heads: int = 0
    ssm_num_v_heads: int = 0
    ssm_head_dim: int = 0
    ssm_conv_kernel: int = 0
    ssm_inner_size: int = 0
    num_nextn_layers: int = 0
    tied_embeddings: bool = False
    rope_sections: tuple[int, ...] = field(default=())  # qwen35 M-RoPE sections; text uses equal positions
    full_attention_interval: int = 0  # qwen35: attention where (i + 1) % interval == 0

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(f"architecture {self.arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
        for name in ("num_layers", "hidden_size", "ffn_size", "vocab_size", "num_heads", "num_kv_heads",
                     "head_dim", "rope_dim", "context_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.rope_dim > self.head_dim or self.rope_dim % 2:
            raise ValueError(f"rope_dim {self.rope_dim} must be even and at most head_dim {self.head_dim}")
        if len(self.layer_kinds) != self.num_layers or set(self.layer_kinds) - {ATTENTION, DELTANET}:
            raise ValueError(f"layer_kinds must name {self.num_layers} layers as {ATTENTION!r} or {DELTANET!r}")
        if self.rms_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(f"rms_eps {self.rms_eps} and rope_theta {self.rope_theta} must be positive")
        if DELTANET in self.layer_kinds:
            self._check_ssm()

    def _check_ssm(self) -> None:
        for name in ("ssm_num_k_heads", "ssm_num_v_heads", "ssm_head_dim", "ssm_conv_kernel", "ssm_inner_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive for DeltaNet layers, got {getattr(self, name)}")
        if self.ssm_num_v_heads % self.ssm_num_k_heads:
            raise ValueError(f"ssm v heads {self.ssm_num_v_heads} not a multiple of k heads {self.ssm_num_k_heads}")
        if self.ssm_inner_size % self.ssm_num_v_heads:
            raise ValueError(f"ssm_inner_size {self.ssm_inner_size} not a multiple of v heads {self.ssm_num_v_heads}")

    # Derived sizes (all in elements).
    @property
    def q_size(self) -> int:
        """Width of the attention Q (num_heads * head_dim), without the qwen35 output gate."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of K and of V (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def ssm_v_head_dim(self) -> int:
        """DeltaNet value head dim (ssm_inner_size / v heads, as llama.cpp derives it)."""
        return self.ssm_inner_size // self.ssm_num_v_heads if self.ssm_num_v_heads else 0

    @property
    def ssm_key_dim(self) -> int:
        """Total DeltaNet q (and k) width: k heads * head dim."""
        return self.ssm_num_k_heads * self.ssm_head_dim

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v concatenated (the attn_qkv output)."""
        return 2 * self.ssm_key_dim + self.ssm_inner_size

    @property
    def num_total_layers(self) -> int:
        """block_count as stored: trunk layers plus MTP layers."""
        return self.num_layers + self.num_nextn_layers

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ModelConfig:
        """Reads the config from a GGUF file; ModelFileError / UnsupportedModelError name the file and the key."""
        if f.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(f.path, f"architecture {f.arch!r} is not supported "
                                                f"(supported: {', '.join(SUPPORTED_ARCHS)})")
        values = _read_values(f)
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ModelFileError(f.path, f"invalid hyperparameters: {exc}") from None

    def to_gguf_metadata(self) -> list[tuple[str, Any, GGUFValueType]]:
        """(key, value, type) for every architecture key llama.cpp reads; the inverse of from_gguf."""
        a, u32, f32 = self.arch, GGUFValueType.UINT32, GGUFValueType.FLOAT32
        out = [
            (f"{a}.block_count", self.num_total_layers, u32), (f"{a}.context_length", self.context_length, u32),
            (f"{a}.embedding_length", self.hidden_size, u32), (f"{a}.feed_forward_length", self.ffn_size, u32),
            (f"{a}.attention.head_count", self.num_heads, u32),
            (f"{a}.attention.head_count_kv", self.num_kv_heads, u32),
            (f"{a}.attention.key_length", self.head_dim, u32), (f"{a}.attention.value_length", self.head_dim, u32),
            (f"{a}.rope.dimension_count", self.rope_dim, u32), (f"{a}.rope.freq_base", self.rope_theta, f32),
            (f"{a}.attention.layer_norm_rms_epsilon", self.rms_eps, f32), (f"{a}.vocab_size", self.vocab_size, u32),
        ]
        if self.arch == "qwen35":
            out += [
                (f"{a}.rope.dimension_sections", list(self.rope_sections), GGUFValueType.ARRAY),
                (f"{a}.full_attention_interval", self.full_attention_interval, u32),
                (f"{a}.ssm.conv_kernel", self.ssm_conv_kernel, u32), (f"{a}.ssm.state_size", self.ssm_head_dim, u32),
                (f"{a}.ssm.group_count", self.ssm_num_k_heads, u32),
                (f"{a}.ssm.time_step_rank", self.ssm_num_v_heads, u32),
                (f"{a}.ssm.inner_size", self.ssm_inner_size, u32),
                (f"{a}.nextn_predict_layers", self.num_nextn_layers, u32),
            ]
        return out

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of every field (for logs and JSON)."""
        return asdict(self)


def _meta(f: GGUFFile, suffix: str, default: Any = ..., kind: type = int) -> Any:
    """Reads f"{arch}.{suffix}" as kind; a per-layer array must be uniform. Missing and no default -> error."""
    key = f"{f.arch}.{suffix}"
    value = f.metadata.get(key, default)
    if value is ...:
        raise ModelFileError(f.path, f"metadata key {key!r} is missing")
    if isinstance(value, list) and kind is not list:
        if not value or any(v != value[0] for v in value):
            raise UnsupportedModelError(f.path, f"metadata key {key!r} varies per layer ({value[:8]}...), "
                                                "which this engine does not support")
        value = value[0]
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ModelFileError(f.path, f"metadata key {key!r} has value {value!r}, expected {kind.__name__}") from None


def _layer_kinds(f: GGUFFile, arch: str, num_layers: int, interval: int) -> tuple[str, ...]:
    if arch != "qwen35":
        return (ATTENTION,) * num_layers
    recurrent = f.arch_get("attention.recurrent_layers")
    if isinstance(recurrent, list) and len(recurrent) >= num_layers:
        return tuple(DELTANET if recurrent[i] else ATTENTION for i in range(num_layers))
    if interval <= 0:
        raise ModelFileError(f.path, f"metadata key '{arch}.full_attention_interval' is {interval}, expected > 0")
    return tuple(ATTENTION if (i + 1) % interval == 0 else DELTANET for i in range(num_layers))


def _vocab_size(f: GGUFFile) -> int:
    if f.arch_get("vocab_size") is not None:
        return _meta(f, "vocab_size")
    tokens = f.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    embd = f.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelFileError(f.path, "vocabulary size unknown: no vocab_size key, tokenizer or token_embd tensor")
    return embd.shape[0]


def _read_values(f: GGUFFile) -> dict[str, Any]:
    """Every ModelConfig field from metadata, with llama.cpp's defaults for optional keys."""
    arch = f.arch
    num_total = _meta(f, "block_count")
    num_nextn = _meta(f, "nextn_predict_layers", 0)
    if not 0 <= num_nextn < num_total:
        raise ModelFileError(f.path, f"nextn_predict_layers {num_nextn} does not fit block_count {num_total}")
    hidden, num_heads = _meta(f, "embedding_length"), _meta(f, "attention.head_count")
    if num_heads <= 0:
        raise ModelFileError(f.path, f"metadata key '{arch}.attention.head_count' is {num_heads}, expected > 0")
    head_dim = _meta(f, "attention.key_length", hidden // num_heads)
    value_dim = _meta(f, "attention.value_length", head_dim)
    if value_dim != head_dim:
        raise UnsupportedModelError(f.path, f"attention value_length {value_dim} differs from key_length {head_dim}")
    interval = _meta(f, "full_attention_interval", 4 if arch == "qwen35" else 0)
    values: dict[str, Any] = dict(
        arch=arch, num_layers=num_total - num_nextn, hidden_size=hidden, ffn_size=_meta(f, "feed_forward_length"),
        vocab_size=_vocab_size(f), num_heads=num_heads, num_kv_heads=_meta(f, "attention.head_count_kv", num_heads),
        head_dim=head_dim, rope_dim=_meta(f, "rope.dimension_count", head_dim),
        rope_theta=_meta(f, "rope.freq_base", 10000.0, float), rope_neox=arch != "llama",
        rms_eps=_meta(f, "attention.layer_norm_rms_epsilon", kind=float),
        context_length=_meta(f, "context_length"),
        layer_kinds=_layer_kinds(f, arch, num_total - num_nextn, interval),
        has_qkv_bias=arch == "qwen2", has_qk_norm=arch in ("qwen3", "qwen35"), has_attn_gate=arch == "qwen35",
        num_nextn_layers=num_nextn, tied_embeddings="output.weight" not in f.tensors,
    )
    if arch == "llama" and values["rope_dim"] != head_dim:
        raise UnsupportedModelError(f.path, f"llama rope.dimension_count {values['rope_dim']} != head dim {head_dim}")
    if arch == "qwen35":
        values.update(
            ssm_num_k_heads=_meta(f, "ssm.group_count"), ssm_num_v_heads=_meta(f, "ssm.time_step_rank"),
            ssm_head_dim=_meta(f, "ssm.state_size"), ssm_conv_kernel=_meta(f, "ssm.conv_kernel"),
            ssm_inner_size=_meta(f, "ssm.inner_size"), full_attention_interval=interval,
            rope_sections=tuple(int(s) for s in _meta(f, "rope.dimension_sections", [], list)),
        )
    return values


def qwen38_27b_config(context_length: int = 262144) -> ModelConfig:
    """The Qwen3.8-27B shape (qwen35: 64 layers of 3 DeltaNet + 1 gated attention, MTP block, vocab 248320)."""
    return ModelConfig(
        arch="qwen35", num_layers=64, hidden_size=5120, ffn_size=17408, vocab_size=248320, num_heads=24,
        num_kv_heads=4, head_dim=256, rope_dim=64, rope_theta=1e7, rope_neox=True, rms_eps=1e-6,
        context_length=context_length,
        layer_kinds=tuple(ATTENTION if (i + 1) % 4 == 0 else DELTANET for i in range(64)),
        has_qk_norm=True, has_attn_gate=True, ssm_num_k_heads=16, ssm_num_v_heads=48, ssm_head_dim=128,
        ssm_conv_kernel=4, ssm_inner_size=6144, num_nextn_layers=1, rope_sections=(11, 11, 10, 0),
        full_attention_interval=4,
    )
