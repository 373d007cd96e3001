"""GGUF name -> parameter table: which tensors each architecture needs, their shapes, and binding them with checks.

Values are exactly what the GGUF stores, with llama.cpp's conventions (qwen35 ssm_a already = -exp(A_log), norm
weights as stored, ssm_conv1d as (channels, kernel)): consumers apply llama.cpp's math to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import ModelFileError, UnsupportedModelError
from engine.gguf.quants import FLOAT_TYPES, SUPPORTED_TYPES, block_size
from engine.gguf.reader import GGUFFile, TensorInfo
from engine.model.config import ATTENTION, ModelConfig

Shape = tuple[int, ...]
GLOBAL_KEYS = ("token_embd", "output_norm", "output")
NEXTN_KEYS = ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm")
# MTP tensors a file may carry; the trunk's token_embd / output serve when they are absent.
NEXTN_OPTIONAL_KEYS = ("nextn.embed_tokens", "nextn.shared_head_head")


def full_name(key: str, layer: int | None = None) -> str:
    """GGUF tensor name for a table key: ("attn_q", 3) -> "blk.3.attn_q.weight"; "ssm_dt.bias" keeps its suffix."""
    prefix = "" if layer is None else f"blk.{layer}."
    if key.endswith(".bias") or key == "ssm_a":  # llama.cpp names ssm_a with no suffix
        return prefix + key
    return f"{prefix}{key}.weight"


def _attention_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    h = cfg.hidden_size
    q_rows = 2 * cfg.q_size if cfg.has_attn_gate else cfg.q_size  # qwen35 packs Q and its sigmoid gate per head
    shapes: dict[str, Shape] = {
        "attn_q": (q_rows, h), "attn_k": (cfg.kv_size, h), "attn_v": (cfg.kv_size, h),
        "attn_output": (h, cfg.q_size),
    }
    if cfg.has_qkv_bias:
        shapes.update({"attn_q.bias": (cfg.q_size,), "attn_k.bias": (cfg.kv_size,), "attn_v.bias": (cfg.kv_size,)})
    if cfg.has_qk_norm:
        shapes.update({"attn_q_norm": (cfg.head_dim,), "attn_k_norm": (cfg.head_dim,)})
    return shapes


def _deltanet_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    h, heads_v = cfg.hidden_size, cfg.ssm_num_v_heads
    return {
        "attn_qkv": (cfg.ssm_conv_dim, h), "attn_gate": (cfg.ssm_inner_size, h),
        "ssm_conv1d": (cfg.ssm_conv_dim, cfg.ssm_conv_kernel), "ssm_dt.bias": (heads_v,), "ssm_a": (heads_v,),
        "ssm_beta": (heads_v, h), "ssm_alpha": (heads_v, h), "ssm_norm": (cfg.ssm_v_head_dim,),
        "ssm_out": (h, cfg.ssm_inner_size),
    }


def layer_shapes(cfg: ModelConfig, kind: str) -> dict[str, Shape]:
    """Table key -> numpy shape for one layer of the given kind ("attention", "deltanet" or "nextn")."""
    h = cfg.hidden_size
    shapes: dict[str, Shape] = {"attn_norm": (h,)}
    shapes.update(_deltanet_shapes(cfg) if kind == "deltanet" else _attention_shapes(cfg))
    # qwen35 names its pre-FFN norm post_attention_norm; the others call it ffn_norm.
    shapes["post_attention_norm" if cfg.arch == "qwen35" else "ffn_norm"] = (h,)
    shapes.update({"ffn_gate": (cfg.ffn_size, h), "ffn_up": (cfg.ffn_size, h), "ffn_down": (h, cfg.ffn_size)})
    if kind == "nextn":
        shapes.update({"nextn.eh_proj": (h, 2 * h), "nextn.enorm": (h,), "nextn.hnorm": (h,),
                       "nextn.shared_head_norm": (h,)})
    return shapes


def global_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    """Table key -> numpy shape for the tensors outside the layers (output absent when embeddings are tied)."""
    shapes: dict[str, Shape] = {"token_embd": (cfg.vocab_size, cfg.hidden_size), "output_norm": (cfg.hidden_size,)}
    if not cfg.tied_embeddings:
        shapes["output"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def expected_tensors(cfg: ModelConfig) -> dict[str, Shape]:
    """Every required tensor: full GGUF name -> numpy shape ((out, in) for matrices), in llama.cpp's order."""
    out = {full_name(k): s for k, s in global_shapes(cfg).items()}
    for i, kind in enumerate(cfg.layer_kinds):
        out.update({full_name(k, i): s for k, s in layer_shapes(cfg, kind).items()})
    for i in range(cfg.num_layers, cfg.num_total_layers):
        out.update({full_name(k, i): s for k, s in layer_shapes(cfg, "nextn").items()})
    return out


def optional_tensors(cfg: ModelConfig) -> dict[str, Shape]:
    """Tensors a file may carry and the engine will use when present (qwen35 MTP's own embedding and head)."""
    shape = (cfg.vocab_size, cfg.hidden_size)
    return {full_name(k, i): shape for i in range(cfg.num_layers, cfg.num_total_layers) for k in NEXTN_OPTIONAL_KEYS}


