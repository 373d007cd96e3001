"""Closers (kernels/act8_close.cuh): a kernel forms the next matmul's int8 input at its own tail, where a producer
launch (ops.produce) would have formed it from the kernel's output, so that launch and the kernel boundary in front
of it go: the FFN norm behind the mixer's output projection, SwiGLU behind gate | up, the next layer's input norm
behind ffn_down, the DeltaNet's gated norm behind the delta rule, attention's output copy behind attn_combine. For
passes of up to CLOSE_TOKENS tokens whose consumers all read the int8 copy. Off unless OPENJET_CUDA_CLOSE=1 until
the GPU has checked and timed it (i8b.CLOSE; bench/NOTES.md Z1).

Here: what a closer is (Closer), its scratch, the kernel's view of it (CloseDst), and where one can stand in a pass
(closing_kernel, closer_for, gated_closer_for, plain_closer_for). engine/cuda/model.py asks for them; ops.matmul,
i8b's launchers, mixers.gdn_recurrent and mixers.attention hand them to their close instances."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.cuda import gemm, i8b, ops
from engine.cuda.device import Buffer, Device
from engine.cuda.instances import (I8_CLOSE_MODES, I8_CLOSE_TOKENS, I8B_CLOSE_MODES, I8B_CLOSE_SHAPES, I8V_CLOSE_MODES,
                                   I8V_TOKENS, Q6_I8_CLOSE_MODES)

CLOSE_PART = 12  # mirror of kernels/act8_close.cuh: floats a (superblock, token) in the partial sums
CLOSE_TOKENS = 8  # ... and the tokens a closer takes
# _group_kernel's kernels that read only the int8 copy
INT8_KERNELS = frozenset({"i8b", "i8v", "i8", "i8q6", "i8q8"})
# the matmul kernels with close instances: kernel -> (token counts, modes) (instances.py)
CLOSE_INSTANCES = {"i8b": ((1,), I8B_CLOSE_MODES), "i8v": (I8V_TOKENS, I8V_CLOSE_MODES),
                   "i8": (I8_CLOSE_TOKENS, I8_CLOSE_MODES), "i8q6": (I8_CLOSE_TOKENS, Q6_I8_CLOSE_MODES)}
GATED_HEADS = (32, 64, 128, 256)  # the gated norm's head sizes a closer takes (a warp's lanes split by 8 positions)


class CloseDst(ctypes.Structure):
    """Mirror of struct Act8Close in kernels/act8_close.cuh (all zero: no closer)."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("w", "x2", "q", "scale", "sums", "sums_lo", "count", "part")] + [
        (n, ctypes.c_int32) for n in ("width", "tokens", "ld", "ld2", "head")] + [("eps", ctypes.c_float)]


@dataclass(frozen=True, slots=True)
class Closer:
    """The producer of `act` formed behind the kernel that writes its input (closer_for, gated_closer_for,
    plain_closer_for say where it can be): "rmsnorm", RMSNorm(y) * w; "swiglu", silu(y[:width]) * y[width:], the
    matmul's rows the gate then the up half; "gatednorm", RMSNorm(o per head of `head`) * w * silu(x2), o the delta
    rule's output; "plain", y itself (attention's output). act gets its int8 copy only (no f16 form, no f32 rows),
    so every matmul that reads it must take that. scratch: the kernel's counters and partial sums
    (alloc_close_scratch), zero between launches."""

    mode: str
    act: ops.Act
    scratch: Buffer
    w: Buffer | None = None
    eps: float = 0.0
    x2: Buffer | None = None  # gated norm: the gate z, rows ld2 apart
    ld2: int = 0
    head: int = 0


