"""The device weight layout (engine/cuda/repack.py): lossless, aligned, and Q6_K regrouped as the kernels read it."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import repack
from engine.gguf.quants import dequantize

TYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16, Q.F32)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_repack_is_lossless(qtype: Q) -> None:
    rng = np.random.default_rng(int(qtype))
    shape = (24, 768)  # 1.5 tiles of 16 rows
    data = repack.random_blocks(qtype, shape, rng)
    packed = repack.repack(data, qtype, shape)
    assert packed.dtype == np.uint8 and packed.nbytes == repack.device_nbytes(qtype, shape)
    if qtype not in repack.TILE_WORDS:
        assert packed.nbytes == np.ascontiguousarray(data).nbytes
    back = repack.unpack_planes(packed, qtype, shape)
    np.testing.assert_array_equal(back.view(np.uint8).reshape(-1), np.ascontiguousarray(data).view(np.uint8).reshape(-1))
    assert np.isfinite(dequantize(data, qtype, shape)).all()


@pytest.mark.parametrize("qtype", [q for q in TYPES if q in repack.PLANES], ids=lambda q: q.name)
def test_planes_start_aligned_to_their_fields(qtype: Q) -> None:
    """Plane p starts at rows * nb * (sizes before it): a multiple of 16 for 16-byte fields, 4 for words."""
    fields = repack.PLANES[qtype] + repack.TILE_WORDS.get(qtype, ())
    block, size = repack.block_layout(qtype)
    assert sum(f for _, f in fields) == size
    assert sorted(o for o, _ in fields) == sorted({o for o, _ in fields})  # no field twice
    covered = sorted((o, o + f) for o, f in fields)
    assert covered[0][0] == 0 and all(a[1] == b[0] for a, b in zip(covered, covered[1:])) and covered[-1][1] == size
    start = 0
    for _, width in fields:
        need = 16 if width % 16 == 0 else 4 if width % 4 == 0 else 2
        assert start % need == 0, f"{qtype.name}: plane of {width}-byte fields starts at {start} per block"
        start += width


@pytest.mark.parametrize("qtype", list(repack.TILE_WORDS), ids=lambda q: q.name)
def test_tiled_words_sit_where_the_kernels_read_them(qtype: Q) -> None:
    """kernels/quants.cuh tile_scales / tile_dm: row r's 12 scale bytes of superblock sb at byte 12 (r % 16) of unit
    (r / 16) nb + sb, its d and dmin at 192 + 4 (r % 16); the rows that pad the last tile are zeros."""
    rng = np.random.default_rng(3)
    rows, nb = 21, 3
    _, size = repack.block_layout(qtype)
    blocks = np.ascontiguousarray(repack.random_blocks(qtype, (rows, 256 * nb), rng)).reshape(rows, nb, size)
    packed = repack.repack(blocks.reshape(rows, -1), qtype, (rows, 256 * nb))
    row_major = rows * nb * sum(f for _, f in repack.PLANES[qtype])
    units = packed[row_major:].reshape(-1, nb, repack.TILE_UNIT)
    assert units.shape[0] == 2
    for r in range(32):
        for sb in range(nb):
            unit, lr = units[r // 16, sb], r % 16
            scales, dm = unit[12 * lr : 12 * lr + 12], unit[192 + 4 * lr : 196 + 4 * lr]
            if r < rows:
                np.testing.assert_array_equal(scales, blocks[r, sb, 4:16])
                np.testing.assert_array_equal(dm, blocks[r, sb, 0:4])
            else:
                assert not scales.any() and not dm.any()


def test_q6k_regroup_puts_positions_where_the_kernel_reads_them() -> None:
    """Chunk c byte l: low nibble = position 64c + l, high = 64c + 32 + l; qh' bit pairs of 64c + {l, 32+l,
    16+l, 48+l} (l < 16), exactly as kernels/quants.cuh and dequant_one<Q6_K> decode them."""
    rng = np.random.default_rng(7)
    blocks = np.ascontiguousarray(repack.random_blocks(Q.Q6_K, (8, 512), rng)).reshape(-1, 210)
    values = repack._q6k_values(blocks)  # ggml order
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)
    ref = dequantize(blocks.reshape(8, -1), Q.Q6_K, (8, 512)).reshape(-1, 256)
    np.testing.assert_allclose(d * np.repeat(scales, 16, axis=1) * (values - 32.0), ref, rtol=1e-6, atol=1e-7)
    out = repack.q6k_regroup(blocks)
    ql, qh = out[:, :128].reshape(-1, 4, 32), out[:, 128:192].reshape(-1, 4, 16)
    for c in range(4):
        for l in range(32):
            quarter_shift = 4 * (l >= 16)
            low = (ql[:, c, l] & 0xF) | (((qh[:, c, l % 16] >> quarter_shift) & 3) << 4)
            high = (ql[:, c, l] >> 4) | (((qh[:, c, l % 16] >> (quarter_shift + 2)) & 3) << 4)
            np.testing.assert_array_equal(low, values[:, 64 * c + l])
            np.testing.assert_array_equal(high, values[:, 64 * c + 32 + l])
    np.testing.assert_array_equal(out[:, 192:], blocks[:, 192:])  # scales and d untouched


def test_bad_shapes_are_refused_with_the_type_named() -> None:
    with pytest.raises(ValueError, match="Q4_K"):
        repack.planes(np.zeros((4, 144), np.uint8), Q.Q4_K, (4, 200))
    with pytest.raises(ValueError, match="Q4_1"):
        repack.planes(np.zeros(10, np.uint8), Q.Q4_1, (1, 32))
