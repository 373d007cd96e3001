"""Model weights on the GPU: GGUF tensors (engine.model.weights.bind_weights) repacked and uploaded.

Matrices that read the same input are grouped into one Projection whose outputs are adjacent column ranges of
one buffer (q | k | v; qkv | gate | alpha | beta; ffn gate | up). Consecutive members with the same type and width
are fused into a single matrix (their rows repacked together), so one launch streams all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType as Q

from engine.cuda import ops
from engine.cuda.device import Buffer, Device
from engine.cuda.instances import MATMUL_QTYPES
from engine.errors import UnsupportedModelError
from engine.gguf.quants import dequantize

if TYPE_CHECKING:
    from engine.gguf.reader import TensorInfo
    from engine.model.config import ModelConfig
    from engine.model.weights import ModelTensors

DEVICE_QTYPES = (Q.F32,) + MATMUL_QTYPES


@dataclass(slots=True)
class Part:
    """One launch of a projection: a (possibly fused) matrix, its bias, and where its outputs start."""

    weight: ops.DeviceWeight
    bias: Buffer | None
    offset: int


@dataclass(slots=True)
class Projection:
    """Matrices sharing one input; output columns [offset, offset + rows) of a [T, width] buffer per member."""

    parts: list[Part]
    width: int
    offsets: dict[str, int] = field(default_factory=dict)  # member key -> first output column

    def run(self, dev: Device, act: ops.Act, y: Buffer, num_tokens: int, ld_y: int, beside: bool = False,
            producer: ops.Producer | None = None) -> None:
        """y[:, offset:offset + rows] = act @ W^T (+ bias) for every part.

        producer: the op that makes act, launched first.

        beside: the parts other than the largest run on the device's side stream (Device.beside), so that a small
        one (DeltaNet's 96-row alpha | beta) overlaps the large one instead of following it; the caller joins
        (dev.join()) before reading their outputs. Parts that launch the persistent mmvq stay on the main
        stream (its scratch is one per device)."""
        if producer is not None:
            ops.produce(dev, producer, act, num_tokens)
        main = max(self.parts, key=lambda part: part.weight.buf.nbytes)
        side = [part for part in self.parts if part is not main and beside and
                not ops.runs_persist(dev, part.weight, act, num_tokens)]
        if side:
            with dev.beside():
                for part in side:
                    self._launch(dev, part, act, y, num_tokens, ld_y)
        for part in self.parts:
            if not any(part is s for s in side):
                self._launch(dev, part, act, y, num_tokens, ld_y)

    @staticmethod
    def _launch(dev: Device, part: Part, act: ops.Act, y: Buffer, num_tokens: int, ld_y: int) -> None:
        ops.matmul(dev, part.weight, act, y.view(4 * part.offset), num_tokens, ld_y, bias=part.bias)


def vector(dev: Device, info: TensorInfo, what: str) -> Buffer:
    """A 1-D (or small) tensor as f32 on the device."""
    values = np.ascontiguousarray(dequantize(info.data, info.qtype, info.shape), dtype=np.float32)
    return dev.to_device(values, what)


def _check_type(info: TensorInfo) -> None:
    if info.qtype not in DEVICE_QTYPES:
        raise UnsupportedModelError("<weights>", f"no CUDA kernels for {info.qtype.name} weights", tensor=info.name)


def matrix(dev: Device, info: TensorInfo) -> ops.DeviceWeight:
    """One weight matrix in the device layout."""
    _check_type(info)
    rows, cols = info.shape
    return ops.upload_weight(dev, info.data, info.qtype, (rows, cols), info.name)


def _fused(dev: Device, infos: list[TensorInfo], name: str) -> ops.DeviceWeight:
    """Several matrices of one type and width as one: their rows in order, repacked as one matrix (so the tiled
    words of Q4_K/Q5_K, repack.TILE_WORDS, run across the joins as the kernels index them)."""
    qtype, cols = infos[0].qtype, infos[0].shape[1]
    rows = sum(i.shape[0] for i in infos)
    data = np.concatenate([np.ascontiguousarray(i.data).view(np.uint8).reshape(i.shape[0], -1) for i in infos])
    return ops.upload_weight(dev, data, qtype, (rows, cols), name)


def projection(dev: Device, members: list[tuple[str, TensorInfo, TensorInfo | None]], name: str,
               fuse: bool = True) -> Projection:
    """Upload (key, matrix, bias-or-None) members as one Projection, fusing runs of equal type and width."""
    for _, info, _ in members:
        _check_type(info)
    runs: list[list[tuple[str, TensorInfo, TensorInfo | None]]] = []
    for member in members:
        last = runs[-1][-1][1] if runs else None
        same = last is not None and last.qtype == member[1].qtype and last.shape[1] == member[1].shape[1]
        if fuse and same and last.qtype != Q.F32:
            runs[-1].append(member)
        else:
            runs.append([member])
    parts, offsets, offset = [], {}, 0
    for run in runs:
        infos = [info for _, info, _ in run]
        weight = matrix(dev, infos[0]) if len(run) == 1 else _fused(dev, infos, f"{name}[{'|'.join(k for k, _, _ in run)}]")
        bias = None
        if any(b is not None for _, _, b in run):
            values = [np.zeros(i.shape[0], np.float32) if b is None else dequantize(b.data, b.qtype, b.shape)
                      for _, i, b in run]
            bias = dev.to_device(np.concatenate(values).astype(np.float32), f"{name}.bias")
        parts.append(Part(weight, bias, offset))
        for key, info, _ in run:
            offsets[key] = offset
            offset += info.shape[0]
    return Projection(parts, offset, offsets)


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer: its projections, output matrices and f32 vectors."""

    kind: str
    mix_in: Projection  # attention: q | k | v; deltanet: qkv | gate | alpha | beta
    mix_out: ops.DeviceWeight  # attn_output or ssm_out
    ffn_in: Projection  # gate | up
    ffn_down: ops.DeviceWeight
    vectors: dict[str, Buffer]


@dataclass(slots=True)
class MtpWeights:
    """The MTP head (qwen35's nextn layer, engine/reference/qwen35.py mtp_block): eh_proj over [enorm(embedding) |
    hnorm(hidden)], a gated-attention decoder layer (whose vectors hold the nextn norms), and the embedding and
    output tables it drafts with (its own where the file has them, else the trunk's)."""

    eh_proj: ops.DeviceWeight  # [H, 2H]
    layer: LayerWeights
    embed: ops.DeviceWeight
    output: ops.DeviceWeight
    # the output head's first rows alone, where the drafts come from fewer ids than the vocabulary's (engine/
    # backend.py DRAFT_VOCAB_ENV): a copy of those rows, so a draft step streams only them
    draft_head: ops.DeviceWeight | None = None

    @property
    def drafts_from(self) -> ops.DeviceWeight:
        """The matrix a draft step multiplies: the restricted head, else the whole output head."""
        return self.draft_head or self.output


@dataclass(slots=True)
class CudaWeights:
    """Every weight of a model on the device."""

    token_embd: ops.DeviceWeight
    output: ops.DeviceWeight
    output_norm: Buffer
    layers: list[LayerWeights]
    nbytes: int
    mtp: MtpWeights | None = None


def _layer(dev: Device, infos: dict[str, TensorInfo], kind: str, name: str) -> LayerWeights:
    """Upload one layer (trunk or the MTP block's decoder layer)."""
    if kind == "attention":
        mix = projection(dev, [(k, infos[k], infos.get(f"{k}.bias")) for k in ("attn_q", "attn_k", "attn_v")],
                         f"{name}.qkv")
        out = matrix(dev, infos["attn_output"])
        vec_keys = ("attn_q_norm", "attn_k_norm")
    else:
        mix = projection(dev, [(k, infos[k], None) for k in ("attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta")],
                         f"{name}.ssm_in")
        out = matrix(dev, infos["ssm_out"])
        vec_keys = ("ssm_conv1d", "ssm_a", "ssm_dt.bias", "ssm_norm")
    ffn = projection(dev, [(k, infos[k], None) for k in ("ffn_gate", "ffn_up")], f"{name}.ffn")
    norm_keys = ("attn_norm", "ffn_norm", "post_attention_norm", "nextn.enorm", "nextn.hnorm",
                 "nextn.shared_head_norm")
    vectors = {k: vector(dev, infos[k], f"{name}.{k}") for k in vec_keys + norm_keys if k in infos}
    return LayerWeights(kind, mix, out, ffn, matrix(dev, infos["ffn_down"]), vectors)


def head_rows(info: TensorInfo, rows: int) -> np.ndarray:
    """The raw bytes of a quantized matrix's first `rows` rows ([rows, row bytes]), read from its memory map."""
    return np.ascontiguousarray(np.asarray(info.data).view(np.uint8).reshape(info.shape[0], -1)[:rows])


def upload_weights(dev: Device, cfg: ModelConfig, tensors: ModelTensors, mtp: bool = False,
                   draft_vocab: int | None = None) -> CudaWeights:
    """Upload a bound model (and its MTP head, if asked for and the file has one, with the head's first draft_vocab
    rows apart when that is fewer than the vocabulary); UnsupportedModelError names a tensor of a type without
    kernels."""
    before = dev.memory.allocated
    g = tensors.global_tensors
    token_embd = matrix(dev, g["token_embd"])
    output = token_embd if g["output"] is g["token_embd"] or g["output"].name == g["token_embd"].name else matrix(
        dev, g["output"])
    layers = [_layer(dev, infos, kind, f"blk.{i}") for i, (kind, infos) in
              enumerate(zip(cfg.layer_kinds, tensors.layers, strict=True))]
    weights = CudaWeights(token_embd, output, vector(dev, g["output_norm"], "output_norm"), layers, 0)
    if mtp and tensors.nextn:
        infos = tensors.nextn[0]
        name = f"blk.{cfg.num_layers}"
        own_head = infos.get("nextn.shared_head_head")  # else the trunk's output head
        weights.mtp = MtpWeights(
            matrix(dev, infos["nextn.eh_proj"]), _layer(dev, infos, "attention", name),
            matrix(dev, infos["nextn.embed_tokens"]) if "nextn.embed_tokens" in infos else token_embd,
            output if own_head is None else matrix(dev, own_head))
        head = own_head or g["output"]  # the drafting head's table (the embedding's where tied)
        if draft_vocab is not None and draft_vocab < head.shape[0]:
            weights.mtp.draft_head = ops.upload_weight(dev, head_rows(head, draft_vocab), head.qtype,
                                                       (draft_vocab, head.shape[1]), f"{head.name}[:{draft_vocab}]")
    weights.nbytes = dev.memory.allocated - before
    return weights
