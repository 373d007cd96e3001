"""Weights into L2 ahead of the matmul that reads them (kernels/prefetch.cu), for decode and verify passes.

A pass of a few tokens alternates matmuls, which stream their weights from DRAM, with kernels that read little
(producers, the convolution, the delta rule, attention) and the gaps between launches. engine/cuda/model.py
calls ahead() where such a stretch begins, right after a matmul's launch: the prefetch launches beside the main
stream (Device.beside), starts when that matmul ends and asks for the first BYTES of the matmuls that come next,
so that those bytes are in L2 when they are read. The prefetch changes no result, only where bytes come from.

OPENJET_CUDA_L2_PREFETCH=<MiB> sets BYTES (0: off).
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING

from engine.cuda.repack import plane_spans

if TYPE_CHECKING:
    from engine.cuda.device import Device
    from engine.cuda.ops import DeviceWeight

ENV = "OPENJET_CUDA_L2_PREFETCH"
MAX_RANGES = 8  # the kernel's L2P_MAX_RANGES
CHUNK = 16384  # the kernel's L2P_CHUNK: bytes a request
CHUNKS_A_WARP = 8  # requests a one-warp block issues: a 24 MiB prefetch spreads over ~190 blocks
ALIGN = 16  # a bulk prefetch's address and size


def _default_bytes() -> int:
    value = os.environ.get(ENV)
    if value is None:
        return 0
    try:
        mib = int(value)
    except ValueError:
        raise ValueError(f"{ENV}={value!r}: expected a whole number of MiB") from None
    if mib < 0:
        raise ValueError(f"{ENV}={value!r}: expected a whole number of MiB, 0 or more")
    return mib << 20


BYTES = _default_bytes()


class L2Ranges(ctypes.Structure):
    """Mirror of struct L2Ranges in kernels/prefetch.cu."""

    _fields_ = [("ptr", ctypes.c_uint64 * MAX_RANGES), ("bytes", ctypes.c_uint64 * MAX_RANGES),
                ("n", ctypes.c_int32)]


def ranges(weights: list[DeviceWeight], budget: int) -> list[tuple[int, int]]:
    """(address, bytes) to prefetch: the weights in order, each whole while the budget lasts, then the same first
    fraction of every plane of the one the budget ends in (the rows its first blocks read). Each range is 16-byte
    aligned and a multiple of 16 long; at most MAX_RANGES."""
    out: list[tuple[int, int]] = []
    for w in weights:
        if budget < ALIGN:
            break
        fraction = min(1.0, budget / w.buf.nbytes)
        for offset, size in plane_spans(w.qtype, (w.rows, w.cols)):
            start = w.buf.ptr + offset
            end = start + int(size * fraction)
            start, end = -(-start // ALIGN) * ALIGN, end // ALIGN * ALIGN
            if end > start and len(out) < MAX_RANGES:
                out.append((start, end - start))
                budget -= end - start
    return out


def ahead(dev: Device, weights: list[DeviceWeight], budget: int | None = None) -> None:
    """Launch beside the main stream a prefetch of the first `budget` bytes (BYTES) of weights; the caller joins
    it (Device.join) before its pass ends, like anything launched beside."""
    spans = ranges(weights, BYTES if budget is None else budget)
    if not spans:
        return
    arg = L2Ranges()
    for i, (ptr, nbytes) in enumerate(spans):
        arg.ptr[i], arg.bytes[i] = ptr, nbytes
    arg.n = len(spans)
    chunks = sum(-(-nbytes // CHUNK) for _, nbytes in spans)
    grid = max(1, min(-(-chunks // CHUNKS_A_WARP), 2 * dev.info.multiprocessors))
    with dev.beside():
        dev.launch(dev.kernel("l2_prefetch"), grid, 32, [arg])
