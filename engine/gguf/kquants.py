"""Our K-quant packers (Q4_K, Q5_K, Q6_K): vectorised numpy over all blocks at once, ggml's exact block layout.

Scale search follows the idea of ggml's reference quantizer (try a few candidate scales per sub-block, refit scale
and min by weighted least squares, keep the best), written for whole arrays rather than one block at a time.
Layouts (QK_K = 256 weights per super-block):
  Q4_K 144 B: f16 d, f16 dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128]; y = d*sc*q - dmin*m
  Q5_K 176 B: f16 d, f16 dmin, scales[12], qh[32] (5th bits), qs[128]
  Q6_K 210 B: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16 weights), f16 d; y = d*sc*(q-32)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

QK_K = 256
# Super-blocks processed per chunk: bounds the temporaries to a few MB whatever the tensor size.
CHUNK_BLOCKS = 2048


def _chunked(x: np.ndarray, block_bytes: int, pack: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Applies pack to [n, 256] chunks of x's super-blocks and returns uint8 [rows, row_bytes]."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK_K:
        raise ValueError(f"K-quants need a 2-D array with rows a multiple of {QK_K}, got shape {x.shape}")
    blocks = x.reshape(-1, QK_K)  # blocks: [N, 256]
    out = np.empty((blocks.shape[0], block_bytes), dtype=np.uint8)
    for start in range(0, blocks.shape[0], CHUNK_BLOCKS):
        out[start:start + CHUNK_BLOCKS] = pack(blocks[start:start + CHUNK_BLOCKS])
    return out.reshape(x.shape[0], -1)


def _fit_affine(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sub-block (scale, min >= 0) so that x ~ scale*L - min with L in [0, nmax]; x: [S, n] -> ([S], [S])."""
    # Weights favour large-magnitude values, as in ggml: w = rms(x) + |x|.
    w = np.sqrt(np.mean(x * x, axis=1, keepdims=True)) + np.abs(x)  # w: [S, n]
    lo = np.minimum(x.min(axis=1), 0.0)  # the min term can only subtract
    span = x.max(axis=1) - lo
    safe_span = np.where(span > 0, span, 1.0)
    sum_w, sum_x = w.sum(axis=1), (w * x).sum(axis=1)
    best_scale = np.where(span > 0, span / nmax, 0.0)
    best_lo = lo
    best_err = _affine_error(x, w, best_scale, best_lo, nmax, lo, nmax / safe_span)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * step + nmax) / safe_span
        levels = np.clip(np.rint(iscale[:, None] * (x - lo[:, None])), 0, nmax)  # levels: [S, n]
        sum_l, sum_l2, sum_xl = (w * levels).sum(1), (w * levels * levels).sum(1), (w * levels * x).sum(1)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        safe_det = np.where(ok, det, 1.0)
        scale = (sum_w * sum_xl - sum_x * sum_l) / safe_det
        offset = (sum_l2 * sum_x - sum_l * sum_xl) / safe_det
        # A positive offset cannot be stored (mins are subtracted): refit the scale alone through zero.
        clamp = offset > 0
        scale = np.where(clamp, sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0), scale)
        offset = np.where(clamp, 0.0, offset)
        err = (w * (scale[:, None] * levels + offset[:, None] - x) ** 2).sum(axis=1)
        better = ok & (span > 0) & (err < best_err)
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_lo = np.where(better, offset, best_lo)
    return best_scale.astype(np.float32), (-best_lo).astype(np.float32)


def _affine_error(x: np.ndarray, w: np.ndarray, scale: np.ndarray, lo: np.ndarray, nmax: int, base: np.ndarray,
                  iscale: np.ndarray) -> np.ndarray:
    """Weighted squared error of x ~ scale*L + lo with L rounded on the grid iscale*(x - base); per sub-block."""
    levels = np.clip(np.rint(iscale[:, None] * (x - base[:, None])), 0, nmax)
    return (w * (scale[:, None] * levels + lo[:, None] - x) ** 2).sum(axis=1)


def pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins -> the 12-byte K-quant scales field; ls, lm: [N, 8] -> [N, 12]."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    out = np.empty((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)  # top 2 bits of scales 4..7 ride on bytes 0..3
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)  # top 2 bits of mins 4..7 ride on bytes 4..7
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return out


