"""Host side of the persistent stream-K mmvq (kernels/mmvq_persist.cu): its grid, its work split, its scratch.

A unit is one superblock of one 16-row tile (unit = tile * nb + sb); warp w of the P launched takes the units
[w U / P, (w + 1) U / P). The functions below mirror the kernel's arithmetic so that tests can check the split
(every unit once, every cut tile's shares found where their warps wrote them) without a GPU.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.cuda.device import Buffer, Device, Kernel

PERSIST_WARPS = 4  # kernels/mmvq_persist.cu PERSIST_WARPS: warps per block
TILE_BYTES = 512  # one tile's f32 sums [16 rows][8 columns]: a warp's shared tile buffer and each share slot
MAX_WARPS_PER_SM = 64  # the most resident warps of any supported GPU (sm_80, sm_90): bounds the share slots
MIN_COUNTS = 1 << 16  # tiles the first count buffer covers (1M rows); a larger matrix reallocates it


def warp_bytes(stages: int, stage_bytes: int) -> int:
    """Dynamic shared memory of one warp: its ring of stages and its tile buffer."""
    return stages * stage_bytes + TILE_BYTES


def launch_shape(units: int, multiprocessors: int, blocks_per_sm: int, min_units: int) -> tuple[int, int]:
    """(blocks, warps per block): one wave of every SM's resident blocks, fewer where a warp would get fewer than
    min_units units (its ring would not fill); never more warps than units, so no warp's range is empty."""
    assert units >= 1 and multiprocessors >= 1 and blocks_per_sm >= 1 and min_units >= 1
    blocks = min(multiprocessors * blocks_per_sm, units // (min_units * PERSIST_WARPS))
    if blocks >= 1:
        warps = PERSIST_WARPS
    else:  # a tiny matrix: one block of as many warps as it keeps busy
        blocks, warps = 1, max(1, min(PERSIST_WARPS, units // min_units))
    if units * blocks * warps >= 1 << 32:
        raise ValueError(f"{units} units over {blocks * warps} warps overflow the persistent mmvq's 32-bit split")
    return blocks, warps


def plan(dev: Device, kernel: Kernel, stages: int, stage_bytes: int, rows: int, cols: int) -> tuple[int, int, int]:
    """(blocks, warps per block, dynamic shared memory) of one launch of a persistent instance on dev, whose
    stages are `stages` x `stage_bytes` per warp (ops.STAGE_SHAPE)."""
    per_warp = warp_bytes(stages, stage_bytes)
    dev.set_max_dynamic_smem(kernel, PERSIST_WARPS * per_warp)  # before the occupancy query, which honours it
    resident = blocks_per_sm(dev, kernel, 32 * PERSIST_WARPS, PERSIST_WARPS * per_warp)
    units = (rows + 15) // 16 * (cols // 256)
    # a warp gets at least a ring's worth of units, so all of them are in flight from its first step
    blocks, warps = launch_shape(units, dev.info.multiprocessors, resident, stages - 1)
    return blocks, warps, warps * per_warp


def range_start(warp: int, units: int, num_warps: int) -> int:
    """First unit of a warp's range (kernel: persist_start)."""
    return warp * units // num_warps


def owner(unit: int, units: int, num_warps: int) -> int:
    """The warp whose range holds a unit (kernel: persist_owner)."""
    return ((unit + 1) * num_warps - 1) // units


@dataclass(frozen=True, slots=True)
class Segment:
    """A warp's superblocks [sb0, sb1) of one tile; slot is None for a whole tile (stored directly)."""

    warp: int
    tile: int
    sb0: int
    sb1: int
    slot: int | None


def warp_segments(warp: int, tiles: int, nb: int, num_warps: int) -> list[Segment]:
    """The tiles a warp walks and where each goes, as the kernel decides it (a cut tile's share goes to slot
    2 warp for the tile its range starts in, 2 warp + 1 for the one it ends in)."""
    units = tiles * nb
    start, end = range_start(warp, units, num_warps), range_start(warp + 1, units, num_warps)
    out, u = [], start
    while u < end:
        tile, sb0 = divmod(u, nb)
        sb1 = min(nb, sb0 + end - u)
        is_whole = sb0 == 0 and sb1 == nb
        slot = None if is_whole else 2 * warp + (0 if tile == start // nb else 1)
        out.append(Segment(warp, tile, sb0, sb1, slot))
        u += sb1 - sb0
    return out


def share_slots(tile: int, tiles: int, nb: int, num_warps: int) -> list[int]:
    """The slots the last warp of a cut tile sums, in warp order (kernel: persist_partial)."""
    units = tiles * nb
    u0 = tile * nb
    first, last = owner(u0, units, num_warps), owner(u0 + nb - 1, units, num_warps)
    first_slot = 2 * first + (1 if range_start(first, units, num_warps) < u0 else 0)
    return [first_slot] + [2 * w for w in range(first + 1, last + 1)]


@dataclass(slots=True)
class Scratch:
    """Per device: the share slots and per-tile arrival counts, and each instance's resident blocks per SM."""

    partials: Buffer | None = None
    counts: Buffer | None = None
    occupancy: dict[tuple[str, int, int], int] = field(default_factory=dict)


_SCRATCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Device -> Scratch


def _is_capturing(dev: Device) -> bool:
    """Whether dev's stream is capturing a graph now."""
    from engine.cuda.driver import check, driver

    drv = driver()
    status = check(drv.cuStreamIsCapturing(dev.stream), "cuStreamIsCapturing")
    return status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def scratch(dev: Device, num_tiles: int) -> tuple[Buffer, Buffer]:
    """(partials, counts) of dev, allocated on first use (counts zeroed on the stream; every launch leaves them
    zero) and the counts grown for a larger matrix. Allocation cannot happen under capture: the first launch of
    each shape runs eagerly (backend, bench), which settles the sizes."""
    state = _SCRATCH.setdefault(dev, Scratch())
    if state.partials is not None and state.counts is not None and state.counts.nbytes >= 4 * num_tiles:
        return state.partials, state.counts
    if _is_capturing(dev):
        from engine.cuda.device import CudaError

        raise CudaError("mmvq_persist scratch first needed under graph capture: run the pass eagerly first")
    if state.partials is None:
        slots = 2 * dev.info.multiprocessors * MAX_WARPS_PER_SM
        state.partials = dev.alloc(slots * TILE_BYTES, "mmvq_persist.partials")
    if state.counts is None or state.counts.nbytes < 4 * num_tiles:
        if state.counts is not None:
            dev.synchronize()  # launches queued before may still count in the old buffer
            dev.memory.free(state.counts)
        state.counts = dev.alloc(4 * max(num_tiles, MIN_COUNTS), "mmvq_persist.counts")
        dev.fill_u32(state.counts, 0)
    return state.partials, state.counts


def blocks_per_sm(dev: Device, kernel: Kernel, threads: int, smem: int) -> int:
    """Resident blocks per SM of a kernel instance at this block size and dynamic shared memory (the driver's
    occupancy calculator, asked once per instance and size)."""
    from engine.cuda.driver import check, driver

    state = _SCRATCH.setdefault(dev, Scratch())
    key = (kernel.name, threads, smem)
    if key not in state.occupancy:
        n = int(check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel.handle, threads, smem),
                      f"cuOccupancyMaxActiveBlocksPerMultiprocessor({kernel.name})"))
        if n < 1:
            raise ValueError(f"{kernel.name}: a block of {threads} threads and {smem} bytes of shared memory does "
                             f"not fit one multiprocessor")
        state.occupancy[key] = n
    return state.occupancy[key]