@dataclass(slots=True)
class ModelTensors:
    """Validated tensors of one model, keyed as in the contract: globals, trunk layers, MTP (nextn) layers."""

    config: ModelConfig
    path: str
    global_tensors: dict[str, TensorInfo] = field(default_factory=dict)
    layers: list[dict[str, TensorInfo]] = field(default_factory=list)
    nextn: list[dict[str, TensorInfo]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes of weight data bound (output counted once when tied)."""
        seen = {id(t.data): t.nbytes for t in self.global_tensors.values()}
        seen.update({id(t.data): t.nbytes for layer in self.layers + self.nextn for t in layer.values()})
        return sum(seen.values())


# (tensor name, what is wrong, error class)
Problem = tuple[str, str, type[ModelFileError]]


def _check_tensor(f: GGUFFile, name: str, shape: Shape) -> Problem | None:
    """The problem if the tensor is missing, of the wrong shape or of an unusable type, else None."""
    info = f.tensors.get(name)
    if info is None:
        return name, f"is missing (expected shape {shape})", ModelFileError
    if info.shape != shape:
        return name, f"has shape {info.shape}, expected {shape}", ModelFileError
    if info.qtype not in SUPPORTED_TYPES:
        supported = ", ".join(t.name for t in SUPPORTED_TYPES)
        return name, f"has type {info.qtype.name}, not supported (supported: {supported})", UnsupportedModelError
    if len(shape) == 1 and info.qtype not in FLOAT_TYPES:
        return name, f"is a vector stored as {info.qtype.name}; vectors must be F32, F16 or BF16", \
            UnsupportedModelError
    assert shape[-1] % block_size(info.qtype) == 0  # the reader already refused partial blocks
    return None


def _raise_first(f: GGUFFile, problems: list[Problem]) -> None:
    if not problems:
        return
    name, message, error = problems[0]
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more problems, e.g. {problems[1][0]!r} {problems[1][1]})"
    raise error(f.path, message, tensor=name)


def validate_tensors(f: GGUFFile, cfg: ModelConfig) -> None:
    """Checks every required and present optional tensor, and refuses tensors the engine would silently ignore."""
    expected, optional = expected_tensors(cfg), optional_tensors(cfg)
    problems = [p for name, shape in expected.items() if (p := _check_tensor(f, name, shape))]
    problems += [p for name, shape in optional.items() if name in f.tensors and (p := _check_tensor(f, name, shape))]
    _raise_first(f, problems)
    unknown = [name for name in f.tensors if name not in expected and name not in optional]
    if unknown:
        listed = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise UnsupportedModelError(f.path, f"{len(unknown)} tensors this engine would not use for {cfg.arch} "
                                            f"(e.g. rope scaling factors), refusing to run it wrong: {listed}",
                                    tensor=unknown[0])


def _bind_layer(f: GGUFFile, cfg: ModelConfig, layer: int, kind: str) -> dict[str, TensorInfo]:
    bound = {key: f.tensors[full_name(key, layer)] for key in layer_shapes(cfg, kind)}
    if kind == "nextn":
        bound.update({k: f.tensors[full_name(k, layer)] for k in NEXTN_OPTIONAL_KEYS
                      if full_name(k, layer) in f.tensors})
    return bound


def bind_weights(f: GGUFFile, cfg: ModelConfig) -> ModelTensors:
    """Validates and binds every tensor of cfg's architecture (ModelFileError / UnsupportedModelError on failure)."""
    if f.arch != cfg.arch:
        raise ModelFileError(f.path, f"file architecture {f.arch!r} does not match the config's {cfg.arch!r}")
    validate_tensors(f, cfg)
    globals_ = {key: f.tensors[full_name(key)] for key in global_shapes(cfg)}
    if cfg.tied_embeddings:
        globals_["output"] = globals_["token_embd"]  # llama.cpp reuses the embedding as the LM head
    layers = [_bind_layer(f, cfg, i, kind) for i, kind in enumerate(cfg.layer_kinds)]
    nextn = [_bind_layer(f, cfg, i, "nextn") for i in range(cfg.num_layers, cfg.num_total_layers)]
    return ModelTensors(config=cfg, path=str(f.path), global_tensors=globals_, layers=layers, nextn=nextn)


def load_model(path: str) -> tuple[GGUFFile, ModelConfig, ModelTensors]:
    """Opens a GGUF file, reads its config and binds its weights: the one call most consumers need."""
    f = GGUFFile.open(path)
    cfg = ModelConfig.from_gguf(f)
    return f, cfg, bind_weights(f, cfg)


__all__ = ["ATTENTION", "GLOBAL_KEYS", "NEXTN_KEYS", "ModelTensors", "bind_weights", "expected_tensors",
           "full_name", "global_shapes", "layer_shapes", "load_model", "optional_tensors", "validate_tensors"]