def close_count_bytes(width: int) -> int:
    """A closer's counters for an input `width` wide: one a superblock and one the row, 16-byte aligned."""
    return -(-4 * (width // ops.SUPERBLOCK + 1) // 16) * 16


def close_scratch_bytes(width: int) -> int:
    """The counters, then CLOSE_PART floats a superblock and token (RMSNorm's partial sums)."""
    return close_count_bytes(width) + 4 * CLOSE_PART * CLOSE_TOKENS * (width // ops.SUPERBLOCK)


def alloc_close_scratch(dev: Device, width: int, what: str) -> Buffer:
    """A closer's scratch for an input `width` wide, zeroed: each launch leaves it so."""
    buf = dev.alloc(close_scratch_bytes(width), what)
    dev.fill_u32(buf, 0)
    return buf


def instance(base: str, closer: Closer | None) -> str:
    """The kernel instance a launch takes: base, or its close instance of the closer's mode (instances.py)."""
    return base if closer is None else f"{base}_close_{closer.mode}"


def close_dst(closer: Closer | None, num_tokens: int = 0, ld: int = 0) -> CloseDst:
    """The kernel's view of a closer for a launch of num_tokens tokens whose output rows are ld apart: its act's
    int8 copy (group 0), its scratch's counters and partial sums."""
    if closer is None:
        return CloseDst()
    act, base = closer.act, closer.scratch.ptr
    return CloseDst(closer.w.ptr if closer.w is not None else 0, closer.x2.ptr if closer.x2 is not None else 0,
                    act.q8.ptr, act.scale8.ptr, act.sums8.ptr, act.sums8_lo.ptr, base,
                    base + close_count_bytes(act.width), act.width, num_tokens, ld, closer.ld2, closer.head,
                    closer.eps)


def closing_kernel(dev: Device, w: ops.DeviceWeight, num_tokens: int, mode: str,
                   x: ops.Act | None = None) -> str | None:
    """The int8 matmul a launch on w of num_tokens tokens takes (its input x's int8 copy written; x None: a
    one-token probe) where that kernel has a close instance of `mode` for that count, else None: closers on,
    mmvq_i8b in a shape built with them, mmvq_i8 a tile a block."""
    if not _on(num_tokens):
        return None
    probe = ops.Act(None, None, None, w.cols, w.cols, num_tokens) if x is None else x
    kernel = ops._group_kernel(dev, w, replace(probe, i8_tokens=num_tokens), num_tokens, num_tokens)
    if (kernel == "i8b" and i8b.SHAPE not in I8B_CLOSE_SHAPES) or (kernel == "i8" and ops.I8_TILES != 1):
        return None
    counts, modes = CLOSE_INSTANCES.get(kernel, ((), ()))
    return kernel if num_tokens in counts and mode in modes else None


def _on(num_tokens: int) -> bool:
    """Closers and the int8 matmuls on, and a pass they take (one token group)."""
    return i8b.CLOSE and ops.I8_MATMUL and 1 <= num_tokens <= CLOSE_TOKENS


def _admits(dev: Device, act: ops.Act, consumers: Sequence[ops.DeviceWeight], num_tokens: int,
            scratch: Buffer) -> bool:
    """Whether a closer may form act: act in whole superblocks with an int8 copy, and every consumer a matmul of
    act's width that takes that copy at num_tokens (as a closer leaves act: that copy written, nothing else)."""
    if act.q8 is None or act.width % ops.SUPERBLOCK:
        return False
    assert scratch.nbytes >= close_scratch_bytes(act.width), scratch.what
    written = replace(act, i8_tokens=num_tokens)
    return all(c.cols == act.width and num_tokens < gemm.MIN_TOKENS
               and ops._group_kernel(dev, c, written, num_tokens, num_tokens) in INT8_KERNELS for c in consumers)


def closer_for(dev: Device, w: ops.DeviceWeight, num_tokens: int, mode: str, act: ops.Act,
               consumers: Sequence[ops.DeviceWeight], scratch: Buffer, norm: Buffer | None = None, eps: float = 0.0,
               x: ops.Act | None = None) -> Closer | None:
    """A Closer for the matmul on w (input x) whose output makes act by `mode` ("rmsnorm", "swiglu"), or None where
    the producer must be launched: w's launch on a kernel that closes the mode at that count (closing_kernel), w's
    rows act's width (rmsnorm) or twice it (swiglu), act in whole superblocks with an int8 copy, and every
    consumer a matmul that reads only that copy at num_tokens."""
    if closing_kernel(dev, w, num_tokens, mode, x) is None:
        return None
    if w.rows != (2 if mode == "swiglu" else 1) * act.width or (mode == "rmsnorm") != (norm is not None):
        return None
    if norm is not None and norm.ptr % 16:  # its lanes load 8 weights at a time
        return None
    return Closer(mode, act, scratch, norm, eps) if _admits(dev, act, consumers, num_tokens, scratch) else None


def gated_closer_for(dev: Device, num_tokens: int, act: ops.Act, consumers: Sequence[ops.DeviceWeight], scratch: Buffer,
                     o: Buffer, ld_o: int, z: Buffer, ld_z: int, norm: Buffer, head: int, eps: float
                     ) -> Closer | None:
    """A Closer of the DeltaNet's gated norm behind the delta rule (o [T, ld_o], z [T, ld_z], norm [head]), or None
    where it must be launched: closers on, up to CLOSE_TOKENS tokens, a head size it takes, act in whole
    superblocks with an int8 copy, every row and the norm 16-byte aligned, and every consumer a matmul that
    reads only the int8 copy at num_tokens."""
    aligned = all(p % 16 == 0 for p in (o.ptr, z.ptr, norm.ptr, 4 * ld_o, 4 * ld_z))
    if not (_on(num_tokens) and head in GATED_HEADS and aligned):
        return None
    closer = Closer("gatednorm", act, scratch, norm, eps, z, ld_z, head)
    return closer if _admits(dev, act, consumers, num_tokens, scratch) else None


def plain_closer_for(dev: Device, num_tokens: int, act: ops.Act, consumers: Sequence[ops.DeviceWeight],
                     scratch: Buffer, out: Buffer, ld_out: int, head_dim: int, combined: bool) -> Closer | None:
    """A Closer of attention's output copy (out [T, ld_out], heads of head_dim) behind attn_combine, or None where
    it must be launched: closers on, up to CLOSE_TOKENS tokens, the output written by attn_combine (combined: the
    keys split, not the prefill mma path), heads that tile a superblock, act in whole superblocks with an int8 copy,
    rows 16-byte aligned, and every consumer a matmul that reads only the int8 copy at num_tokens."""
    heads_fit = head_dim <= ops.SUPERBLOCK and ops.SUPERBLOCK % head_dim == 0
    aligned = out.ptr % 16 == 0 and (4 * ld_out) % 16 == 0
    if not (_on(num_tokens) and combined and heads_fit and aligned):
        return None
    return Closer("plain", act, scratch) if _admits(dev, act, consumers, num_tokens, scratch) else None
