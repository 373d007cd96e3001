"""The model's weights on the device for the megakernel: every matrix in the device layout (engine/cuda/repack.py,
uploaded by engine.cuda.weights), every vector in f32, and the WeightRef / LayerRefs tables that point at them."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from engine.cuda.megakernel.layout import LV, LW, ModelSpec
from engine.cuda.megakernel.structs import LayerRefs, WeightRef, assign

if TYPE_CHECKING:
    from engine.cuda.device import Buffer, Device
    from engine.cuda.ops import DeviceWeight
    from engine.model.weights import ModelTensors


@dataclass(slots=True)
class DeviceModel:
    """Uploaded weights: matrices by (layer, key) (layer None: top level), vectors likewise."""

    matrices: dict[tuple[int | None, str], DeviceWeight] = field(default_factory=dict)
    vectors: dict[tuple[int | None, str], Buffer] = field(default_factory=dict)
    nbytes: int = 0


def upload_model(dev: Device, spec: ModelSpec, tensors: ModelTensors) -> DeviceModel:
    """Upload what the megakernel reads (UnsupportedModelError names a tensor of a type without kernels)."""
    from engine.cuda.weights import matrix, vector

    before, out = dev.memory.allocated, DeviceModel()
    layers = list(tensors.layers) + (list(tensors.nextn[:1]) if spec.has_mtp else [])
    for i, infos in enumerate(layers):
        for key, info in infos.items():
            if key in LW:
                out.matrices[(i, key)] = matrix(dev, info)
            elif key in LV:
                out.vectors[(i, key)] = vector(dev, info, f"blk.{i}.{key}")
        if i == spec.mtp_layer and "nextn.embed_tokens" in infos:
            out.matrices[(i, "nextn.embed_tokens")] = matrix(dev, infos["nextn.embed_tokens"])
        if i == spec.mtp_layer and "nextn.shared_head_head" in infos:
            out.matrices[(i, "nextn.shared_head_head")] = matrix(dev, infos["nextn.shared_head_head"])
    g = tensors.global_tensors
    out.matrices[(None, "token_embd")] = matrix(dev, g["token_embd"])
    tied = g["output"].name == g["token_embd"].name
    out.matrices[(None, "output")] = out.matrices[(None, "token_embd")] if tied else matrix(dev, g["output"])
    out.vectors[(None, "output_norm")] = vector(dev, g["output_norm"], "output_norm")
    out.nbytes = dev.memory.allocated - before
    return out


def weight_ref(weight: DeviceWeight | None, rows: int | None = None) -> WeightRef:
    """The table entry of a whole matrix (or of its first `rows` rows); a null entry for None."""
    if weight is None:
        return WeightRef()
    return matrix_ref(weight.buf.ptr, int(weight.qtype), weight.rows, weight.cols, rows)


def matrix_ref(ptr: int, qtype: int, rows_total: int, cols: int, rows: int | None = None) -> WeightRef:
    """The WeightRef of rows [0, rows) of a [rows_total, cols] matrix at ptr (MegakernelError if a size does not
    fit its int32 field)."""
    return assign(WeightRef(), ptr=ptr, qtype=qtype, rows_total=rows_total, cols=cols, row_offset=0,
                  rows=rows_total if rows is None else rows)


def layer_tables(spec: ModelSpec, model: DeviceModel, state: dict[str, Buffer]) -> ctypes.Array:
    """LayerRefs of every layer slot (the MTP block last): its matrices, vectors and state buffers."""
    from engine.cuda.megakernel.layout import LS

    table = (LayerRefs * spec.num_layer_slots)()
    for i in range(spec.num_layer_slots):
        refs = table[i]
        for slot, key in enumerate(LW):
            refs.w[slot] = weight_ref(model.matrices.get((i, key)))
        for slot, key in enumerate(LV):
            vec = model.vectors.get((i, key))
            if key == "nextn.shared_head_norm" and vec is None and i == spec.mtp_layer:
                vec = model.vectors[(None, "output_norm")]  # llama.cpp's fallback
            refs.v[slot] = 0 if vec is None else vec.ptr
        for slot, key in enumerate(LS):
            buf = state.get(f"blk.{i}.{key}")
            refs.s[slot] = 0 if buf is None else buf.ptr
    return table


def qtype_mask(spec: ModelSpec) -> int:
    """Bit per ggml type id of every matrix the megakernel multiplies (build.py compiles only those)."""
    mask = 0
    for (_, key), info in spec.matrices.items():
        if key != "token_embd" and key != "nextn.embed_tokens":
            mask |= 1 << info.qtype
    return mask


def rope_inv_freq(spec: ModelSpec) -> np.ndarray:
    """theta^(-2i / rope_dim) in float64, as engine.reference.ops.rope_angles forms it."""
    cfg = spec.cfg
    return float(cfg.rope_theta) ** (-np.arange(0, cfg.rope_dim, 2, dtype=np.float64) / cfg.rope_dim)
