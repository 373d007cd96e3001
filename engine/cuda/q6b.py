"""The tensor-copy int8 Q6_K matmul of one token (kernels/mmvq_i8q6b.cu, sm_90+): its switch, shape, tensor maps
and launcher. ops' int8 Q6_K launch (mmvq_q6_i8) hands a one-token launch to this one where runs() says so,
whole or walking half-tiles (ops.DOWN_HALVES). Its form of 2-8 tokens (mmvq_q6_i8v) takes
the verify passes' Q6_K ffn_downs in halves at the counts of VERIFY_AT (ops.matmul, where verify_runs says so).

On by default for ffn_down (OPENJET_CUDA_Q6B=0: off), in halves on 8-warp blocks: one block an SM walks 5 of its
640 half-tiles, where mmvq_q6_i8's 320 blocks leave 56 SMs three tiles and 76 two. The 27B one-token pass on an H100
7.298 ms against 7.434 (fast 7.287 / 7.339), the other counts level, the same greedy tokens (bench/NOTES.md Z24).
On the H200 it was slower (6.618 ms against 6.490, fast 6.493 / 6.352, bench/NOTES.md Z28): off there by default
(SLOWER_ON; OPENJET_CUDA_Q6B=1 turns it on on every GPU).
Whole on 4-warp blocks (160 blocks of 2 tiles) it was slower than mmvq_q6_i8 (7.649 ms), and so are the output
head and attn_v on it alone (383 / 6.0 us against 378 / 5.6): MIN_COLS keeps them on mmvq_q6_i8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf import GGMLQuantizationType as Q

from engine.cuda import env_switch, i8b, tma
from engine.cuda.instances import Q6B_SHAPES, Q6V_SHAPE, Q6V_TOKENS

if TYPE_CHECKING:
    from engine.cuda.device import Buffer, Device
    from engine.cuda.ops import Act, DeviceWeight

ENV = "OPENJET_CUDA_Q6B"
QL_BYTES, QH_BYTES, WORD_BYTES = 2048, 1024, 320  # a superblock's boxes and scale | d words (the kernel's Q6B_*)
MAX_WARPS = 8  # the kernel's Q6B_MAX_WARPS
STATIC_SMEM = 2048 + 1024  # the kernel's static shared memory and the driver's reserve, per block


def _default() -> bool:
    return env_switch(ENV, True)


ON = _default()
# GPUs (a part of the name) on which it measured slower than mmvq_q6_i8 in the 27B pass, where it stays off unless
# FORCED: the H200 (0ef4da5, the one-token pass 0.13 ms slower with it; its 2-5-token passes level as they should).
SLOWER_ON = ("H200",)


def _forced() -> bool:
    return env_switch(ENV, False)  # OPENJET_CUDA_Q6B=1: on every GPU, those of SLOWER_ON too


FORCED = _forced()


def on_for(dev: Device) -> bool:
    """Whether the form is on for this GPU: ON, and FORCED or a GPU outside SLOWER_ON."""
    return ON and (FORCED or not any(part in dev.info.name for part in SLOWER_ON))
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
    """Whether a Q6_K launch on the int8 activations takes mmvq_q6_i8b: on for this GPU (on_for), sm_90+, one
    token, rows of MIN_COLS or more, and its shared memory within the GPU's opt-in maximum."""
    if not (on_for(dev) and dev.info.arch >= i8b.MIN_ARCH and w.qtype == Q.Q6_K and num_tokens == 1
            and w.cols >= MIN_COLS):
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


# ---- the verify rows: 2-8 tokens (mmvq_q6_i8v) ----
# The verify passes' Q6_K ffn_downs on the tensor copies at these token counts, in halves (half a row of T tokens
# staged: 17.5 KB a token at 34 superblocks), each superblock decoded once for all T, where they run mmvq_q6_i8 (1-4
# tokens) and the f16 two-pass kernels (5-8: ~43 us a launch, ~1.7 TB/s on an H100, bench/NOTES.md Z26). Empty by
# default: on an H100 its 5-token launches took 41.5 us against the f16 kernel's 41.6-43.0, the pass no faster
# (bench/NOTES.md Z28); the H200 not yet timed (bench variants q6v, q6v5). OPENJET_CUDA_Q6V=1 turns on every count
# it is built for.
VERIFY_ENV = "OPENJET_CUDA_Q6V"


