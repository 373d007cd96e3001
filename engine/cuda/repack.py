"""Weights in the device layout: each ggml block's fields split into planes (kernels/quants.cuh documents it).

A ggml block interleaves fields of different sizes (Q6_K: 128 + 64 + 16 + 2 = 210 bytes), so few of them sit on
16-byte boundaries. Splitting field f of every block into plane f keeps each field aligned to its own size and lets
a kernel load 16 bytes at a time. Q6_K's quants are also regrouped so that byte l of 32-byte chunk c holds the
positions 64c + l and 64c + 32 + l, as in Q4_K: every type then gives lane c of a warp the same 64 positions.
Q4_K and Q5_K keep their small per-block fields (the 12 sub-block scale bytes, the f16 d and dmin) in one last
plane gathered by tiles of 16 rows (TILE_WORDS), because the matmuls stage 16 rows of a superblock at a time: the
16 rows' words are then 256 contiguous bytes, 16 sixteen-byte copies, where the row-major planes needed 64
four-byte copies from 32 cache lines (bench/NOTES.md v15: those copies were 44 % of the L2 sectors of the
one-token matmul).

The repack is lossless (bit permutations only), done on the host with numpy while uploading; unpack_planes
inverts it for tests.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

# qtype -> the row-major planes' fields in plane order, each (byte offset inside the ggml block, size). Big fields
# first, so every plane starts aligned to 16 bytes, then 4, then 2.
PLANES: dict[Q, tuple[tuple[int, int], ...]] = {
    Q.Q4_0: ((2, 16), (0, 2)),
    Q.Q5_0: ((6, 16), (2, 4), (0, 2)),
    Q.Q8_0: ((2, 32), (0, 2)),
    Q.Q4_K: ((16, 128),),
    Q.Q5_K: ((48, 128), (16, 32)),
    Q.Q6_K: ((0, 128), (128, 64), (192, 16), (208, 2)),
}
# qtype -> the fields of its tiled plane, after the row-major ones: for tile t (rows 16t .. 16t + 15, the rows
# padded with zero words to whole tiles) and superblock sb, unit t * nb + sb of TILE_UNIT bytes holds the 16 rows'
# first field (12 bytes each), then their second (4): kernels/quants.cuh tile_unit reads it.
TILE_ROWS = 16
TILE_WORDS: dict[Q, tuple[tuple[int, int], ...]] = {Q.Q4_K: ((4, 12), (0, 4)), Q.Q5_K: ((4, 12), (0, 4))}
TILE_UNIT = 256
PLAIN = (Q.F32, Q.F16)


def block_layout(qtype: Q) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml type."""
    return GGML_QUANT_SIZES[qtype]


def device_nbytes(qtype: Q, shape: tuple[int, int]) -> int:
    """Bytes of a [rows, cols] tensor in the device layout (as in the file, plus the tiled plane's padding)."""
    rows, cols = shape
    block, size = block_layout(qtype)
    if qtype not in TILE_WORDS:
        return rows * (cols // block) * size
    nb = cols // block
    return rows * nb * sum(f for _, f in PLANES[qtype]) + _tiles(rows) * nb * TILE_UNIT


def _tiles(rows: int) -> int:
    return -(-rows // TILE_ROWS)


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


Q6K_CHUNK = 1 << 16  # blocks regrouped per numpy pass (bounds the temporary memory to ~20 MB)


def q6k_regroup(blocks: np.ndarray) -> np.ndarray:
    """Q6_K blocks [N, 210] -> the same blocks with ql/qh in the device order (scales and d unchanged)."""
    out = blocks.copy()
    for lo in range(0, blocks.shape[0], Q6K_CHUNK):
        part = blocks[lo : lo + Q6K_CHUNK]
        q = _q6k_values(part)  # [n, 256] values 0..63
        q4 = q.reshape(-1, 4, 2, 32)  # [n, chunk c, half (low/high nibble), l]
        out[lo : lo + Q6K_CHUNK, 0:128] = ((q4[:, :, 0] & 0xF) | ((q4[:, :, 1] & 0xF) << 4)).reshape(-1, 128)
        hi = (q >> 4).reshape(-1, 4, 4, 16)  # [n, c, quarter m (positions 64c + 16m + l), l]
        qh = hi[:, :, 0] | (hi[:, :, 2] << 2) | (hi[:, :, 1] << 4) | (hi[:, :, 3] << 6)
        out[lo : lo + Q6K_CHUNK, 128:192] = qh.reshape(-1, 64)
    return out


def q6k_ungroup(blocks: np.ndarray) -> np.ndarray:
    """Inverse of q6k_regroup."""
    out = blocks.copy()
    for lo in range(0, blocks.shape[0], Q6K_CHUNK):
        part = blocks[lo : lo + Q6K_CHUNK]
        ql = part[:, 0:128].reshape(-1, 4, 32)
        qh = part[:, 128:192].reshape(-1, 4, 16)
        low = np.stack([ql & 0xF, ql >> 4], axis=2).reshape(-1, 4, 2, 32)  # [n, c, half, l] -> 64c + 32 half + l
        hi = np.stack([qh & 3, (qh >> 4) & 3, (qh >> 2) & 3, (qh >> 6) & 3], axis=2)  # [n, c, m, l]
        q = low.reshape(-1, 256) | (hi.reshape(-1, 256) << 4)
        out[lo : lo + Q6K_CHUNK, 0:192] = _q6k_encode(q)
    return out


def _q6k_values(blocks: np.ndarray) -> np.ndarray:
    """The 256 six-bit values of each ggml Q6_K block, uint8 [n, 256] (ggml's order)."""
    ql = blocks[:, 0:128].reshape(-1, 2, 2, 32)  # [n, half n, part (l or l + 32), l]
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)
    low = np.concatenate([ql & 0xF, ql >> 4], axis=2)  # [n, half, 4: +0, +32, +64, +96, l]
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (low | (((qh >> shifts) & 3) << 4)).reshape(-1, 256)


def _q6k_encode(q: np.ndarray) -> np.ndarray:
    """ggml's ql (128) and qh (64) bytes of [n, 256] six-bit values."""
    v = q.reshape(-1, 2, 4, 32)  # [n, half, quarter (+0, +32, +64, +96), l]
    ql = np.concatenate([(v[:, :, 0] & 0xF) | ((v[:, :, 2] & 0xF) << 4),
                         (v[:, :, 1] & 0xF) | ((v[:, :, 3] & 0xF) << 4)], axis=2)  # [n, half, 64]
    hi = v >> 4
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)  # [n, half, 32]
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64)], axis=1)


