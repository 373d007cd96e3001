"""The tensor-copy int8 Q4_K matmuls (sm_90+): of one token (kernels/mmvq_i8b.cu) and of a verify pass's 2-8 tokens
(kernels/mmvq_i8v.cu): their switches, shapes, tensor maps and launchers. ops.matmul takes the first in place of
mmvq_i8 where runs() says so, and the second where verify_runs() says so (in place of mmvq_i8 at 2-4 tokens, of
the f16 kernels at 5-8).

On by default where it runs (OPENJET_CUDA_I8B=0 keeps mmvq_i8): on the H200 the 27B pass at one token took 8.32 ms
with it against 8.44 without in the same run, 8.04 against 8.26 in fast mode (bench/NOTES.md v16); with its grid
leaving a block an SM free and the producers fused in front of it, 7.99 ms (v17); in blocks of 4 warps, with the
producers launched apart on a block per token, 7.19 ms (v19). (The fused producers lost from then on and were
removed: bench/NOTES.md Z30.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf import GGMLQuantizationType as Q

from engine.cuda import env_switch, tma
from engine.cuda.instances import (I8B_HALVES_SHAPES, I8B_SHAPES, I8V_HALVES_TOKENS,
                                    I8V_MAX_WARPS, I8V_SHAPE, I8V_TOKENS, I8V_WIDE_SHAPE, I8V_WIDE_TOKENS,
                                    I8V_WIDE_WARPS)

if TYPE_CHECKING:
    from engine.cuda.device import Buffer, Device
    from engine.cuda.ops import Act, DeviceWeight

ENV = "OPENJET_CUDA_I8B"
MIN_ARCH = 90  # tensor copies (cp.async.bulk.tensor) and mbarrier transaction counts
QUANT_BYTES, WORD_BYTES = 2048, 256  # a unit's quant box and word unit (mirror of the kernel's)
MAX_WARPS = 8  # the kernel's I8B_MAX_WARPS
VERIFY_MAX_WARPS = I8V_MAX_WARPS
ALIGN_SLACK = 1024  # the kernel aligns its regions to 1024 bytes (the 128-byte swizzle) at run time


def _default() -> bool:
    return env_switch(ENV, True)


ON = _default()
# (superblocks a stage, stages a warp): one of instances.I8B_SHAPES. (3, 2): a 5,120-wide tile's share of 5
# superblocks a warp in 2 stages, not 3, and two 69 KB blocks an SM with one spare (against three of 51 KB): the
# 27B one-token pass 7.561 ms against 7.659 with (2, 2) on an H100 (bench/NOTES.md Z21; v16 had (2, 2) faster
# alone, 32.6 against 40.7 us for gate | up, with the producers fused in front).
DEFAULT_SHAPE = (3, 2)
SHAPE = DEFAULT_SHAPE
# The shape of the launches of WIDE_WARPS blocks (rows of ops.WIDE_COLS or more: ffn_down, one 8-warp block an SM);
# None: SHAPE. A bench knob (variants i8bdown8s5, i8bdown8s2n3): (3, 2) keeps 24 superblocks in flight an SM there
# (55 KB), (5, 2) 40 and (2, 3) 32, for a GPU whose SMs need more bytes in flight to reach its bandwidth.
WIDE_SHAPE: tuple[int, int] | None = None
WARPS: int | None = None  # warps per block; None: WIDE_WARPS, else ops.i8_warps' choice for mmvq_i8
# Warps per block for rows of ops.WIDE_COLS or more (ffn_down; None: ops.i8_warps' choice, 4): a block an SM, each
# warp a share of 8-9 superblocks (Z24: 0.08 ms a pass faster on an H100 than ffn_down on mmvq_i8).
DEFAULT_WIDE_WARPS: int | None = 8
WIDE_WARPS = DEFAULT_WIDE_WARPS
# True: a grid of as many blocks as fit at once (or fewer, each the same number of tiles), each walking its tiles
# with the activations staged once; False: a block a tile.
PERSIST = True
# Blocks an SM the walking grid leaves free (0: all it holds): room for what runs beside it (Device.beside: a
# projection's small parts, DeltaNet's Q8_0 alpha | beta and attention's Q6_K attn_v). 1 made the 27B pass at
# one token 8.07 ms against 8.26 with every SM full (bench/NOTES.md v17).
DEFAULT_SPARE_PER_SM = 1
SPARE_PER_SM = DEFAULT_SPARE_PER_SM
# The widest rows (superblocks) it takes; None: every width. ffn_down's 68 superblocks stage 38 KB of activations
# a block, which leaves fewer blocks an SM: in 4-warp blocks 21.3 us against mmvq_i8's 18.8 alone, so rows of up to
# 24 took it until Z24; in 8-warp blocks (WIDE_WARPS: one an SM, 107 blocks of 3 tiles) the 27B one-token pass
# took 7.233 / 7.230 ms against 7.307 / 7.313 on mmvq_i8 (H100, fdf1daa, variant i8bdown8; bench/NOTES.md Z24).
DEFAULT_MAX_SUPERBLOCKS: int | None = None
MAX_SUPERBLOCKS: int | None = DEFAULT_MAX_SUPERBLOCKS
STATIC_SMEM = 2048 + 1024  # the kernel's static shared memory and the driver's reserve, per block


def x_bytes(nb: int) -> int:
    """Mirror of kernels/mmvq_i8b.cu i8b_x_bytes: the block's staged activations of nb superblocks."""
    return (256 * nb + 64 + 256 * nb + 16 * nb + 32 * nb + 1023) // 1024 * 1024