def _verify_default() -> frozenset[int]:
    return frozenset(Q6V_TOKENS) if env_switch(VERIFY_ENV, False) else frozenset()


DEFAULT_VERIFY_AT = _verify_default()
VERIFY_AT = DEFAULT_VERIFY_AT


def verify_x_bytes(nb: int, num_tokens: int) -> int:
    """Mirror of kernels/mmvq_i8q6b.cu q6v_x_bytes: a block's staged activations of nb superblocks, T tokens."""
    return (2 * num_tokens * (256 * nb + 64) + 8 * num_tokens * nb + 1023) // 1024 * 1024


def verify_smem_bytes(nb: int, num_tokens: int, warps: int) -> int:
    """Dynamic shared memory of a launch in halves over rows of nb superblocks: the block's staged (larger) half of
    the row of T tokens and every warp's ring."""
    s, ns = Q6V_SHAPE
    return i8b.ALIGN_SLACK + verify_x_bytes(nb - nb // 2, num_tokens) + warps * ns * s * (QL_BYTES + QH_BYTES
                                                                                         + WORD_BYTES)


def verify_static_smem(num_tokens: int) -> int:
    """The kernel's static shared memory (its sums, 2 x 8 warps x 2 x T x 16 floats, and the barriers) and the
    driver's reserve, per block."""
    return 2048 * num_tokens + 2048


def verify_warps(dev: Device, w: DeviceWeight, num_tokens: int) -> int:
    """Warps a block of a launch in halves: warps(w), fewer where its shared memory would not fit (the staged rows
    grow with T), 0 where not even one warp's does."""
    limit = dev.info.max_smem_per_block - verify_static_smem(num_tokens)
    nb = w.cols // 256
    return next((n for n in range(warps(w), 0, -1) if verify_smem_bytes(nb, num_tokens, n) <= limit), 0)


def verify_runs(dev: Device, w: DeviceWeight, num_tokens: int, act: Act) -> bool:
    """Whether a Q6_K launch of num_tokens takes mmvq_q6_i8v in halves: a count of VERIFY_AT, sm_90+, rows of
    MIN_COLS or more (ffn_down's), the int8 copy of those tokens written, and a block's shared memory within the
    GPU's opt-in maximum."""
    return (num_tokens in VERIFY_AT and dev.info.arch >= i8b.MIN_ARCH and w.qtype == Q.Q6_K
            and w.cols >= MIN_COLS and act.q8 is not None and act.i8_tokens >= num_tokens
            and verify_warps(dev, w, num_tokens) > 0)


def launch_verify(dev: Device, w: DeviceWeight, q8: Buffer, scale8: Buffer, y: Buffer, bias: Buffer | None,
                  residual: Buffer | None, num_tokens: int, ld_y: int, y2: Buffer) -> None:
    """One launch of mmvq_q6_i8v walking half-tiles (i8b.halves_grid): y [T, ld_y] = the first half of every row's
    superblocks + bias + residual, y2 the second half's sums."""
    tiles, nb, num_warps = (w.rows + 15) // 16, w.cols // 256, verify_warps(dev, w, num_tokens)
    kernel = dev.kernel(f"mmvq_q6_K_i8v_t{num_tokens}_halves")
    smem = verify_smem_bytes(nb, num_tokens, num_warps)
    dev.set_max_dynamic_smem(kernel, smem)
    blocks = i8b.halves_grid(dev, tiles, num_warps, smem, verify_static_smem(num_tokens), SPARE_PER_SM)
    ql, qh = plane_maps(w)
    dev.launch(kernel, blocks, 32 * num_warps,
               [ql, qh, w.buf, q8, scale8, y, bias, residual, w.rows, w.cols, ld_y, y2], smem=smem)
