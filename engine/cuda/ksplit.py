"""Wide rows split in K over several blocks a tile (kernels/mmvq.cuh KSplit): the int8 matmuls mmvq_i8 (Q4_K, one
tile a block) and mmvq_q6_i8 (Q6_K) on rows of at least MIN_COLS (the 27B's ffn_down, 17,408).

A block a 16-row tile gives ffn_down 320 blocks on 132 SMs: 3 on 56 of them and 2 on the rest, and the matmul
lasts as long as the SMs with 3 (~1.24 x the mean). In `parts` blocks a tile, each taking a contiguous share of the
superblocks, the work evens out (640 blocks of 34 superblocks: 4 or 5 an SM); each block stores its sums in a
scratch row and the tile's last block sums them in a fixed order, so the result does not depend on which finishes
last. PARTS_AT says how many parts at each token count (none until measured on the GPU: the benchmark's ks<n>
variants set it); `OPENJET_CUDA_KSPLIT=<n>` splits every such launch in n."""

from __future__ import annotations

import ctypes
import os
import weakref
from dataclasses import dataclass

from engine.cuda.device import Buffer, CudaError, Device
from engine.cuda.instances import KSPLIT_TOKENS
from engine.cuda.persist import is_capturing

KSPLIT_ENV = "OPENJET_CUDA_KSPLIT"
MIN_COLS = 8192  # rows narrower than this keep a block a tile (ops.WIDE_COLS: the same widest rows)
MAX_PARTS = 4
NCOLS = 8  # mirror of kernels/mmvq.cuh MMVQ_NCOLS: a part's sums are [NCOLS][16] floats
TILE_ROWS = 16


def _default_parts_at() -> dict[int, int]:
    """Parts by token count: OPENJET_CUDA_KSPLIT=n for every count the kernels take, else none."""
    raw = os.environ.get(KSPLIT_ENV, "")
    if not raw:
        return {}
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PARTS:
        raise ValueError(f"{KSPLIT_ENV}={raw!r}: expected a number of parts from 1 to {MAX_PARTS}")
    return dict.fromkeys(range(1, 9), int(raw))


DEFAULT_PARTS_AT: dict[int, int] = _default_parts_at()
PARTS_AT: dict[int, int] = dict(DEFAULT_PARTS_AT)


class KSplitArg(ctypes.Structure):
    """Mirror of struct KSplit in kernels/mmvq.cuh (parts 1: no split)."""

    _fields_ = [("part", ctypes.c_uint64), ("count", ctypes.c_uint64), ("parts", ctypes.c_int32),
                ("pad", ctypes.c_int32)]


NO_SPLIT = KSplitArg(0, 0, 1, 0)


def parts(cols: int, num_tokens: int) -> int:
    """Blocks a tile for a matmul of rows `cols` wide at num_tokens: PARTS_AT's for wide rows at the counts the
    split instances take (instances.KSPLIT_TOKENS), else 1; never more than the row's superblocks."""
    if cols < MIN_COLS or num_tokens not in KSPLIT_TOKENS:
        return 1
    return max(1, min(PARTS_AT.get(num_tokens, 1), MAX_PARTS, cols // 256))


def suffix(n_parts: int) -> str:
    """What a launch of n_parts blocks a tile adds to its instance's name: "_ks" (the split instances) or ""."""
    return "_ks" if n_parts > 1 else ""


@dataclass(slots=True)
class _Scratch:
    """Per device: each part's sums of a tile (tiles x MAX_PARTS x NCOLS x 16 floats) and the tiles' counts."""

    part: Buffer | None = None
    count: Buffer | None = None
    tiles: int = 0


_SCRATCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Device -> _Scratch


def arg(dev: Device, rows: int, n_parts: int) -> KSplitArg:
    """The kernel's KSplit for a launch of `rows` rows in n_parts blocks a tile: the device's scratch (one per
    device, so two split launches must not run side by side: weights.Projection keeps them on the main stream),
    allocated or grown on first use with the counts zeroed; under graph capture it must already be large enough
    (the first launch of each shape runs eagerly)."""
    if n_parts <= 1:
        return NO_SPLIT
    tiles = -(-rows // TILE_ROWS)
    state = _SCRATCH.setdefault(dev, _Scratch())
    if state.tiles < tiles:
        if is_capturing(dev):
            raise CudaError("the K-split scratch first needed under graph capture: run the pass eagerly first")
        if state.part is not None:
            dev.synchronize()  # launches queued before may still use the old buffers
            dev.memory.free(state.part)
            dev.memory.free(state.count)
        state.part = dev.alloc(4 * tiles * MAX_PARTS * NCOLS * TILE_ROWS, "ksplit.part")
        state.count = dev.alloc(4 * max(tiles, 4), "ksplit.count")
        dev.fill_u32(state.count, 0)
        state.tiles = tiles
    assert state.part is not None and state.count is not None
    return KSplitArg(state.part.ptr, state.count.ptr, n_parts, 0)