def smem_bytes(nb: int, warps: int, shape: tuple[int, int]) -> int:
    """Dynamic shared memory of a launch: the staged activations and every warp's ring."""
    s, ns = shape
    return ALIGN_SLACK + x_bytes(nb) + warps * ns * s * (QUANT_BYTES + WORD_BYTES)


def resident(dev: Device, warps: int, smem: int, static: int = STATIC_SMEM, spare: int | None = None) -> int:
    """Blocks of the walking grid resident at once: as many an SM as fit (smem dynamic and `static` bytes of
    shared memory a block) less `spare` (SPARE_PER_SM), at least one."""
    spare = SPARE_PER_SM if spare is None else spare
    per_sm = max(1, min(64 // warps, (dev.info.max_smem_per_block + 1024) // (smem + static)) - spare)
    return per_sm * dev.info.multiprocessors


# Whether the walking grid takes every resident block (the first tiles % blocks one tile more), not the fewest
# that give every block the same tiles. With two blocks an SM, gate | up's 2,176 tiles run on 242 blocks of 9: 110
# SMs stream 18 tiles and 22 SMs 9; on all 264, no SM more than 17 (one block of 9, one of 8). A bench knob (variant
# fill) until timed.
FILL = False


def grid(dev: Device, tiles: int, warps: int, smem: int, static: int = STATIC_SMEM,
         spare: int | None = None) -> int:
    """Blocks of a launch: one a tile, or (PERSIST) as many as are resident at once, fewer where that leaves every
    block the same number of tiles (unless FILL)."""
    if not PERSIST:
        return tiles
    blocks = resident(dev, warps, smem, static, spare)
    if FILL:
        return min(tiles, blocks)
    per_block = -(-tiles // blocks)
    return -(-tiles // per_block)


# A launch in halves (instances.I8B_HALVES_SHAPES; ops.OUT_HALVES): where its grid leaves a block this much of a
# whole grid's tiles, or less. The mixers' output projections (320 tiles; three 72 KB blocks fit an SM, one is
# spared: 264 resident) run 2 tiles a block on 160 blocks whole and 3 half-tiles (1.5 tiles) on 214 in halves;
# gate | up's 2,176 run 9 tiles a block or 8.5, attn_q's 768 3 either way.
HALVES_GAIN = 0.85


def halves_grid(dev: Device, tiles: int, warps: int, smem: int, static: int = STATIC_SMEM,
                spare: int | None = None) -> int:
    """Blocks of a launch in halves: the walking grid over 2 x tiles half-tiles, even (each block keeps the half
    of its index's parity), within the resident blocks."""
    blocks = grid(dev, 2 * tiles, warps, smem, static, spare)  # (odd only on a walking grid: else a block a half)
    if blocks % 2:
        blocks += 1 if blocks < resident(dev, warps, smem, static, spare) else -1
    return blocks


def shape(w: DeviceWeight) -> tuple[int, int]:
    """The instance shape of a one-token launch on w: WIDE_SHAPE for rows that take WIDE_WARPS, else SHAPE."""
    from engine.cuda import ops

    return WIDE_SHAPE if WIDE_SHAPE and WIDE_WARPS and not WARPS and w.cols >= ops.WIDE_COLS else SHAPE


def halves_pay(dev: Device, w: DeviceWeight) -> bool:
    """Whether w's one-token launch would walk fewer tiles' work a block in halves (HALVES_GAIN): only in the shapes
    built for it, and on a walking grid."""
    from engine.cuda import ops

    if shape(w) not in I8B_HALVES_SHAPES or not PERSIST:
        return False
    tiles, nb, num_warps = (w.rows + 15) // 16, w.cols // ops.SUPERBLOCK, warps(dev, w)
    smem = smem_bytes(nb, num_warps, shape(w))
    whole = -(-tiles // grid(dev, tiles, num_warps, smem))
    halves = -(-2 * tiles // halves_grid(dev, tiles, num_warps, smem))  # half-tiles a block, at most
    return halves / 2 <= HALVES_GAIN * whole


def runs(dev: Device, w: DeviceWeight, num_tokens: int, act: Act) -> bool:
    """Whether a matmul takes mmvq_i8b: on, sm_90+, a Q4_K weight, one token whose int8 copy the last producer
    of act wrote, and its shared memory within the GPU's opt-in maximum."""
    return act.i8_tokens >= 1 and _takes(dev, w, num_tokens)


def warps(dev: Device, w: DeviceWeight) -> int:
    """Warps per block of a launch on w: WARPS, else WIDE_WARPS for rows of ops.WIDE_COLS or more, else mmvq_i8's
    choice; never more than the superblocks."""
    from engine.cuda import ops

    tiles, nb = (w.rows + 15) // 16, w.cols // ops.SUPERBLOCK
    wide = WIDE_WARPS if w.cols >= ops.WIDE_COLS else None
    return min(WARPS or wide or ops.i8_warps(w.cols, tiles, 1, dev.info.multiprocessors), nb, MAX_WARPS)


def _takes(dev: Device, w: DeviceWeight, num_tokens: int) -> bool:
    from engine.cuda import ops

    if not (ON and dev.info.arch >= MIN_ARCH and w.qtype == Q.Q4_K and num_tokens == 1):
        return False
    if MAX_SUPERBLOCKS is not None and w.cols // ops.SUPERBLOCK > MAX_SUPERBLOCKS:
        return False
    return smem_bytes(w.cols // ops.SUPERBLOCK, ops.MMVQ_WARPS, shape(w)) <= dev.info.max_smem_per_block


def quant_map(w: DeviceWeight) -> tma.TensorMap:
    """The tensor map of w's quant plane (repack: [rows][nb x 128] bytes first in the buffer): boxes of 16 rows x
    128 bytes, 128-byte swizzle, rows past the end read as zeros."""
    row_bytes = w.cols // 256 * 128
    return tma.encode(w.buf.ptr, "u8", (row_bytes, w.rows), (row_bytes,), (128, 16), 128)


def launch(dev: Device, w: DeviceWeight, group8: tuple[Buffer, Buffer, Buffer, Buffer], y: Buffer,
           bias: Buffer | None, residual: Buffer | None, y2: Buffer | None = None) -> None:
    """One launch of mmvq_i8b: blocks of warps walking 16-row tiles (grid), each warp a contiguous share of the
    row; its activations the int8 copy group8; with y2, walking half-tiles (halves_grid), the second half of every
    row's superblocks summed into y2 (y: the first half + bias + residual)."""
    from engine.cuda import ops

    s, ns = shape(w)
    assert (s, ns) in I8B_SHAPES, f"no mmvq_i8b instance for {(s, ns)}"
    assert y2 is None or (s, ns) in I8B_HALVES_SHAPES, f"{w.name}: no mmvq_i8b instance in halves for {(s, ns)}"
    tiles, nb, num_warps = (w.rows + 15) // 16, w.cols // ops.SUPERBLOCK, warps(dev, w)
    name = f"mmvq_q4_K_i8b_s{s}n{ns}" + ("_halves" if y2 is not None else "")
    q8, scale8, sums8, sums8_lo = group8
    kernel, smem = dev.kernel(name), smem_bytes(nb, num_warps, (s, ns))
    dev.set_max_dynamic_smem(kernel, smem)
    args = [quant_map(w), w.buf, q8, scale8, sums8, sums8_lo, y, bias, residual, w.rows, w.cols, y2]
    blocks = grid(dev, tiles, num_warps, smem) if y2 is None else halves_grid(dev, tiles, num_warps, smem)
    dev.launch(kernel, blocks, 32 * num_warps, args, smem=smem)


# ---- 2 to 8 tokens (kernels/mmvq_i8v.cu) ----
# Every token of a verify pass multiplied on the nibbles of one decoded weight box, where the f16 kernels of 5-8
# tokens run a second pass for the residue. On by default (OPENJET_CUDA_I8V=0: off): the 27B pass at 2 / 5 tokens
# 8.68 / 10.97 ms against 9.19 / 11.37 without it (H200, b689f66; bench/NOTES.md v18).
VERIFY_ENV = "OPENJET_CUDA_I8V"


def _verify_default() -> bool:
    return env_switch(VERIFY_ENV, True)


VERIFY_ON = _verify_default()
# The widest rows it takes, as MAX_SUPERBLOCKS for one token: its staged activations grow with T (56 KB at 5
# tokens and 20 superblocks), ffn_down's 68 superblocks would leave one small block an SM.
DEFAULT_VERIFY_MAX_SUPERBLOCKS = 24
VERIFY_MAX_SUPERBLOCKS = DEFAULT_VERIFY_MAX_SUPERBLOCKS
# Warps a block (None: by token count, VERIFY_WARPS_AT) and blocks an SM its walking grid leaves free. Its blocks are
# large (the staged activations of every token), so one spared block is half an SM: alone, at 5 tokens, its first
# form's gate|up took 63.8 us with one spared against 45.3 without (29ff206, bench/NOTES.md v18).
VERIFY_WARPS: int | None = None
# Whether a launch leaves out the warps its shares of a tile's superblocks leave idle (a benchmark knob: they only
# wait at the tile's barrier and hold a ring's shared memory)
VERIFY_TRIM = True
DEFAULT_VERIFY_SPARE_PER_SM = 0
VERIFY_SPARE_PER_SM = DEFAULT_VERIFY_SPARE_PER_SM
# Warps a block by token count where VERIFY_WARPS is None (others: mmvq_i8's choice, ops.i8_warps): the kernel's
# most from 3 tokens on, as many as fit (verify_warps), 10 busy at K = 5,120 and 12 at 6,144. The 27B pass (H100,
# 3d5a955, variant i8vw12) at 2 / 4 / 5 tokens 8.143 / 8.197 / 9.678 ms against 8.166 / 8.901 / 10.202 with mmvq_i8's
# choice at 2 and 4 (5 warps) and 8 from 5 tokens (bench/NOTES.md Z5). At 2 tokens mmvq_i8's 5 (two blocks an SM):
# level with 12 on the H100, and on the H200 6.849 ms against 7.507 (fd8d60b, variant i8vw8old; Z19).
DEFAULT_VERIFY_WARPS_AT = {t: VERIFY_MAX_WARPS for t in I8V_TOKENS if t > 2}
VERIFY_WARPS_AT = dict(DEFAULT_VERIFY_WARPS_AT)
# The token counts it takes (of instances.I8V_TOKENS), in precise mode: every one. 3 stayed on mmvq_i8 while its
# blocks were of 5 warps (27B pass 8.88 ms against 9.36, 36e18fb); in 12-warp blocks, with PDL at 3 tokens
# (device.DEFAULT_PDL_TOKEN_COUNTS), 8.341 against 8.706 (H100 87c4e46, variant i8v3pdl). In fast mode
# (OPENJET_CUDA_PRECISE=0) 5-8 tokens had stayed on the f16 kernels, which need no residue pass there and no int8 copy
# from the producers (~2 us a producer launch at 5 tokens): the 27B pass at 5 tokens 9.59 ms against 10.32 with it
# (b689f66). Since its blocks of 12 warps it wins there too: fast mode's 5-token pass 8.863 ms against 9.589 on the
# f16 kernels (H100 c077727, variant fastall; 6-8 not timed apart), and at 3 tokens 8.006 against 8.974 on mmvq_i8
# under PDL (bfaa203; variant fast24 the counts before, 2 and 4). So both modes take every count.
DEFAULT_VERIFY_TOKENS = frozenset({2, 3, 4, 5, 6, 7, 8})
VERIFY_TOKENS = DEFAULT_VERIFY_TOKENS
DEFAULT_VERIFY_FAST_TOKENS = DEFAULT_VERIFY_TOKENS
VERIFY_FAST_TOKENS = DEFAULT_VERIFY_FAST_TOKENS
# The token counts launched in the wide form (instances.I8V_WIDE_TOKENS: blocks of up to 24 warps, one superblock a
# stage). From 3 tokens one block fills an SM, and at K = 5,120 its 12 warps run 10 busy
# in shares of 2: the SM's issue slots were 47 % busy at 5 tokens with 2.5 warps a scheduler, none eligible half
# the cycles (bench/results/ncu-2026-12-06-c45671c-i8v-t5-gate-up-h100.txt), and 10 busy warps against 7 took
# gate | up at 5 tokens from 48.2 to 41.7 us (bench/NOTES.md Z5). In shares of one, 20 warps. Empty until a GPU
# has timed it (bench variants wide, wide5).
DEFAULT_VERIFY_WIDE_TOKENS: frozenset[int] = frozenset()
VERIFY_WIDE_TOKENS = DEFAULT_VERIFY_WIDE_TOKENS


def verify_wide(num_tokens: int) -> bool:
    """Whether a launch of num_tokens takes the wide form."""
    return num_tokens in VERIFY_WIDE_TOKENS and num_tokens in I8V_WIDE_TOKENS


def verify_x_bytes(nb: int, num_tokens: int) -> int:
    """Mirror of kernels/mmvq_i8v.cu i8v_x_bytes: both levels of every token ([nb][256] at a pitch of 256 nb +
    64), a 32-byte sums record and 8 bytes of level scales a superblock and token, in whole KB."""
    return (2 * num_tokens * (256 * nb + 64) + 40 * num_tokens * nb + 1023) // 1024 * 1024


def verify_static_smem(num_tokens: int, wide: bool = False) -> int:
    """A block's static shared memory (its per-tile sums, 2 x its most warps x 64 bytes a token, and barriers)
    and the driver's reserve."""
    return 2048 + 128 * (I8V_WIDE_WARPS if wide else VERIFY_MAX_WARPS) * num_tokens


def verify_smem_bytes(nb: int, num_tokens: int, warps: int, wide: bool = False) -> int:
    """Dynamic shared memory of a launch of num_tokens tokens: the staged activations and every warp's ring."""
    s, ns = I8V_WIDE_SHAPE if wide else I8V_SHAPE
    return ALIGN_SLACK + verify_x_bytes(nb, num_tokens) + warps * ns * s * (QUANT_BYTES + WORD_BYTES)


def verify_token_counts(precise: bool) -> frozenset[int]:
    """The token counts it takes in precise or fast mode."""
    return VERIFY_TOKENS if precise else VERIFY_FAST_TOKENS


def verify_tokens(dev: Device, precise: bool = True) -> int:
    """The most tokens whose int8 copy the producers must write for it (in precise or fast mode), or 0 where it
    does not run (off, or before sm_90)."""
    return max(verify_token_counts(precise), default=0) if VERIFY_ON and dev.info.arch >= MIN_ARCH else 0


def verify_runs(dev: Device, w: DeviceWeight, num_tokens: int, act: Act, halves: bool = False) -> bool:
    """Whether a matmul takes mmvq_i8v: it and the int8 matmuls on, sm_90+, a Q4_K weight of rows up to
    VERIFY_MAX_SUPERBLOCKS (halves: any width whose half fits), a token count it takes in the act's mode (precise:
    act has the f16 residue; at most 8, so one token group) whose int8 copy the last producer of act wrote, and
    its shared memory within the GPU's opt-in maximum."""
    from engine.cuda import ops

    if not (VERIFY_ON and ops.I8_MATMUL and dev.info.arch >= MIN_ARCH and w.qtype == Q.Q4_K):
        return False
    counts = verify_token_counts(act.x16_lo is not None)
    if act.i8_tokens != num_tokens or num_tokens not in I8V_TOKENS or num_tokens not in counts:
        return False
    if halves and num_tokens not in I8V_HALVES_TOKENS:
        return False
    nb, wide = w.cols // ops.SUPERBLOCK, not halves and verify_wide(num_tokens)
    staged = verify_staged(nb, halves)
    smem = (verify_smem_bytes(staged, num_tokens, verify_warps(dev, w, num_tokens, wide, halves), wide)
            + verify_static_smem(num_tokens, wide))
    return (halves or nb <= VERIFY_MAX_SUPERBLOCKS) and smem <= dev.info.max_smem_per_block


def verify_staged(nb: int, halves: bool) -> int:
    """The superblocks of a row a block stages: all, or in halves the larger half (mmvq_half: the second)."""
    return nb - nb // 2 if halves else nb


def verify_warps(dev: Device, w: DeviceWeight, num_tokens: int, wide: bool = False, halves: bool = False) -> int:
    """Warps per block: VERIFY_WARPS, else (wide) the wide form's most, else VERIFY_WARPS_AT's for num_tokens,
    else mmvq_i8's choice for num_tokens (ops.i8_warps); never more than the form's most (VERIFY_MAX_WARPS,
    I8V_WIDE_WARPS), nor than the warps its shares of a tile's superblocks (halves: of the block's half) keep busy
    (20 superblocks in shares of 3 take 7 warps of 8), nor than leave the block within the GPU's shared memory
    (each warp's ring is 9 KB: at 8 tokens and K = 6,144 11 fit, 8 of them busy in shares of 3)."""
    from engine.cuda import ops

    tiles, nb = (w.rows + 15) // 16, verify_staged(w.cols // ops.SUPERBLOCK, halves)
    most = I8V_WIDE_WARPS if wide else VERIFY_MAX_WARPS
    chosen = VERIFY_WARPS or (most if wide else None) or VERIFY_WARPS_AT.get(num_tokens) or ops.i8_warps(
        w.cols, tiles, num_tokens, dev.info.multiprocessors)

    def busy(n: int) -> int:
        return -(-nb // -(-nb // n)) if VERIFY_TRIM else n

    warps = busy(min(chosen, nb, most))
    while warps > 1 and (verify_smem_bytes(nb, num_tokens, warps, wide) + verify_static_smem(num_tokens, wide)
                         > dev.info.max_smem_per_block):
        warps = busy(warps - 1)
    return warps


def launch_verify(dev: Device, w: DeviceWeight, group8: tuple[Buffer, Buffer, Buffer, Buffer], y: Buffer,
                  bias: Buffer | None, residual: Buffer | None, num_tokens: int, ld_y: int,
                  y2: Buffer | None = None) -> None:
    """One launch of mmvq_i8v for num_tokens (2-8) tokens: mmvq_i8b's walking grid, y and residual [T, ld_y]; with
    y2, in halves (each block a half-tile: the first half's sums + bias + residual into y, the second's into
    y2)."""
    from engine.cuda import ops

    halves = y2 is not None
    wide = not halves and verify_wide(num_tokens)
    tiles, staged = (w.rows + 15) // 16, verify_staged(w.cols // ops.SUPERBLOCK, halves)
    num_warps = verify_warps(dev, w, num_tokens, wide, halves)
    name = (f"mmvq_q4_K_i8v_t{num_tokens}_halves" if halves else f"mmvq_q4_K_i8v_t{num_tokens}_wide" if wide
            else f"mmvq_q4_K_i8v_t{num_tokens}")
    kernel, smem = dev.kernel(name), verify_smem_bytes(staged, num_tokens, num_warps, wide)
    dev.set_max_dynamic_smem(kernel, smem)
    q8, scale8, sums8, sums8_lo = group8
    args = [quant_map(w), w.buf, q8, scale8, sums8, sums8_lo, y, bias, residual, w.rows, w.cols, ld_y, y2]
    static = verify_static_smem(num_tokens, wide)
    blocks = (halves_grid(dev, tiles, num_warps, smem, static, VERIFY_SPARE_PER_SM) if halves
              else grid(dev, tiles, num_warps, smem, static, VERIFY_SPARE_PER_SM))
    dev.launch(kernel, blocks, 32 * num_warps, args, smem=smem)
