"""The prefill matmul: which GEMM kernel multiplies a chunk of tokens, and its launch.

From MIN_TOKENS tokens on, a weight type with a GEMM instance multiplies the chunk with it instead of the mmvq
kernels (ops.matmul asks `launch` first): gemm_cp (kernels/gemm.cu, mma.sync with cp.async-staged operands) where
its shared memory fits the GPU's per-block maximum, the plain gemm otherwise, and on sm_90 the warp-specialised
wgmma kernel (kernels/gemm_ws.cu) for matmuls of WS_AUTO_TOKENS tokens or more, or whichever warpgroup-MMA form
OPENJET_CUDA_GEMM_WG asks for. prefill_tokens sizes the prefill's chunk to match. Where gemm_ws multiplies gate | up,
its SwiGLU form stores silu(gate) * up as ffn_down's input itself (swiglu_instance, launch_swiglu).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gguf import GGMLQuantizationType as Q

from engine.cuda import env_flag, tma
from engine.cuda.device import Buffer, Device
from engine.cuda.instances import (ARCH_FEATURE_FILES, GEMM_CP_QTYPES, GEMM_QTYPES, GEMM_WG_QTYPES, STAGE_SHAPE,
                                   qtype_tag)

if TYPE_CHECKING:
    from engine.cuda.ops import DeviceWeight

MIN_TOKENS = 16  # from this many tokens on, a GEMM type runs the prefill GEMM instead of mmvq
TOKENS = 32  # tokens per gemm / gemm_cp block (kernels/gemm.cu: GEMM_NG groups of 8)
ROWS = 128  # rows per gemm / gemm_cp block
STAGES, ACT_BYTES = 2, 16384  # gemm_cp's slots and each slot's activations (kernels/gemm.cu)
# The staged GEMM where a type has one (off: every type through the plain gemm; the bench compares the two).
STAGED = True
INSTANCES = {qt: f"gemm_{qtype_tag(qt)}" for qt in GEMM_QTYPES}
CP_INSTANCES = {qt: f"gemm_{qtype_tag(qt)}_cp" for qt in GEMM_CP_QTYPES}


def cp_smem(qtype: Q) -> int:
    """gemm_cp's dynamic shared memory: STAGES slots of 8 weight tiles and the activations."""
    return STAGES * (8 * STAGE_SHAPE[qtype][1] + ACT_BYTES)


def runs_cp(qtype: Q, max_smem: int) -> bool:
    """Whether a prefill matmul of this type takes gemm_cp: on, a type with it, and its shared memory within the
    GPU's opt-in maximum per block."""
    return STAGED and qtype in GEMM_CP_QTYPES and cp_smem(qtype) <= max_smem


# The prefill matmul on warpgroup MMA (kernels/gemm_wg.cu: sm_90a, 128 rows x 128 tokens a block of two
# warpgroups): OPENJET_CUDA_GEMM_WG=1 (each superblock drained), 2 (overlapped), 3 (warp-specialised: producer
# warpgroups decode each weight tile once into shared memory for two consumer warpgroups, gemm_ws.cu) or 4 (the
# same on a persistent grid, a block an SM walking the tiles) runs it in place of gemm_cp for its types from
# WG_MIN_TOKENS tokens on; 0 never. Unset, the default policy: mode 4 for matmuls of WS_AUTO_TOKENS tokens or more
# (None: never), gemm_cp below, and the prefill in chunks of WS_PREFILL_TOKENS where gemm_ws runs (on sm_90). The
# 256-row gemm_ws beats gemm_cp by 23-50 % at 8,192 tokens on every 27B shape, by -7 to +16 % at 2,048, and loses at
# 512 (bench/NOTES.md Z17, H100); the 27B prefill of 8,192 tokens in chunks of 4,096 on it: 4,249 tok/s against
# 3,588 in chunks of 512 on gemm_cp (chunks of 8,192: 4,282, twice the workspace), the greedy tokens equal. With its
# activations by tensor copies and Q4_K's constants kept (Z18): 370-382 TFLOP/s on the Q4_K shapes at 8,192, level
# with gemm_cp at 512 (ahead on ffn_up and attn_q, behind on ffn_down), the prefill of 8,192 tokens 5,178 tok/s.
WG_ENV = "OPENJET_CUDA_GEMM_WG"
WG_MIN_TOKENS = 64
WS_AUTO_TOKENS: int | None = 2048
WS_PREFILL_TOKENS = 4096
WG_ROWS, WG_TOKENS, WG_THREADS = 128, 128, 256
WG_SMEM = 2 * (8 * 4096 + 16 * WG_TOKENS * 32) + 128  # gemm_wg.cu WG_SMEM_BYTES
WS_THREADS = 512  # gemm_ws.cu WS_THREADS: two producer warpgroups, two consumers
WS_SMEM = 227 * 1024  # gemm_ws.cu WS_SMEM_MAX: its slots' count is a build option, each build within it
WG_MODES = {1: "", 2: "_o", 3: "_ws", 4: "_ws"}  # OPENJET_CUDA_GEMM_WG -> instance suffix
WS_PERSISTENT = 4  # the mode that runs gemm_ws on a block an SM walking the tiles (else a block a tile)


