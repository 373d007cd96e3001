"""Weights in the device layout: each ggml block's fields split into planes (kernels/quants.cuh documents it).

A ggml block interleaves fields of different sizes (Q6_K: 128 + 64 + 16 + 2 = 210 bytes), so few of them sit on
16-byte boundaries. Splitting field f of every block into plane f keeps each field aligned to its own size and lets
a kernel load 16 bytes at a time. The repack is a byte permutation (no arithmetic), done on the host with numpy
strided copies while uploading; unpack_planes inverts it for tests.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

# qtype -> fields in plane order, each (byte offset inside the ggml block, size). Big fields first, so every plane
# starts aligned to 16 bytes, then 4, then 2.
PLANES: dict[Q, tuple[tuple[int, int], ...]] = {
    Q.Q4_0: ((2, 16), (0, 2)),
    Q.Q5_0: ((6, 16), (2, 4), (0, 2)),
    Q.Q8_0: ((2, 32), (0, 2)),
    Q.Q4_K: ((16, 128), (4, 12), (0, 4)),
    Q.Q5_K: ((48, 128), (16, 32), (4, 12), (0, 4)),
    Q.Q6_K: ((0, 128), (128, 64), (192, 16), (208, 2)),
}
PLAIN = (Q.F32, Q.F16)


def block_layout(qtype: Q) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml type."""
    return GGML_QUANT_SIZES[qtype]


def device_nbytes(qtype: Q, shape: tuple[int, int]) -> int:
    """Bytes of a [rows, cols] tensor in the device layout (the same as in the file)."""
    rows, cols = shape
    block, size = block_layout(qtype)
    return rows * (cols // block) * size


def _blocks(data: np.ndarray, qtype: Q, shape: tuple[int, int]) -> np.ndarray:
    """The tensor's raw bytes as [rows * nb, block bytes]."""
    rows, cols = shape
    block, size = block_layout(qtype)
    if cols % block:
        raise ValueError(f"{qtype.name} rows of {cols} values are not whole blocks of {block}")
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.size != rows * (cols // block) * size:
        raise ValueError(f"{qtype.name} {shape}: {raw.size} bytes, expected {rows * (cols // block) * size}")
    return raw.reshape(rows * (cols // block), size)


def planes(data: np.ndarray, qtype: Q, shape: tuple[int, int]) -> list[np.ndarray]:
    """The device layout as a list of contiguous uint8 planes (plain types: one plane, the data itself)."""
    if qtype in PLAIN:
        return [np.ascontiguousarray(data).view(np.uint8).reshape(-1)]
    if qtype not in PLANES:
        raise ValueError(f"no device layout for {qtype.name}")
    blocks = _blocks(data, qtype, shape)
    return [np.ascontiguousarray(blocks[:, off : off + size]).reshape(-1) for off, size in PLANES[qtype]]


def repack(data: np.ndarray, qtype: Q, shape: tuple[int, int]) -> np.ndarray:
    """The device layout as one uint8 array (planes concatenated)."""
    return np.concatenate(planes(data, qtype, shape))


def unpack_planes(packed: np.ndarray, qtype: Q, shape: tuple[int, int]) -> np.ndarray:
    """Inverse of repack: the ggml blocks, uint8 [rows, row bytes]."""
    rows, cols = shape
    if qtype in PLAIN:
        return packed.reshape(rows, -1)
    block, size = block_layout(qtype)
    num_blocks = rows * (cols // block)
    out = np.empty((num_blocks, size), np.uint8)
    pos = 0
    for off, field in PLANES[qtype]:
        out[:, off : off + field] = packed[pos : pos + num_blocks * field].reshape(num_blocks, field)
        pos += num_blocks * field
    assert pos == packed.size, "packed size does not match the layout"
    return out.reshape(rows, -1)


def random_blocks(qtype: Q, shape: tuple[int, int], rng: np.random.Generator, scale: float = 0.01) -> np.ndarray:
    """Valid random ggml data of a [rows, cols] tensor: random quants, small finite f16 scales.

    Scales are drawn positive in [scale/2, scale] (and mins likewise), so every block decodes to finite values
    of realistic size; for F16/F32 the values themselves are drawn.
    """
    rows, cols = shape
    if qtype == Q.F32:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale * 8)
    if qtype == Q.F16:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale * 8)).astype(np.float16)
    block, size = block_layout(qtype)
    blocks = rng.integers(0, 256, size=(rows * (cols // block), size), dtype=np.uint8)
    for off in _f16_fields(qtype):
        values = rng.uniform(scale / 2, scale, size=blocks.shape[0]).astype(np.float16)
        blocks[:, off : off + 2] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _f16_fields(qtype: Q) -> tuple[int, ...]:
    """Byte offsets of the f16 scale fields inside a block."""
    return {Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}[qtype]