def planes(data: np.ndarray, qtype: Q, shape: tuple[int, int]) -> list[np.ndarray]:
    """The device layout as a list of contiguous uint8 planes (plain types: one plane, the data itself)."""
    if qtype in PLAIN:
        return [np.ascontiguousarray(data).view(np.uint8).reshape(-1)]
    if qtype not in PLANES:
        raise ValueError(f"no device layout for {qtype.name}")
    blocks = _blocks(data, qtype, shape)
    if qtype == Q.Q6_K:
        blocks = q6k_regroup(blocks)
    out = [np.ascontiguousarray(blocks[:, off : off + size]).reshape(-1) for off, size in PLANES[qtype]]
    if qtype in TILE_WORDS:
        out.append(_tile_words(blocks, qtype, shape))
    return out


def _tile_words(blocks: np.ndarray, qtype: Q, shape: tuple[int, int]) -> np.ndarray:
    """The tiled plane (TILE_WORDS) of blocks [rows * nb, size]: [tiles][nb][field f of 16 rows, for each f]."""
    rows, cols = shape
    nb, tiles = cols // block_layout(qtype)[0], _tiles(rows)
    fields = []
    for off, size in TILE_WORDS[qtype]:
        f = np.zeros((tiles * TILE_ROWS, nb, size), np.uint8)
        f[:rows] = blocks[:, off : off + size].reshape(rows, nb, size)
        fields.append(f.reshape(tiles, TILE_ROWS, nb, size).transpose(0, 2, 1, 3).reshape(tiles, nb, TILE_ROWS * size))
    return np.ascontiguousarray(np.concatenate(fields, axis=2)).reshape(-1)


def repack(data: np.ndarray, qtype: Q, shape: tuple[int, int]) -> np.ndarray:
    """The device layout as one uint8 array (planes concatenated)."""
    return np.concatenate(planes(data, qtype, shape))


def unpack_planes(packed: np.ndarray, qtype: Q, shape: tuple[int, int]) -> np.ndarray:
    """Inverse of repack: the ggml blocks, uint8 [rows, row bytes]."""
    rows, cols = shape
    if qtype in PLAIN:
        return packed.reshape(rows, -1)
    block, size = block_layout(qtype)
    nb = cols // block
    num_blocks = rows * nb
    out = np.empty((num_blocks, size), np.uint8)
    pos = 0
    for off, field in PLANES[qtype]:
        out[:, off : off + field] = packed[pos : pos + num_blocks * field].reshape(num_blocks, field)
        pos += num_blocks * field
    if qtype in TILE_WORDS:
        units = packed[pos:].reshape(_tiles(rows), nb, TILE_UNIT)
        at = 0
        for off, field in TILE_WORDS[qtype]:
            part = units[:, :, at : at + TILE_ROWS * field].reshape(-1, nb, TILE_ROWS, field)
            out[:, off : off + field] = part.transpose(0, 2, 1, 3).reshape(-1, nb * field)[:rows].reshape(-1, field)
            at += TILE_ROWS * field
        pos += units.size
    assert pos == packed.size, "packed size does not match the layout"
    if qtype == Q.Q6_K:
        out = q6k_ungroup(out)
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
