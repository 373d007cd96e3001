"""Host-side conversion between the VM's float32 buffers and the device's formats: the act layout of
kernels/mmvq.cu (f16 hi and lo parts in fragment order, f16 hi + lo sums of each 32-position sub-block) and f16 KV
caches. The diff harness decodes device buffers with these; the runner encodes the VM's state to start both from
the same point."""

from __future__ import annotations

import numpy as np

from engine.cuda.megakernel.layout import MAX_ROWS, SUPERBLOCK


def act_nbytes(width: int) -> tuple[int, int]:
    """(bytes of the x16 part, bytes of the sums part) of one act buffer of MAX_ROWS (one group of 8) rows."""
    nsb = -(-width // SUPERBLOCK)
    return nsb * 4096, nsb * 128


def act_index(width: int) -> np.ndarray:
    """Element index in the x16 part of position k of row n: [MAX_ROWS, nsb * 256] (act_offset in mk_common.cuh)."""
    nsb = -(-width // SUPERBLOCK)
    k = np.arange(nsb * SUPERBLOCK)
    sb, kl = k >> 8, k & 255
    c, h, i, r = kl >> 6, (kl >> 5) & 1, (kl >> 2) & 7, kl & 3
    n = np.arange(MAX_ROWS)[:, None]
    return ((sb * 16 + 2 * i + h)[None, :] * 8 + n) * 16 + (4 * c + r)[None, :]


def act_encode(values: np.ndarray, width: int) -> tuple[np.ndarray, ...]:
    """(x16, sums, x16_lo, sums_lo) as uint16 bit patterns of float32 rows [rows <= 8, width] (zeros elsewhere)."""
    nsb = -(-width // SUPERBLOCK)
    full = np.zeros((MAX_ROWS, nsb * SUPERBLOCK), np.float32)
    full[: values.shape[0], :width] = values[:, :width]
    hi = full.astype(np.float16)
    lo = (full - hi.astype(np.float32)).astype(np.float16)
    index = act_index(width)
    x16, x16_lo = np.zeros(index.size, np.float16), np.zeros(index.size, np.float16)
    x16[index.ravel()] = hi.ravel()
    x16_lo[index.ravel()] = lo.ravel()
    seen = (hi.astype(np.float32) + lo.astype(np.float32)).reshape(MAX_ROWS, nsb, 8, 32).sum(axis=3, dtype=np.float32)
    sums = seen.transpose(1, 0, 2).astype(np.float16)  # [nsb, n, j]: (sb * 8 + n) * 8 + j
    sums_lo = (seen.transpose(1, 0, 2) - sums.astype(np.float32)).astype(np.float16)
    return tuple(a.ravel().view(np.uint16) for a in (x16, sums, x16_lo, sums_lo))


def act_decode(x16: np.ndarray, x16_lo: np.ndarray, rows: int, width: int) -> np.ndarray:
    """float32 [rows, width] from the hi and lo parts (uint16 or float16 arrays of the x16 layout)."""
    index = act_index(width)[:rows, :width]
    hi = np.asarray(x16).view(np.float16).astype(np.float32)
    lo = np.asarray(x16_lo).view(np.float16).astype(np.float32)
    return hi[index] + lo[index]


def act_sums_decode(sums: np.ndarray, sums_lo: np.ndarray, rows: int, width: int) -> np.ndarray:
    """The sub-block sums [rows, nsb * 8] the device stored (hi + lo)."""
    nsb = -(-width // SUPERBLOCK)
    hi = np.asarray(sums).view(np.float16).astype(np.float32).reshape(nsb, 8, 8)
    lo = np.asarray(sums_lo).view(np.float16).astype(np.float32).reshape(nsb, 8, 8)
    return (hi + lo).transpose(1, 0, 2).reshape(8, nsb * 8)[:rows]