def _super_scales(scales: np.ndarray, mins: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Quantizes per-sub-block scales/mins [N, 8] to 6 bits under f16 super-scales d, dmin."""
    max_scale, max_min = scales.max(axis=1), mins.max(axis=1)
    d = (max_scale / 63).astype(np.float16)
    dmin = (max_min / 63).astype(np.float16)
    inv_scale = np.where(max_scale > 0, 63 / np.where(max_scale > 0, max_scale, 1), 0)
    inv_min = np.where(max_min > 0, 63 / np.where(max_min > 0, max_min, 1), 0)
    ls = np.minimum(63, np.rint(inv_scale[:, None] * scales)).astype(np.uint8)
    lm = np.minimum(63, np.rint(inv_min[:, None] * mins)).astype(np.uint8)
    return d, dmin, ls, lm


def _affine_levels(blocks: np.ndarray, d: np.ndarray, dmin: np.ndarray, ls: np.ndarray, lm: np.ndarray,
                   nmax: int) -> np.ndarray:
    """Final integer levels [N, 256] against the stored (rounded) scales, so decode error is what we minimised."""
    step = d.astype(np.float32)[:, None] * ls  # step: [N, 8]
    shift = dmin.astype(np.float32)[:, None] * lm
    x = blocks.reshape(-1, 8, 32)
    safe = np.where(step > 0, step, 1.0)
    levels = np.clip(np.rint((x + shift[:, :, None]) / safe[:, :, None]), 0, nmax)
    levels = np.where(step[:, :, None] > 0, levels, 0)
    return levels.astype(np.uint8).reshape(-1, QK_K)


def _pack_q4_K(blocks: np.ndarray) -> np.ndarray:
    num = blocks.shape[0]
    scales, mins = _fit_affine(blocks.reshape(-1, 32), 15, -1.0, 0.1, 20)
    d, dmin, ls, lm = _super_scales(scales.reshape(num, 8), mins.reshape(num, 8))
    levels = _affine_levels(blocks, d, dmin, ls, lm, 15).reshape(num, 4, 2, 32)
    # Each 32-byte slice of qs: low nibbles = sub-block 2c, high nibbles = sub-block 2c+1.
    qs = levels[:, :, 0, :] | (levels[:, :, 1, :] << 4)
    head = np.stack([d, dmin], axis=1).view(np.uint8)  # head: [N, 4]
    return np.concatenate([head, pack_scales_k4(ls, lm), qs.reshape(num, 128)], axis=1)


def _pack_q5_K(blocks: np.ndarray) -> np.ndarray:
    num = blocks.shape[0]
    scales, mins = _fit_affine(blocks.reshape(-1, 32), 31, -0.5, 0.1, 15)
    d, dmin, ls, lm = _super_scales(scales.reshape(num, 8), mins.reshape(num, 8))
    levels = _affine_levels(blocks, d, dmin, ls, lm, 31).reshape(num, 4, 2, 32)
    low = levels & 0xF
    qs = low[:, :, 0, :] | (low[:, :, 1, :] << 4)  # qs: [N, 4, 32], nibbles as in Q4_K
    # qh[j] bit 2c+h holds the 5th bit of weight j of sub-block 2c+h.
    shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)  # [4, 2]
    qh = ((levels >> 4) << shifts[None, :, :, None]).sum(axis=(1, 2), dtype=np.uint16).astype(np.uint8)
    head = np.stack([d, dmin], axis=1).view(np.uint8)
    return np.concatenate([head, pack_scales_k4(ls, lm), qh, qs.reshape(num, 128)], axis=1)


def _fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """Per sub-block signed scale so x ~ scale*L with L in [-nmax, nmax-1]; x: [S, n] -> [S] (weights x^2)."""
    imax = np.abs(x).argmax(axis=1)
    peak = np.take_along_axis(x, imax[:, None], axis=1)[:, 0]  # the signed value of largest magnitude
    nonzero = np.abs(peak) > 1e-15
    safe_peak = np.where(nonzero, peak, 1.0)
    w = x * x
    best_scale = np.zeros(x.shape[0], dtype=np.float64)
    best_gain = np.full(x.shape[0], -1.0)
    for step in range(-9, 10):  # candidate inverse scales around -nmax / peak
        iscale = -(nmax + 0.1 * step) / safe_peak
        levels = np.clip(np.rint(iscale[:, None] * x), -nmax, nmax - 1)
        sum_lx, sum_l2 = (w * x * levels).sum(1), (w * levels * levels).sum(1)
        ok = sum_l2 > 0
        scale = sum_lx / np.where(ok, sum_l2, 1.0)
        gain = np.where(ok, scale * sum_lx, -1.0)  # error reduction of the least-squares fit
        better = ok & (gain > best_gain)
        best_gain = np.where(better, gain, best_gain)
        best_scale = np.where(better, scale, best_scale)
    return np.where(nonzero, best_scale, 0.0)


def _pack_q6_K(blocks: np.ndarray) -> np.ndarray:
    num = blocks.shape[0]
    scales = _fit_symmetric(blocks.reshape(-1, 16), 32).reshape(num, 16)
    imax = np.abs(scales).argmax(axis=1)
    max_scale = np.take_along_axis(scales, imax[:, None], axis=1)[:, 0]
    live = np.abs(max_scale) > 1e-15
    iscale = np.where(live, -128.0 / np.where(live, max_scale, 1.0), 0.0)
    d = np.where(live, 1.0 / np.where(live, iscale, 1.0), 0.0).astype(np.float16)
    sc = np.clip(np.rint(iscale[:, None] * scales), -128, 127).astype(np.int8)  # sc: [N, 16]
    step = d.astype(np.float32)[:, None] * sc
    safe = np.where(step != 0, step, 1.0)
    x = blocks.reshape(num, 16, 16)
    q = np.clip(np.rint(x / safe[:, :, None]), -32, 31)
    q = (np.where(step[:, :, None] != 0, q, 0) + 32).astype(np.uint8).reshape(num, 2, 4, 32)
    # Per 128-weight half h: ql[64h + l] = q0 | q2 << 4, ql[64h + 32 + l] = q1 | q3 << 4 (quarters of 32 weights);
    # qh[32h + l] holds the top 2 bits of quarter k at bits 2k.
    low = q & 0xF
    ql = np.stack([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    shifts = (2 * np.arange(4)).astype(np.uint8)
    qh = ((q >> 4) << shifts[None, None, :, None]).sum(axis=2, dtype=np.uint16).astype(np.uint8)  # [N, 2, 32]
    return np.concatenate([ql.reshape(num, 128), qh.reshape(num, 64), sc.view(np.uint8),
                           d.reshape(num, 1).view(np.uint8)], axis=1)


def quantize_q4_K(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols % 256 == 0) -> Q4_K bytes uint8 [rows, cols // 256 * 144]."""
    return _chunked(x, 144, _pack_q4_K)


def quantize_q5_K(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols % 256 == 0) -> Q5_K bytes uint8 [rows, cols // 256 * 176]."""
    return _chunked(x, 176, _pack_q5_K)


def quantize_q6_K(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols % 256 == 0) -> Q6_K bytes uint8 [rows, cols // 256 * 210]."""
    return _chunked(x, 210, _pack_q6_K)