def wg_mode() -> int | None:
    """OPENJET_CUDA_GEMM_WG: None (unset: the default policy), 0, 1, 2, 3 or 4; anything else is an error naming
    the variable."""
    value = os.environ.get(WG_ENV)
    if value is None:
        return None
    if value not in ("0", "1", "2", "3", "4"):
        raise ValueError(f"{WG_ENV}={value!r}: expected 0 (off), 1 (drained), 2 (overlapped), 3 "
                         "(warp-specialised) or 4 (warp-specialised, persistent)")
    return int(value)


WG = wg_mode()


def mode_for(num_tokens: int) -> int:
    """The OPENJET_CUDA_GEMM_WG mode a matmul of num_tokens takes: the variable's, else the default policy's."""
    if WG is not None:
        return WG
    return WS_PERSISTENT if WS_AUTO_TOKENS is not None and num_tokens >= WS_AUTO_TOKENS else 0


def wg_instance(arch: int, qtype: Q, num_tokens: int, cols: int, has_bias: bool) -> str | None:
    """The gemm_wg instance a prefill matmul takes, or None: asked for (mode_for), the GPU its file is built for
    (sm_90), a type with it, enough tokens, whole superblocks, no bias (it adds a residual only)."""
    mode = mode_for(num_tokens)
    if (not mode or ARCH_FEATURE_FILES["gemm_wg"] != arch or qtype not in GEMM_WG_QTYPES
            or num_tokens < WG_MIN_TOKENS or cols % 256 or has_bias):
        return None
    return f"gemm_wg_{qtype_tag(qtype)}{WG_MODES[mode]}"


def prefill_tokens(arch: int) -> int:
    """The prefill chunk (the workspace's tokens) for a GPU: WS_PREFILL_TOKENS where a chunk of that many takes
    gemm_ws there (it gains only from ~2,048 tokens a matmul; ~0.45 MB of workspace a token at the 27B shape), else
    512."""
    if ARCH_FEATURE_FILES["gemm_ws"] == arch and WG_MODES.get(mode_for(WS_PREFILL_TOKENS)) == "_ws":
        return WS_PREFILL_TOKENS
    return 512


def ws_define(name: str, default: int) -> int:
    """A gemm_ws build option (gemm_ws.cu's #define) as OPENJET_CUDA_DEFINES sets it, else its default there."""
    from engine.cuda.nvrtc import kernel_options

    values = [o.split("=", 1)[1] for o in kernel_options() if o.startswith(f"-D{name}=")]
    return int(values[-1]) if values else default


def ws_rows() -> int:
    """gemm_ws's rows a tile: 256, or 128 where OPENJET_CUDA_DEFINES builds it with WS_ROWS=128 (gemm_ws.cu)."""
    return ws_define("WS_ROWS", 256)


