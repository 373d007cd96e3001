"""float32 weights for the reference engine: every GGUF tensor dequantized once, at load.

Layers are dicts keyed by the GGUF name without "blk.N." and ".weight" ("attn_norm", "attn_q.bias", "ssm_a",
"nextn.eh_proj", ...), the same keys engine.model.weights.bind_weights uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import ModelFileError

if TYPE_CHECKING:
    from engine.gguf.reader import TensorInfo
    from engine.model.weights import ModelTensors

_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(.+?)(\.weight)?$")


class RowTable:
    """An embedding table kept as stored, rows dequantized on lookup: only a tied table is needed whole."""

    def __init__(self, info: TensorInfo):
        self.info = info
        self.shape: tuple[int, ...] = tuple(info.shape)

    def __getitem__(self, ids) -> np.ndarray:
        """Rows `ids` as float32 [len(ids), H], bit-identical to the same rows of the whole dequantized table."""
        from engine.gguf.quants import dequantize_rows

        return dequantize_rows(self.info.data, self.info.qtype, self.shape, np.asarray(ids, dtype=np.int64))


@dataclass(slots=True)
class ReferenceWeights:
    """All weights of a model as float32 arrays of their GGUF numpy shape."""

    token_embd: np.ndarray | RowTable  # [V, H]
    output_norm: np.ndarray  # [H]
    output: np.ndarray  # [V, H]; the very same array as token_embd when the embeddings are tied
    layers: list[dict[str, np.ndarray]]
    nextn: list[dict[str, np.ndarray]]

    def mtp_embeddings(self) -> np.ndarray | RowTable:
        """The token embedding table of the MTP head (its own if the file has one, else the trunk's)."""
        return self.nextn[0].get("nextn.embed_tokens", self.token_embd)

    def mtp_output(self) -> np.ndarray:
        """The output head of the MTP block (its own if the file has one, else the trunk's)."""
        return self.nextn[0].get("nextn.shared_head_head", self.output)


def _dequantized(infos: dict[str, TensorInfo], cache: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Dequantize each tensor once; a tensor bound under two names (tied output) becomes one shared array."""
    from engine.gguf.quants import dequantize

    out = {}
    for key, info in infos.items():
        if info.name not in cache:
            cache[info.name] = np.ascontiguousarray(dequantize(info.data, info.qtype, info.shape), dtype=np.float32)
        out[key] = cache[info.name]
    return out


def load_weights(tensors: ModelTensors) -> ReferenceWeights:
    """Dequantize the tensors bind_weights validated into float32 arrays (an untied token_embd stays as stored)."""
    cache: dict[str, np.ndarray] = {}
    top = dict(tensors.global_tensors)
    output = _dequantized({"output": top["output"]}, cache)["output"]
    tied = top["output"].name == top["token_embd"].name
    token_embd = output if tied else RowTable(top["token_embd"])
    output_norm = _dequantized({"output_norm": top["output_norm"]}, cache)["output_norm"]
    layers = [_dequantized(layer, cache) for layer in tensors.layers]
    nextn = [_lazy_embeddings(_dequantized(_without_embeddings(layer), cache), layer) for layer in tensors.nextn]
    return _complete(token_embd, output_norm, output, layers, nextn)


def _without_embeddings(layer: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """An MTP layer's tensors except its own embedding table (looked up row by row instead)."""
    return {k: v for k, v in layer.items() if k != "nextn.embed_tokens"}


def _lazy_embeddings(dense: dict, layer: dict[str, TensorInfo]) -> dict:
    """Put an MTP layer's own embedding table back, as a RowTable."""
    if "nextn.embed_tokens" in layer:
        dense["nextn.embed_tokens"] = RowTable(layer["nextn.embed_tokens"])
    return dense


def _complete(token_embd, output_norm, output, layers, nextn) -> ReferenceWeights:
    """Apply llama.cpp's fallbacks: output = token_embd when tied; shared_head_norm = output_norm when absent."""
    for layer in nextn:
        layer.setdefault("nextn.shared_head_norm", output_norm)
    return ReferenceWeights(token_embd, output_norm, token_embd if output is None else output, layers, nextn)


def weights_from_arrays(arrays: dict[str, np.ndarray], num_layers: int) -> ReferenceWeights:
    """Build weights from float arrays under full GGUF names ("blk.3.attn_q.weight", "token_embd.weight", ...).

    Layers numbered num_layers and above are the MTP (nextn) blocks. Used to run the reference on weights that did
    not come from a GGUF file (tests, weights mapped from another implementation).
    """
    per_layer: dict[int, dict[str, np.ndarray]] = {}
    top: dict[str, np.ndarray] = {}
    for name, array in arrays.items():
        value = np.ascontiguousarray(array, dtype=np.float32)
        match = _LAYER_NAME.match(name)
        if match:
            per_layer.setdefault(int(match.group(1)), {})[match.group(2)] = value
        else:
            top[name.removesuffix(".weight")] = value
    for required in ("token_embd", "output_norm"):
        if required not in top:
            raise ModelFileError("<arrays>", "missing tensor", tensor=f"{required}.weight")
    missing = [i for i in range(num_layers) if i not in per_layer]
    if missing:
        raise ModelFileError("<arrays>", f"no tensors for layers {missing}")
    layers = [per_layer[i] for i in range(num_layers)]
    nextn = [per_layer[i] for i in sorted(per_layer) if i >= num_layers]
    return _complete(top["token_embd"], top["output_norm"], top.get("output"), layers, nextn)
