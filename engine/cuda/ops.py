"""One launcher per kernel (grid, block, argument unpacking) and the dispatch table keyed by (op, qtype).

Launchers take Buffers and sizes, check what a kernel cannot check cheaply, and launch on the device's stream;
they never synchronise. Shapes in comments are logical: [T, K] means T rows of K values, row stride given.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from engine.cuda.device import Buffer, Device
from engine.cuda.instances import MATMUL_QTYPES, MMVQ_MT, qtype_tag
from engine.cuda.repack import device_nbytes

MAX_VERIFY_ROWS = 8  # mmvq computes up to 8 activation rows per weight pass (mma N = 8)
MMVQ_WARPS = 8


@dataclass(slots=True)
class DeviceWeight:
    """A weight matrix [rows, cols] in the device layout (repack.PLANES), or a plain f32/f16 matrix."""

    buf: Buffer
    qtype: Q
    rows: int
    cols: int
    name: str = ""


@dataclass(slots=True)
class Act:
    """Activations prepared for the quantized matmuls: f16 copy [T, ld] and f16 sums of 32-wide sub-blocks."""

    x16: Buffer  # [T, ld] f16
    sums: Buffer  # [T, ld // 32] f16
    f32: Buffer  # [T, ld] f32: the same activations before rounding (the F32-weight path reads these)
    ld: int

    def sums_ld(self) -> int:
        """Row stride of the sums."""
        return self.ld // 32


def _mmvq_instance(qtype: Q) -> str:
    """Dispatch: weight type -> mmvq instance."""
    if qtype not in MATMUL_QTYPES:
        raise ValueError(f"no CUDA matmul for weight type {qtype.name}")
    return f"mmvq_{qtype_tag(qtype)}"


# (op, qtype) -> instance name: the one place a run-time type picks a template instance.
DISPATCH: dict[tuple[str, Q], str] = {("mmvq", qt): _mmvq_instance(qt) for qt in MATMUL_QTYPES}
DISPATCH[("mmvq", Q.F32)] = "mmv_f32"


def act_f16(dev: Device, x: Buffer, act: Act, num_tokens: int, k: int, ld_in: int) -> None:
    """Round f32 activations x [T, K] into act (f16 copy and sub-block sums); act.f32 must be x or a copy of it."""
    assert num_tokens >= 1 and k <= act.ld
    dev.launch(dev.kernel("act_f16"), num_tokens, 256, [x, act.x16, act.sums, k, ld_in, act.ld, act.sums_ld()])


def matmul(dev: Device, w: DeviceWeight, act: Act, y: Buffer, num_tokens: int, ld_y: int,
           bias: Buffer | None = None, residual: Buffer | None = None) -> None:
    """y[T, rows] = act[T, cols] @ w^T (+ bias[rows]) (+ residual[T, rows]); T <= 8 per launch, more in groups."""
    # y, residual: [T, ld_y] f32
    assert 1 <= num_tokens, "empty matmul"
    assert w.cols % 4 == 0 and w.cols <= act.ld, f"{w.name}: {w.cols} columns vs activations of {act.ld}"
    instance = DISPATCH.get(("mmvq", w.qtype))
    if instance is None:
        raise ValueError(f"{w.name}: no CUDA matmul for {w.qtype.name}")
    kernel = dev.kernel(instance)
    for t0 in range(0, num_tokens, MAX_VERIFY_ROWS):
        t = min(MAX_VERIFY_ROWS, num_tokens - t0)
        y_t = y.view(4 * t0 * ld_y)
        res_t = residual.view(4 * t0 * ld_y) if residual is not None else None
        if w.qtype == Q.F32:
            x_t = act.f32.view(4 * t0 * act.ld)
            dev.launch(kernel, (w.rows + 7) // 8, 256, [w.buf, x_t, y_t, bias, res_t, w.rows, w.cols, t, act.ld, ld_y])
            continue
        x_t, s_t = act.x16.view(2 * t0 * act.ld), act.sums.view(2 * t0 * act.sums_ld())
        rows_per_block = 16 * MMVQ_MT[w.qtype]
        grid = (w.rows + rows_per_block - 1) // rows_per_block
        dev.launch(kernel, grid, 32 * _mmvq_warps(w), [w.buf, x_t, s_t, y_t, bias, res_t, w.rows, w.cols, t,
                                                       act.ld, act.sums_ld(), ld_y])


def _mmvq_warps(w: DeviceWeight) -> int:
    """Warps splitting K inside one block: as many as the superblocks keep busy, at most 8."""
    superblock = 128 if w.qtype == Q.F16 else 256
    num_sb = (w.cols + superblock - 1) // superblock
    best = min(MMVQ_WARPS, num_sb)
    # prefer a count that divides the superblocks evenly, so no warp waits on a longer one
    for warps in range(best, max(best // 2, 1) - 1, -1):
        if num_sb % warps == 0:
            return warps
    return best


def upload_weight(dev: Device, data, qtype: Q, shape: tuple[int, int], name: str) -> DeviceWeight:
    """Repack a GGUF tensor's bytes into the device layout and upload it, plane by plane."""
    from engine.cuda.repack import planes

    rows, cols = shape
    buf = dev.alloc(device_nbytes(qtype, shape) if qtype not in (Q.F32, Q.F16) else data.nbytes, name)
    offset = 0
    for plane in planes(data, qtype, shape):
        dev.upload(buf, plane, offset)
        offset += plane.nbytes
    return DeviceWeight(buf, qtype, rows, cols, name)


def alloc_act(dev: Device, max_tokens: int, width: int, what: str, f32: Buffer | None = None) -> Act:
    """Activation buffers for up to max_tokens rows of `width` values (width rounded up to 32)."""
    ld = (width + 31) // 32 * 32
    x16 = dev.alloc(2 * max_tokens * ld, f"{what}.f16")
    sums = dev.alloc(2 * max_tokens * (ld // 32), f"{what}.sums")
    return Act(x16, sums, f32 if f32 is not None else dev.alloc(4 * max_tokens * ld, f"{what}.f32"), ld)