def b_map(x16: Buffer, num_tokens: int, cols: int) -> tma.TensorMap:
    """gemm_ws's B (its default build, WS_TMA_B=1; unused at 0): the act layout's f16 values as a 4-D tensor, innermost
    first a step's 16 halves of a token (32 bytes), the group's 8 tokens 32 bytes apart, the steps of the row 256
    bytes apart, the 8-token groups nsb x 4,096 bytes apart; a box is a chunk's steps of a 128-token tile (16 groups),
    in 32-byte swizzle (gemm_ws.cu wg_desc_sw32). Tokens past the last group read as zeros."""
    steps, nsb, groups = 16 // ws_define("WS_CHUNKS", 4), cols // 256, (num_tokens + 7) // 8
    return tma.encode(x16.ptr, "f16", (16, 8, nsb * 16, groups), (32, 256, nsb * 4096), (16, 8, steps,
                                                                                         WG_TOKENS // 8), 32)


# gate | up's gemm_ws storing silu(gate) * up into ffn_down's input itself (instances gemm_wg_<qt>_ws_swiglu) where
# the prefill runs it, in place of act_swiglu reading back the f32 rows (bench/NOTES.md Z19);
# OPENJET_CUDA_GEMM_SWIGLU=0: the two launches.
SWIGLU_ENV = "OPENJET_CUDA_GEMM_SWIGLU"
SWIGLU = env_flag(SWIGLU_ENV, True)


def swiglu_instance(arch: int, w: DeviceWeight, num_tokens: int) -> str | None:
    """The gemm_ws instance that multiplies gate | up (w: the gate's rows, then as many of up's) and stores the
    SwiGLU of the sums, or None: SWIGLU on, gemm_ws where this matmul would run it, 256-row tiles, and each half a
    whole number of superblocks."""
    if not SWIGLU or w.rows % (2 * 256):
        return None
    wg = wg_instance(arch, w.qtype, num_tokens, w.cols, False)  # its types and token counts (WG_MIN_TOKENS on)
    return wg + "_swiglu" if wg is not None and wg.endswith("_ws") and ws_rows() == 256 else None


def launch_swiglu(dev: Device, w: DeviceWeight, x16: Buffer, out16: Buffer, num_tokens: int) -> None:
    """out16 (the act layout's f16 values of w.rows / 2 positions) = silu(gate) * up of x16 @ w^T, gate the first
    half of w's rows and up the second, on swiglu_instance's kernel (which must not be None)."""
    name = swiglu_instance(dev.info.arch, w, num_tokens)
    assert name is not None, f"{w.name}: no gemm_ws with SwiGLU behind it for {num_tokens} tokens"
    _launch_ws(dev, name, w, x16, out16, None, num_tokens, 0)


def _launch_ws(dev: Device, name: str, w: DeviceWeight, x16: Buffer, y: Buffer, residual: Buffer | None,
               num_tokens: int, ld_y: int) -> None:
    """A gemm_ws instance: one dimension of tiles (gemm_ws.cu WsWalk), a block each or a block an SM."""
    kernel, tile_rows = dev.kernel(name), ws_rows()
    grid = ((w.rows + tile_rows - 1) // tile_rows * ((num_tokens + WG_TOKENS - 1) // WG_TOKENS),)
    if mode_for(num_tokens) == WS_PERSISTENT:
        grid = (min(grid[0], dev.info.multiprocessors),)
    dev.set_max_dynamic_smem(kernel, WS_SMEM)
    dev.launch(kernel, grid, WS_THREADS, [b_map(x16, num_tokens, w.cols), w.buf, x16, y, residual, w.rows, w.cols,
                                          num_tokens, ld_y], smem=WS_SMEM)


def launch(dev: Device, w: DeviceWeight, x16: Buffer, y: Buffer, num_tokens: int, ld_y: int, bias: Buffer | None,
           residual: Buffer | None) -> bool:
    """y[T, rows] = x16 (the act layout's f16 values) @ w^T (+ bias) (+ residual) on a prefill GEMM, if w's type
    has one and there are MIN_TOKENS tokens or more; False (nothing launched) where the mmvq kernels must run."""
    if w.qtype not in INSTANCES or num_tokens < MIN_TOKENS:
        return False
    wg = wg_instance(dev.info.arch, w.qtype, num_tokens, w.cols, bias is not None)
    if wg is not None and wg.endswith("_ws"):
        _launch_ws(dev, wg, w, x16, y, residual, num_tokens, ld_y)
        return True
    if wg is not None:  # row tiles along x (gemm_wg.cu: the blocks in flight share a token tile)
        kernel = dev.kernel(wg)
        grid = ((w.rows + WG_ROWS - 1) // WG_ROWS, (num_tokens + WG_TOKENS - 1) // WG_TOKENS)
        dev.set_max_dynamic_smem(kernel, WG_SMEM)
        dev.launch(kernel, grid, WG_THREADS, [w.buf, x16, y, residual, w.rows, w.cols, num_tokens, ld_y],
                   smem=WG_SMEM)
        return True
    grid = ((num_tokens + TOKENS - 1) // TOKENS, (w.rows + ROWS - 1) // ROWS)
    args = [w.buf, x16, y, bias, residual, w.rows, w.cols, num_tokens, ld_y]
    if runs_cp(w.qtype, dev.info.max_smem_per_block):
        kernel, smem = dev.kernel(CP_INSTANCES[w.qtype]), cp_smem(w.qtype)
        dev.set_max_dynamic_smem(kernel, smem)
        dev.launch(kernel, grid, 128, args, smem=smem)
    else:
        dev.launch(dev.kernel(INSTANCES[w.qtype]), grid, 128, args)
    return True
