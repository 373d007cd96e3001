"""Host-side conversion between the VM's float32 buffers and the device's formats: the act layout of
kernels/mmvq.cu (f16 hi and lo parts in fragment order, f16 hi + lo sums of each 32-position sub-block), its int8
copy (kernels/mmvq_i8.cu's act8 layout) and f16 KV caches. The diff harness decodes device buffers with these; the
runner encodes the VM's state to start both from the same point."""

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


def act8_nbytes(width: int) -> tuple[int, int, int]:
    """(bytes of q8, of scale8, of each sums part) of an act buffer's int8 copy (one group of 8 rows)."""
    nsb = -(-width // SUPERBLOCK)
    return nsb * 4096, nsb * 64, nsb * 128


def act8_encode(values: np.ndarray, width: int) -> tuple[np.ndarray, ...]:
    """The int8 copy (q8 as uint8, scale8 float32, sums8 and sums8_lo as uint16 bit patterns) of float32 rows
    [rows <= 8, width], as mk_common.cuh act8_store writes it (of what the act's f16 pair holds): per row and
    superblock the two levels of kernels/act8.cuh (s = max|v| / 127, q_hi = rint(v / s), q_lo = rint((v - s q_hi)
    / s_lo), s_lo = s / 254), position p at byte 64 (p / 64) + 16 (p % 32 / 8) + 8 (p / 32 % 2) + p % 8 of
    [sb][level][row][256]; each sub-block's sum of s q_hi + s_lo q_lo as an f16 hi + lo pair."""
    nsb = -(-width // SUPERBLOCK)
    full = np.zeros((MAX_ROWS, nsb, SUPERBLOCK), np.float32)
    full.reshape(MAX_ROWS, -1)[: values.shape[0], :width] = values[:, :width]
    mx = np.abs(full).max(axis=2, keepdims=True)
    live = mx >= np.float32(1e-30)
    s = np.where(live, mx / np.float32(127), np.float32(0)).astype(np.float32)
    s_lo = (s / np.float32(254)).astype(np.float32)
    inv = np.where(live, np.float32(127) / np.where(live, mx, 1), 0).astype(np.float32)  # no division by zero
    inv_lo = np.where(live, np.float32(254) / np.where(live, s, 1), 0).astype(np.float32)
    qh = np.clip(np.rint(full * inv), -127, 127).astype(np.float32)
    rest = (full.astype(np.float64) - qh.astype(np.float64) * s).astype(np.float32)  # fmaf(-qh, s, v)
    ql = np.clip(np.rint(rest * inv_lo), -127, 127).astype(np.float32)
    seen = (ql.astype(np.float64) * s_lo + qh.astype(np.float64) * s).astype(np.float32)  # fmaf(ql, s_lo, qh s)
    p = np.arange(SUPERBLOCK)
    place = 64 * (p >> 6) + 16 * ((p & 31) >> 3) + 8 * ((p >> 5) & 1) + (p & 7)
    q8 = np.zeros((nsb, 2, MAX_ROWS, SUPERBLOCK), np.int8)
    q8[:, 0][:, :, place] = qh.astype(np.int8).transpose(1, 0, 2)
    q8[:, 1][:, :, place] = ql.astype(np.int8).transpose(1, 0, 2)
    scale8 = np.stack([s[..., 0], s_lo[..., 0]]).transpose(2, 0, 1)  # [nsb, level, row]
    sub = seen.reshape(MAX_ROWS, nsb, 8, 32).sum(axis=3, dtype=np.float32).transpose(1, 0, 2)  # [nsb, row, j]
    sums8 = sub.astype(np.float16)
    sums8_lo = (sub - sums8.astype(np.float32)).astype(np.float16)
    return (q8.ravel().view(np.uint8), np.ascontiguousarray(scale8, np.float32).ravel(),
            sums8.ravel().view(np.uint16), sums8_lo.ravel().view(np.uint16))


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
