"""The tensor-copy int8 Q6_K matmul of one token (kernels/mmvq_i8q6b.cu, sm_90+): its switch, shape, tensor maps
and launcher. ops' int8 Q6_K launch (mmvq_q6_i8) hands a one-token launch with no closer behind it to this one
where runs() says so, whole or walking half-tiles (ops.DOWN_HALVES).

On by default for ffn_down (OPENJET_CUDA_Q6B=0: off), in halves on 8-warp blocks: one block an SM walks 5 of its
640 half-tiles, where mmvq_q6_i8's 320 blocks leave 56 SMs three tiles and 76 two. The 27B one-token pass on an H100
7.298 ms against 7.434 (fast 7.287 / 7.339), the other counts level, the same greedy tokens (bench/NOTES.md Z24).
Whole on 4-warp blocks (160 blocks of 2 tiles) it was slower than mmvq_q6_i8 (7.649 ms), and so are the output
head and attn_v on it alone (383 / 6.0 us against 378 / 5.6): MIN_COLS keeps them on mmvq_q6_i8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf import GGMLQuantizationType as Q

from engine.cuda import env_switch, i8b, tma
from engine.cuda.instances import Q6B_SHAPES

if TYPE_CHECKING:
    from engine.cuda.device import Buffer, Device
    from engine.cuda.ops import DeviceWeight

ENV = "OPENJET_CUDA_Q6B"
QL_BYTES, QH_BYTES, WORD_BYTES = 2048, 1024, 320  # a superblock's boxes and scale | d words (the kernel's Q6B_*)
MAX_WARPS = 8  # the kernel's Q6B_MAX_WARPS
STATIC_SMEM = 2048 + 1024  # the kernel's static shared memory and the driver's reserve, per block


def _default() -> bool:
    return env_switch(ENV, True)


ON = _default()
# (superblocks a stage, stages a warp): one of instances.Q6B_SHAPES. (2, 2) keeps one stage of 2 superblocks in
# flight a warp (6.6 KB, as mmvq_i8b's (3, 2) keeps 6.9 KB of Q4_K) and ffn_down's blocks within two an SM whole.
DEFAULT_SHAPE = (2, 2)
SHAPE = DEFAULT_SHAPE
# Warps a block: each takes a contiguous share of the block's part of the row. 8: one block an SM in halves (128
# KB of shared memory), 5 half-tiles a block on 128 blocks (variant q6bh8); 4 (three blocks an SM): 2 a block on
# 320, 56 SMs with 6 (q6bhalves, 0.2 ms slower).
DEFAULT_WARPS = 8
WARPS = DEFAULT_WARPS
# Blocks an SM the walking grid leaves free: none (ffn_down and the output head run alone; attn_v's 64 tiles fit
# in any case).
SPARE_PER_SM = 0
# Whether its launches of rows ops.WIDE_COLS wide or more (ffn_down) go in halves whatever ops.DOWN_HALVES says
# (which puts mmvq_i8's and mmvq_q6_i8's in halves too, at 1-5 tokens, and lost on the H100: Z24).
DEFAULT_HALVES = True
HALVES = DEFAULT_HALVES
# The narrowest rows (columns) it takes: ffn_down's (17,408) and not the hidden size (attn_v, the output head:
# slower on it alone). 0: every Q6_K one-token launch (bench variant q6b).
DEFAULT_MIN_COLS = 8192  # ops.WIDE_COLS
MIN_COLS = DEFAULT_MIN_COLS


def x_bytes(nb: int) -> int:
    """Mirror of kernels/mmvq_i8q6b.cu q6b_x_bytes: a block's staged activations of nb superblocks."""
    return (256 * nb + 64 + 256 * nb + 16 * nb + 1023) // 1024 * 1024


def smem_bytes(nb: int, warps: int, shape: tuple[int, int], halves: bool = False) -> int:
    """Dynamic shared memory of a launch over rows of nb superblocks: the block's staged part of the row (the
    larger half in halves) and every warp's ring."""
    s, ns = shape
    part = nb - nb // 2 if halves else nb
    return i8b.ALIGN_SLACK + x_bytes(part) + warps * ns * s * (QL_BYTES + QH_BYTES + WORD_BYTES)


def warps(w: DeviceWeight) -> int:
    """Warps a block: WARPS, never more than the superblocks of a half-row (a warp without a share idles)."""
    return max(1, min(WARPS, w.cols // 512, MAX_WARPS))


def runs(dev: Device, w: DeviceWeight, num_tokens: int, halves: bool = False) -> bool:
    """Whether a Q6_K launch on the int8 activations takes mmvq_q6_i8b: on, sm_90+, one token, rows of MIN_COLS
    or more, and its shared memory within the GPU's opt-in maximum."""
    if not (ON and dev.info.arch >= i8b.MIN_ARCH and w.qtype == Q.Q6_K and num_tokens == 1 and w.cols >= MIN_COLS):
        return False
    smem = smem_bytes(w.cols // 256, warps(w), SHAPE, halves) + STATIC_SMEM
    return smem <= dev.info.max_smem_per_block


def plane_maps(w: DeviceWeight) -> tuple[tma.TensorMap, tma.TensorMap]:
    """The tensor maps of w's ql' plane ([rows][nb x 128] bytes first in the buffer: boxes of 16 x 128, 128-byte
    swizzle) and qh' plane (after it, [rows][nb x 64]: boxes of 16 x 64, 64-byte swizzle); rows past the end read
    as zeros."""
    nb = w.cols // 256
    ql = tma.encode(w.buf.ptr, "u8", (128 * nb, w.rows), (128 * nb,), (128, 16), 128)
    qh = tma.encode(w.buf.ptr + 128 * nb * w.rows, "u8", (64 * nb, w.rows), (64 * nb,), (64, 16), 64)
    return ql, qh


def launch(dev: Device, w: DeviceWeight, q8: Buffer, scale8: Buffer, y: Buffer, bias: Buffer | None,
           residual: Buffer | None, y2: Buffer | None = None) -> None:
    """One launch of mmvq_q6_i8b: blocks of warps walking 16-row tiles (i8b.grid), or with y2 half-tiles
    (i8b.halves_grid: the second half of every row's superblocks summed into y2, y the first + bias + residual)."""
    assert SHAPE in Q6B_SHAPES, f"no mmvq_q6_i8b instance for {SHAPE}"
    halves = y2 is not None
    tiles, nb, num_warps = (w.rows + 15) // 16, w.cols // 256, warps(w)
    kernel = dev.kernel(f"mmvq_q6_K_i8b_s{SHAPE[0]}n{SHAPE[1]}" + ("_halves" if halves else ""))
    smem = smem_bytes(nb, num_warps, SHAPE, halves)
    dev.set_max_dynamic_smem(kernel, smem)
    if halves:
        blocks = i8b.halves_grid(dev, tiles, num_warps, smem, STATIC_SMEM, SPARE_PER_SM)
    else:
        blocks = i8b.grid(dev, tiles, num_warps, smem, STATIC_SMEM, SPARE_PER_SM)
    ql, qh = plane_maps(w)
    dev.launch(kernel, blocks, 32 * num_warps,
               [ql, qh, w.buf, q8, scale8, y, bias, residual, w.rows, w.cols, y2], smem=smem)
