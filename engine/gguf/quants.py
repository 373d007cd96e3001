"""Quant formats: block sizes, dequantize (gguf.quants) and quantize (gguf.quants, or ours for the K-quants).

Storage convention: a quantized tensor of numpy shape (rows, cols) is uint8 [rows, cols // block * type_size]; F32
and F16 are their float arrays; BF16 is uint16 words. dequantize() accepts any of those or the raw uint8 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.gguf.kquants import QK_K, quantize_q4_K, quantize_q5_K, quantize_q6_K

Q = GGMLQuantizationType

# Every type the engine reads, in the order used across the codebase (floats, legacy quants, K-quants).
SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = (
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K,
)
FLOAT_TYPES: tuple[GGMLQuantizationType, ...] = (Q.F32, Q.F16, Q.BF16)
K_QUANT_TYPES: tuple[GGMLQuantizationType, ...] = (Q.Q4_K, Q.Q5_K, Q.Q6_K)

# Our vectorised packers; the legacy types and BF16 quantize through gguf.quants.
_OUR_QUANTIZERS = {Q.Q4_K: quantize_q4_K, Q.Q5_K: quantize_q5_K, Q.Q6_K: quantize_q6_K}
_GGUF_QUANTIZED = (Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)

__all__ = [
    "QK_K", "SUPPORTED_TYPES", "FLOAT_TYPES", "K_QUANT_TYPES", "QuantTypeError", "block_size", "type_size",
    "row_bytes", "dequantize", "dequantize_rows", "quantize", "quantize_q4_K", "quantize_q5_K", "quantize_q6_K",
]


class QuantTypeError(ValueError):
    """A quant type the engine cannot (de)quantize, or a shape that does not fit its blocks."""


def _check_type(qtype: GGMLQuantizationType) -> None:
    if qtype not in SUPPORTED_TYPES:
        names = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise QuantTypeError(f"quant type {qtype.name} is not supported (supported: {names})")


def block_size(qtype: GGMLQuantizationType) -> int:
    """Weights per block (1 for float types, 32 for Q4_0..Q8_0, 256 for K-quants)."""
    return GGML_QUANT_SIZES[qtype][0]


def type_size(qtype: GGMLQuantizationType) -> int:
    """Bytes per block."""
    return GGML_QUANT_SIZES[qtype][1]


def row_bytes(qtype: GGMLQuantizationType, num_cols: int) -> int:
    """Bytes one row of num_cols weights takes; QuantTypeError if num_cols is not a whole number of blocks."""
    size, nbytes = GGML_QUANT_SIZES[qtype]
    if num_cols % size:
        raise QuantTypeError(f"row length {num_cols} is not a multiple of the {qtype.name} block size {size}")
    return num_cols // size * nbytes


def _as_bytes(data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """The stored bytes as uint8 [rows, row_bytes], whatever view of them we were given."""
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    expected = rows * row_bytes(qtype, shape[-1])
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.size != expected:
        raise QuantTypeError(f"{qtype.name} tensor of shape {tuple(shape)} needs {expected} bytes, got {raw.size}")
    return raw.reshape(rows, -1)


def dequantize(data: np.ndarray, qtype: GGMLQuantizationType, shape: Sequence[int]) -> np.ndarray:
    """Stored tensor data -> float32 array of the given numpy shape."""
    _check_type(qtype)
    shape = tuple(int(d) for d in shape)
    raw = _as_bytes(data, qtype, shape)  # raw: [rows, row_bytes]
    if qtype == Q.F32:
        out = raw.view(np.float32).copy()
    elif qtype == Q.F16:
        out = raw.view(np.float16).astype(np.float32)
    elif qtype == Q.BF16:
        # bf16 is the top half of an f32: widen the words and shift them into place
        out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        out = gguf_quants.dequantize(raw, qtype)
    return np.asarray(out, dtype=np.float32).reshape(shape)


def dequantize_rows(data: np.ndarray, qtype: GGMLQuantizationType, shape: Sequence[int],
                    row_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Selected rows of a 2-D tensor (e.g. token_embd lookups) as float32 [len(row_ids), cols]."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 2:
        raise QuantTypeError(f"dequantize_rows needs a 2-D tensor, got shape {shape}")
    ids = np.asarray(row_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= shape[0]):
        raise IndexError(f"row ids must be in [0, {shape[0]}), got {ids.min()}..{ids.max()}")
    raw = _as_bytes(data, qtype, shape)[ids]  # raw: [n, row_bytes]
    return dequantize(raw, qtype, (ids.size, shape[1]))


def quantize(x: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 [rows, cols] -> stored bytes uint8 [rows, row_bytes] in ggml's block layout."""
    _check_type(qtype)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise QuantTypeError(f"quantize needs a 2-D array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise QuantTypeError("quantize got NaN or infinite values")
    row_bytes(qtype, x.shape[1])  # validates the row length
    if qtype == Q.F32:
        return np.ascontiguousarray(x).view(np.uint8)
    if qtype == Q.F16:
        return x.astype(np.float16).view(np.uint8)
    if qtype in _OUR_QUANTIZERS:
        return _OUR_QUANTIZERS[qtype](x)
    assert qtype in _GGUF_QUANTIZED
    out = gguf_quants.quantize(x, qtype)
    return np.ascontiguousarray(out).view(np.uint8).reshape(x.shape[0], -1)
