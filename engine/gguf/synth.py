"""Random weights written directly as valid quant blocks: random quant bits, small positive f16 scales chosen so the
decoded values have mean ~0 and a requested standard deviation. Far faster than quantizing random floats, which is
what makes a full-size random model cheap to write.

Each type gets a pool of block headers (scales, mins); every block takes random bytes for its quant bits and one
header from the pool, so no per-block arithmetic runs beyond a gather.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from engine.gguf.kquants import pack_scales_k4
from engine.gguf.quants import quantize, row_bytes, type_size

Q = GGMLQuantizationType
POOL_SIZE = 256
# Standard deviation of the integer level of a uniform b-bit quant: sqrt((2^(2b) - 1) / 12).
_LEVEL_STD = {4: np.sqrt(255 / 12), 5: np.sqrt(1023 / 12), 6: np.sqrt(4095 / 12), 8: np.sqrt(65535 / 12)}
SUB_SCALE_RANGE = (20, 44)  # 6-bit sub-block scales drawn from here (well inside 0..63)
# Where each type keeps the header we fill in: (first byte, end byte) within its block.
HEADER_SPANS = {
    Q.Q4_0: (0, 2), Q.Q4_1: (0, 4), Q.Q5_0: (0, 2), Q.Q5_1: (0, 4), Q.Q8_0: (0, 2),
    Q.Q4_K: (0, 16), Q.Q5_K: (0, 16), Q.Q6_K: (192, 210),
}
# The f16 scale fields (d, and dmin / m where present) inside each block: rescaling them rescales the block.
SCALE_SPANS = {
    Q.Q4_0: (0, 2), Q.Q4_1: (0, 4), Q.Q5_0: (0, 2), Q.Q5_1: (0, 4), Q.Q8_0: (0, 2),
    Q.Q4_K: (0, 4), Q.Q5_K: (0, 4), Q.Q6_K: (208, 210),
}
SYNTH_TYPES = tuple(HEADER_SPANS) + (Q.F32, Q.F16, Q.BF16)


def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float16).reshape(-1, 1).view(np.uint8)  # [P, 2]


def _k_affine_pool(bits: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Q4_K / Q5_K headers: d, dmin, 12 scale bytes with dmin*m = mid-level * d*sc so each sub-block has mean ~0."""
    lo, hi = SUB_SCALE_RANGE
    sc = rng.integers(lo, hi + 1, size=(POOL_SIZE, 8))
    jitter = rng.uniform(0.8, 1.2, size=POOL_SIZE)  # blocks differ in scale as in a real file
    d = (std * jitter / (_LEVEL_STD[bits] * np.sqrt(np.mean(sc.astype(np.float64) ** 2)))).astype(np.float16)
    mid = (2 ** bits - 1) / 2
    dmin = (d.astype(np.float64) * mid * hi / 63).astype(np.float16)
    m = np.clip(np.rint(mid * sc * d.astype(np.float64)[:, None] / dmin.astype(np.float64)[:, None]), 0, 63)
    return np.concatenate([_f16(d), _f16(dmin), pack_scales_k4(sc, m)], axis=1)


def _q6_K_pool(std: float, rng: np.random.Generator) -> np.ndarray:
    """Q6_K headers: 16 int8 scales of random sign (so the -0.5 level offset averages out) and f16 d."""
    lo, hi = SUB_SCALE_RANGE
    sc = rng.integers(lo, hi + 1, size=(POOL_SIZE, 16)) * rng.choice([-1, 1], size=(POOL_SIZE, 16))
    jitter = rng.uniform(0.8, 1.2, size=POOL_SIZE)
    d = (std * jitter / (_LEVEL_STD[6] * np.sqrt(np.mean(sc.astype(np.float64) ** 2)))).astype(np.float16)
    return np.concatenate([sc.astype(np.int8).view(np.uint8), _f16(d)], axis=1)


def _legacy_pool(qtype: GGMLQuantizationType, std: float, rng: np.random.Generator) -> np.ndarray:
    """Q4_0 / Q5_0 / Q8_0 (d of random sign: their levels are centred half a step low) and Q4_1 / Q5_1 (d and
    m = -mid * d) headers."""
    bits = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q8_0: 8}[qtype]
    d = std * rng.uniform(0.8, 1.2, size=POOL_SIZE) / _LEVEL_STD[bits]
    if qtype in (Q.Q4_1, Q.Q5_1):
        return np.concatenate([_f16(d), _f16(-d.astype(np.float16).astype(np.float64) * (2 ** bits - 1) / 2)], axis=1)
    return _f16(d * rng.choice([-1.0, 1.0], size=POOL_SIZE))


def header_pool(qtype: GGMLQuantizationType, std: float, rng: np.random.Generator) -> np.ndarray:
    """POOL_SIZE candidate headers for qtype blocks decoding to values of about the given std: uint8 [P, span]."""
    if qtype in (Q.Q4_K, Q.Q5_K):
        return _k_affine_pool(4 if qtype == Q.Q4_K else 5, std, rng)
    if qtype == Q.Q6_K:
        return _q6_K_pool(std, rng)
    return _legacy_pool(qtype, std, rng)


def _random_bytes(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    words = rng.integers(0, np.iinfo(np.uint64).max, size=(nbytes + 7) // 8, dtype=np.uint64, endpoint=True)
    return words.view(np.uint8)[:nbytes]


def fill_blocks(qtype: GGMLQuantizationType, pool: np.ndarray, num_rows: int, num_cols: int,
                rng: np.random.Generator) -> np.ndarray:
    """num_rows rows of random valid qtype blocks using headers from pool: uint8 [rows, row_bytes]."""
    nbytes_row = row_bytes(qtype, num_cols)
    out = _random_bytes(rng, num_rows * nbytes_row)
    blocks = out.reshape(-1, type_size(qtype))  # blocks: [N, type_size]
    start, end = HEADER_SPANS[qtype]
    blocks[:, start:end] = pool[rng.integers(0, pool.shape[0], size=blocks.shape[0])]
    return out.reshape(num_rows, nbytes_row)


def scale_rows(qtype: GGMLQuantizationType, data: np.ndarray, factors: np.ndarray) -> None:
    """Multiplies each row's decoded values by factors[row] in place, by rescaling the blocks' f16 scale fields."""
    blocks = data.reshape(data.shape[0], -1, type_size(qtype))  # blocks: [rows, blocks_per_row, type_size]
    start, end = SCALE_SPANS[qtype]
    fields = np.ascontiguousarray(blocks[:, :, start:end]).view(np.float16)
    scaled = (fields.astype(np.float32) * factors.astype(np.float32)[:, None, None]).astype(np.float16)
    blocks[:, :, start:end] = scaled.view(np.uint8)


def random_tensor(qtype: GGMLQuantizationType, shape: tuple[int, ...], std: float, rng: np.random.Generator,
                  pool: np.ndarray | None = None) -> np.ndarray:
    """Random stored data for a tensor of numpy shape: uint8 [rows, row_bytes] (floats as their raw bytes)."""
    num_cols = shape[-1]
    num_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    if qtype in (Q.F32, Q.F16, Q.BF16):
        values = rng.standard_normal((num_rows, num_cols), dtype=np.float32) * np.float32(std)
        return quantize(values, qtype)
    if qtype not in HEADER_SPANS:
        raise ValueError(f"cannot synthesize {qtype.name} blocks (supported: {[t.name for t in SYNTH_TYPES]})")
    if pool is None:
        pool = header_pool(qtype, std, rng)
    return fill_blocks(qtype, pool, num_rows, num_cols, rng)
