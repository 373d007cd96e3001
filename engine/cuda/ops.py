"""One launcher per kernel (grid, block, argument unpacking) and the dispatch table keyed by (op, qtype).

Launchers take Buffers and sizes, check what a kernel cannot check cheaply, and launch on the device's stream;
they never synchronise. Shapes in comments are logical: [T, K] means T rows of K values, row stride given.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace
from gguf import GGMLQuantizationType as Q

from engine.cuda import env_flag, env_switch, gemm, i8b, persist, q6b
from engine.cuda.device import Buffer, Device
from engine.cuda.instances import (ACT_MODES, ACT_STAGES, EMBED_QTYPES, HALVES_TOKENS, I8_MAX_TOKENS, I8V_HALVES_TOKENS,
                                   MATMUL_QTYPES, PERSIST_QTYPES, STAGE_SHAPE, STAGED_QTYPES, qtype_tag)
from engine.cuda.repack import block_layout, device_nbytes

MMVQ_WARPS = 8
# "plain": the register-pipelined mmvq only; "cp": the cp.async-pipelined one wherever it can; "persist": the
# persistent stream-K one wherever it can (not the default until measured: bench/NOTES.md v8)
MMVQ_ENV = "OPENJET_CUDA_MMVQ"
# "cpa": mmvq_cpa, the activations staged beside the weights (up to 4 tokens; cp above); "cpa2": the same with
# two row tiles a block sharing them
PIPELINE_KERNELS: dict[str, tuple[Q, ...]] = {"cp": STAGED_QTYPES, "cpa": STAGED_QTYPES, "cpa2": STAGED_QTYPES,
                                              "persist": PERSIST_QTYPES}
STAGED_TILES = {"cpa": 1, "cpa2": 2}  # row tiles per block of each staged-activation kernel
# Where a pipelined mmvq beat the register-pipelined one at the 27B shapes (H200, bench/NOTES.md v7 and v8):
# (type, precise) -> (most tokens per launch, kernel) steps, the first step covering a launch's T used. Precise
# mode up to 4 tokens: mmvq_cp with the residue in the mma's spare columns (5-25 % faster). Precise Q4_K at 5-8
# tokens: the persistent kernel's two-pass mode (6-16 % faster than cp or plain there; cp and plain tie at 1-4
# tokens with it). Fast Q4_K and precise Q6_K above 4 tokens: plain (the others 1-14 % slower); fast Q6_K up to 4
# tokens mmvq_cp (5-12 % faster on output and attn_v, 1 % slower on ffn_down: a net gain per pass). Staged
# activations (cpa, bench/NOTES.md v10), both types: one token in either mode (27B pass 10.99 -> 9.79 ms precise,
# 10.49 -> 9.33 fast) and two fast tokens (10.82 -> 10.33); precise at two tokens and both modes at three it lost
# (11.37 -> 11.58, 11.79 -> 13.91 precise): its per-unit copies of the 2T columns outgrow the weights' L2 traffic.
DEFAULT_PIPELINE_TABLE: dict[tuple[Q, bool], tuple[tuple[int, str], ...]] = {
    (Q.Q4_K, True): ((1, "cpa"), (4, "cp"), (8, "persist")), (Q.Q4_K, False): ((2, "cpa"),),
    (Q.Q6_K, True): ((1, "cpa"), (4, "cp")), (Q.Q6_K, False): ((2, "cpa"), (4, "cp"))}
PIPELINE_TABLE = dict(DEFAULT_PIPELINE_TABLE)
TABLE_QTYPES = frozenset(q for q, _ in DEFAULT_PIPELINE_TABLE)


@dataclass(slots=True)
class DeviceWeight:
    """A weight matrix [rows, cols] in the device layout (repack.PLANES), or a plain f32/f16 matrix."""

    buf: Buffer
    qtype: Q
    rows: int
    cols: int
    name: str = ""


ACT_GROUP = 8  # tokens per act group (the mma's N)
SUPERBLOCK = 256


@dataclass(slots=True)
class Act:
    """Activations of up to max_tokens rows of `width` values, prepared for the matmuls.

    x16 holds them in the act layout (kernels/mmvq.cu: groups of 8 tokens, each nsb * 4096 bytes, positions in the
    canonical fragment order, zero past width) and sums the f16 sums of 32-wide sub-blocks (nsb * 128 bytes per
    group); f32 holds the plain rows [T, ld] (the f32-weight path reads those).
    """

    x16: Buffer
    sums: Buffer
    f32: Buffer
    width: int
    ld: int
    max_tokens: int
    sums_lo: Buffer | None = None  # the sums' f16 rounding residue (always allocated by alloc_act)
    x16_lo: Buffer | None = None  # precise mode: f16(x - f16(x)) in the same layout, a second pass of the mma
    # the int8 copy for kernels/mmvq_i8.cu (q8 [groups][nsb][2][8][256], scale8, sums8, sums8_lo), written by
    # the producers of up to I8_TOKENS tokens while I8_MATMUL is on; i8_tokens: how many the last one wrote
    q8: Buffer | None = None
    scale8: Buffer | None = None
    sums8: Buffer | None = None
    sums8_lo: Buffer | None = None
    i8_tokens: int = 0
    row_inv: Buffer | None = None  # [max_tokens] f32: RMSNorm's 1 / rms a token, for producers of several groups
    # every matrix reading these has a prefill GEMM (gemm.INSTANCES), which reads x16 alone: a producer of
    # gemm.MIN_TOKENS tokens or more leaves x16_lo unwritten (the workspace sets it from the model's types)
    gemm_only: bool = False

    @property
    def num_superblocks(self) -> int:
        """Superblocks of 256 positions per row."""
        return (self.width + SUPERBLOCK - 1) // SUPERBLOCK

    def group(self, index: int) -> tuple[Buffer, Buffer, Buffer | None, Buffer | None]:
        """(act, sums, act_lo, sums_lo) views of token group `index` (act_lo None unless precise)."""
        nsb = self.num_superblocks
        act_lo = self.x16_lo.view(index * nsb * 4096) if self.x16_lo else None
        return (self.x16.view(index * nsb * 4096), self.sums.view(index * nsb * 128), act_lo,
                self.sums_lo.view(index * nsb * 128))


    def group8(self, index: int) -> tuple[Buffer, Buffer, Buffer, Buffer]:
        """(q8, scale8, sums8, sums8_lo) views of token group `index`."""
        nsb = self.num_superblocks
        return (self.q8.view(index * nsb * 4096), self.scale8.view(index * nsb * 64),
                self.sums8.view(index * nsb * 128), self.sums8_lo.view(index * nsb * 128))

    def buffers(self) -> list[Buffer]:
        """Every buffer of these activations, to free them (f32 included: leave it out where the caller
        passed its own to alloc_act)."""
        return [b for b in (self.x16, self.sums, self.f32, self.sums_lo, self.x16_lo, self.q8, self.scale8,
                            self.sums8, self.sums8_lo, self.row_inv) if b is not None]


def _mmvq_instance(qtype: Q) -> str:
    """Dispatch: weight type -> mmvq instance."""
    if qtype not in MATMUL_QTYPES:
        raise ValueError(f"no CUDA matmul for weight type {qtype.name}")
    return f"mmvq_{qtype_tag(qtype)}"


# (op, qtype) -> instance name: the one place a run-time type picks a template instance.
DISPATCH: dict[tuple[str, Q], str] = {("mmvq", qt): _mmvq_instance(qt) for qt in MATMUL_QTYPES}
DISPATCH.update({("mmvq_x2", qt): _mmvq_instance(qt) + "_x2" for qt in MATMUL_QTYPES})
DISPATCH[("mmvq", Q.F32)] = "mmv_f32"
DISPATCH.update({("get_rows", qt): f"get_rows_{qtype_tag(qt)}" for qt in EMBED_QTYPES})
# The small parts of a projection (DeltaNet's alpha | beta: 96 rows, 6 blocks) on a second stream beside the large
# one (weights.Projection.run); OPENJET_CUDA_BESIDE=0: every launch in one stream.
BESIDE_ENV = "OPENJET_CUDA_BESIDE"
BESIDE = env_flag(BESIDE_ENV, True)


class ActSrc(ctypes.Structure):
    """Mirror of struct ActSrc in kernels/act.cu."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("x", "x2", "w", "out32")] + [
        (n, ctypes.c_int32) for n in ("ldx", "ldx2", "ld_out32", "head")] + [("eps", ctypes.c_float),
                                                                              ("x_sum", ctypes.c_uint64),
                                                                              ("part_ml", ctypes.c_uint64)] + [
        (n, ctypes.c_int32) for n in ("splits", "num_heads", "gate_head_stride")]


class Act8(ctypes.Structure):
    """Mirror of struct Act8 in kernels/act.cu (all zero: no int8 copy)."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("q", "scale", "sums", "sums_lo")]


# Producer modes whose launches of one token group (up to 8 tokens) take the act_<mode>_g1 instance
# (__launch_bounds__(256, 1)): all of them. RMSNorm's row loads then fly together (bench/NOTES.md v15: T = 5
# 12.32 -> 11.38 ms); the others made the pass 0.03-0.05 ms faster than with their ACT_MIN_BLOCKS bound (v16,
# bench variant g1rms: RMSNorm's only, the v15 default).
ACT_ONE_GROUP_DEFAULT = frozenset(ACT_MODES)
ACT_ONE_GROUP_MODES = ACT_ONE_GROUP_DEFAULT
# Token counts (of one group) whose producers run each token on blocks of its own (act_<mode>_t1): a block of a
# 5-token RMSNorm reduced five rows and formed five tokens' levels one after another (7.0 us a launch with the
# int8 copy), T blocks of one token each take 2.8; and the one-token instance (PER = 1: no 8-wide arrays, no
# zeros for the group's other slots) 2.6 against act_<mode>_g1's 4.2 (bench/NOTES.md v19).
ACT_SPLIT_DEFAULT = frozenset(range(1, ACT_GROUP + 1))
ACT_SPLIT_TOKENS = ACT_SPLIT_DEFAULT


@dataclass(frozen=True, slots=True)
class Producer:
    """The op that makes a matmul's input (kernels/act.cu ACT_MODES), not yet launched: produce() launches it
    into an Act (matmul(producer=...) just before the matmul). out32: the f32 rows too, for the f32-weight path of
    the matmul it feeds."""

    mode: str
    src: ActSrc


def rmsnorm_of(x: Buffer, w: Buffer, ld_in: int, eps: float, out32: Buffer | None = None, ld_out32: int = 0,
               add: tuple[Buffer, Buffer] | None = None) -> Producer:
    """RMSNorm(x) * w over rows of the act's width (see act_rmsnorm). add (a, b): the rows are a + b instead (a
    matmul's halves, matmul(y2=)), which the producer also stores into x (same strides)."""
    if add is None:
        return Producer("rmsnorm", ActSrc(x.ptr, 0, w.ptr, _p(out32), ld_in, 0, ld_out32, 0, eps))
    a, b = add
    assert x.ptr not in (a.ptr, b.ptr), "the sum goes to a row of its own: every block reads both halves whole"
    return Producer("rmsnorm", ActSrc(a.ptr, b.ptr, w.ptr, _p(out32), ld_in, ld_in, ld_out32, 0, eps, x.ptr))


def gatednorm_of(o: Buffer, z: Buffer, w: Buffer, head: int, ld_o: int, ld_z: int, eps: float,
                 out32: Buffer | None = None, ld_out32: int = 0) -> Producer:
    """RMSNorm(o per head of `head` values) * w[head] * silu(z) (see act_gatednorm)."""
    if head % 32 or SUPERBLOCK % head:
        raise ValueError(f"gated norm heads of {head} values: need a multiple of 32 dividing {SUPERBLOCK}")
    return Producer("gatednorm", ActSrc(o.ptr, z.ptr, w.ptr, _p(out32), ld_o, ld_z, ld_out32, head, eps))


def plain_of(x: Buffer, ld_in: int, out32: Buffer | None = None, ld_out32: int = 0) -> Producer:
    """x itself (see act_f16)."""
    return Producer("plain", ActSrc(x.ptr, 0, 0, _p(out32), ld_in, 0, ld_out32, 0, 0.0))


def produce(dev: Device, producer: Producer, act: Act, num_tokens: int) -> None:
    """Launch the producer into act (its out32 rows at act.ld where the caller gave no stride)."""
    src = producer.src
    if src.out32 and not src.ld_out32:
        src = ActSrc.from_buffer_copy(src)  # (every field kept: Z23's lost x_sum)
        src.ld_out32 = act.ld
    _act_from(dev, producer.mode, src, act, num_tokens)


def _act_from(dev: Device, mode: str, src: ActSrc, act: Act, num_tokens: int) -> None:
    """Launch act_<mode>: one block per (superblock, group of 8 tokens), or per (superblock, token) where
    ACT_SPLIT_TOKENS has the count; the int8 copy too where the int8 matmul will read it."""
    assert 1 <= num_tokens <= act.max_tokens, f"{num_tokens} tokens for activations of {act.max_tokens}"
    groups = (num_tokens + ACT_GROUP - 1) // ACT_GROUP
    act.i8_tokens = _i8_written(dev, act, num_tokens)
    i8 = act.i8_tokens > 0
    a8 = Act8(act.q8.ptr, act.scale8.ptr, act.sums8.ptr, act.sums8_lo.ptr) if i8 else Act8()
    if num_tokens in ACT_SPLIT_TOKENS:
        name, slices = f"act_{mode}_t1", num_tokens
    else:
        name, slices = (f"act_{mode}_g1" if groups == 1 and mode in ACT_ONE_GROUP_MODES else f"act_{mode}"), groups
    row_inv = None  # a Buffer (a pointer argument), or None: the producer reduces its rows itself
    if mode == "rmsnorm" and groups > 1 and act.row_inv is not None:  # each row reduced once, not by every block
        row_inv = act.row_inv
        dev.launch(dev.kernel("act_row_inv"), (num_tokens,), 256, [src, row_inv, act.width])
    x16_lo = None if act.gemm_only and num_tokens >= gemm.MIN_TOKENS else act.x16_lo
    dev.launch(dev.kernel(name), (act.num_superblocks, slices), 256,
               [src, act.x16, act.sums, x16_lo, act.sums_lo, a8, row_inv, num_tokens, act.width])


def _i8_written(dev: Device, act: Act, num_tokens: int) -> int:
    """The tokens of the int8 copy a producer of num_tokens writes into act: all where an int8 matmul of its
    width may read them, else none."""
    return num_tokens if I8_MATMUL and act.q8 is not None and num_tokens <= _i8_copy_tokens(dev, act) else 0


# Whether the producers leave out the int8 copy of counts that only mmvq_i8v takes where no matmul of the act's width
# can run it (wider than i8b.VERIFY_MAX_SUPERBLOCKS: SwiGLU's 17,408 for ffn_down, on the f16 kernels from 5 tokens).
# bench variant copyall: written at every count, as before.
I8_COPY_BY_WIDTH = True


def _i8_copy_tokens(dev: Device, act: Act) -> int:
    """The most tokens of act's mode an int8 matmul of its width takes (mmvq_i8 up to I8_TOKENS, mmvq_q6_i8 its
    counts, mmvq_i8v where it runs and takes that width, whole or in halves at VERIFY_HALVES_AT's counts,
    mmvq_q6_i8v at q6b.VERIFY_AT's): up to that many, the producers write the int8 copy too."""
    verify = i8b.verify_tokens(dev, act.x16_lo is not None)
    if I8_COPY_BY_WIDTH and act.num_superblocks > i8b.VERIFY_MAX_SUPERBLOCKS:
        verify = min(verify, max(VERIFY_HALVES_AT | q6b.VERIFY_AT, default=0))
    return max(I8_TOKENS, max(Q6_I8_COUNTS, default=0), verify)


def _p(buf: Buffer | None) -> int:
    return 0 if buf is None else buf.ptr


def act_f16(dev: Device, x: Buffer, act: Act, num_tokens: int, ld_in: int, out32: Buffer | None = None) -> None:
    """act = x [T, width] (row stride ld_in), rounded into the act layout; out32 optionally gets a copy."""
    produce(dev, plain_of(x, ld_in, out32, act.ld), act, num_tokens)


def act_rmsnorm(dev: Device, x: Buffer, w: Buffer, act: Act, num_tokens: int, ld_in: int, eps: float,
                out32: Buffer | None = None) -> None:
    """act = RMSNorm(x) * w over rows of `width`; out32 ([T, act.ld] f32) optionally gets the normed rows."""
    produce(dev, rmsnorm_of(x, w, ld_in, eps, out32, act.ld), act, num_tokens)


def act_swiglu(dev: Device, gate: Buffer, up: Buffer, act: Act, num_tokens: int, ld_in: int,
               out32: Buffer | None = None) -> None:
    """act = silu(gate) * up (both [T, width] with row stride ld_in)."""
    _act_from(dev, "swiglu", ActSrc(gate.ptr, up.ptr, 0, _p(out32), ld_in, ld_in, act.ld, 0, 0.0), act, num_tokens)


def act_gatednorm(dev: Device, o: Buffer, z: Buffer, w: Buffer, act: Act, num_tokens: int, head: int, ld_o: int,
                  ld_z: int, eps: float, out32: Buffer | None = None) -> None:
    """act = RMSNorm(o per head of `head` values) * w[head] * silu(z) (the DeltaNet output norm)."""
    produce(dev, gatednorm_of(o, z, w, head, ld_o, ld_z, eps, out32, act.ld), act, num_tokens)


def matmul(dev: Device, w: DeviceWeight, act: Act, y: Buffer, num_tokens: int, ld_y: int,
           bias: Buffer | None = None, residual: Buffer | None = None, producer: Producer | None = None,
           y2: Buffer | None = None) -> None:
    """y[T, rows] = act[T, cols] @ w^T (+ bias[rows]) (+ residual[T, rows]); 8 tokens per launch.

    y and residual are f32 [T, ld_y]; residual may be y itself (each element is read once before it is written).
    producer: the op that makes act, launched first; it must not read y.
    y2: where splits_in_halves says so, the launch's second half of every row's superblocks goes there (y then
    holds the first half + bias + residual, and the result is y + y2: rmsnorm_of(add=) forms it); must be None
    elsewhere.
    """
    assert 1 <= num_tokens <= act.max_tokens, f"{w.name}: {num_tokens} tokens for {act.max_tokens}"
    if w.cols != act.width:
        raise ValueError(f"{w.name}: {w.cols} columns but activations of width {act.width}")
    if producer is not None:
        assert y.ptr not in (producer.src.x, producer.src.x2, producer.src.x_sum), \
            f"{w.name}: the producer reads (or writes) the matmul's output"
        produce(dev, producer, act, num_tokens)
    if gemm.launch(dev, w, act.x16, y, num_tokens, ld_y, bias, residual):
        return
    if y2 is not None and verify_halves(dev, w, act, num_tokens):  # (2-8 tokens: one group)
        i8b.launch_verify(dev, w, act.group8(0), y, bias, residual, num_tokens, ld_y, y2=y2)
        return
    if y2 is not None and q6b.verify_runs(dev, w, num_tokens, act):  # (the Q6_K ffn_downs of those)
        q8, scale8, _, _ = act.group8(0)
        q6b.launch_verify(dev, w, q8, scale8, y, bias, residual, num_tokens, ld_y, y2)
        return
    precise = act.x16_lo is not None and w.qtype != Q.F32
    instance = DISPATCH.get(("mmvq_x2" if precise else "mmvq", w.qtype))
    if instance is None:
        raise ValueError(f"{w.name}: no CUDA matmul for {w.qtype.name}")
    kernel = dev.kernel(instance)
    for t0 in range(0, num_tokens, ACT_GROUP):
        t = min(ACT_GROUP, num_tokens - t0)
        y_t = y.view(4 * t0 * ld_y)
        res_t = residual.view(4 * t0 * ld_y) if residual is not None else None
        pipelined = _group_kernel(dev, w, act, num_tokens, t)
        assert y2 is None or pipelined in ("i8", "i8q6", "i8b"), \
            f"{w.name}: no launch in halves at {num_tokens} tokens"
        if pipelined == "i8b":
            i8b.launch(dev, w, act.group8(0), y_t, bias, res_t, y2=y2)
            continue
        if pipelined == "i8v":
            i8b.launch_verify(dev, w, act.group8(0), y_t, bias, res_t, t, ld_y)
            continue
        if pipelined == "i8":
            _mmvq_i8(dev, w, act.group8(0), y_t, bias, res_t, t, ld_y, y2)
            continue
        if pipelined == "i8q6":
            _mmvq_q6_i8(dev, w, act.group8(0), y_t, bias, res_t, t, ld_y, y2)
            continue
        if pipelined is not None:
            group = act.group(t0 // ACT_GROUP)
            if pipelined == "persist":
                _mmvq_persist(dev, w, group, y_t, bias, res_t, t, ld_y, precise)
            else:
                _mmvq_pipelined(dev, w, group, y_t, bias, res_t, t, ld_y, precise, STAGED_TILES.get(pipelined, 0))
            continue
        if w.qtype == Q.F32:
            x_t = act.f32.view(4 * t0 * act.ld)
            dev.launch(kernel, (w.rows + 7) // 8, 256, [w.buf, x_t, y_t, bias, res_t, w.rows, w.cols, t, act.ld, ld_y])
            continue
        x_t, s_t, xlo_t, slo_t = act.group(t0 // ACT_GROUP)
        grid = (w.rows + 15) // 16
        dev.launch(kernel, grid, 32 * _mmvq_warps(w.cols),
                   [w.buf, x_t, s_t, xlo_t, slo_t, y_t, bias, res_t, w.rows, w.cols, t, ld_y])


def _group_kernel(dev: Device, w: DeviceWeight, act: Act, num_tokens: int, t: int) -> str | None:
    """The mmvq that a group of t of a matmul's num_tokens tokens runs: "i8b", "i8v", "i8" or "i8q6" (int8
    activations), a pipelined one (PIPELINE_KERNELS), or None for the plain one."""
    if q6_i8_runs(dev, w, num_tokens, act):
        return "i8q6"
    if i8b.verify_runs(dev, w, num_tokens, act):  # (2-8 tokens: one group, t == num_tokens)
        return "i8v"
    if i8_runs(w.qtype, num_tokens, act, dev.info.max_smem_per_block):
        return "i8b" if i8b.runs(dev, w, num_tokens, act) else "i8"
    return pipeline_kernel(w.qtype, act.x16_lo is not None and w.qtype != Q.F32, t)


def runs_persist(dev: Device, w: DeviceWeight, act: Act, num_tokens: int) -> bool:
    """Whether matmul(w, act, num_tokens) launches the persistent mmvq, whose partials and counts (persist.scratch)
    are one per device: such a launch must not run beside another one (Device.beside)."""
    if w.qtype in gemm.INSTANCES and num_tokens >= gemm.MIN_TOKENS:
        return False
    return any(_group_kernel(dev, w, act, num_tokens, min(ACT_GROUP, num_tokens - t0)) == "persist"
               for t0 in range(0, num_tokens, ACT_GROUP))


def _default_pipelined() -> tuple[frozenset[Q], bool, str]:
    """(types that may run a pipelined mmvq, whether one kernel everywhere or each where PIPELINE_TABLE says it
    is faster, which kernel when everywhere), from OPENJET_CUDA_MMVQ: unset = the table, "plain" = never, "cp" or
    "persist" = that kernel everywhere."""
    import os

    mode = os.environ.get(MMVQ_ENV, "")
    if mode not in ("", "plain", *PIPELINE_KERNELS):
        raise ValueError(f"{MMVQ_ENV}={mode!r}: expected 'plain', {', '.join(map(repr, PIPELINE_KERNELS))} (or unset)")
    if mode in PIPELINE_KERNELS:
        return frozenset(PIPELINE_KERNELS[mode]), True, mode
    return (frozenset() if mode == "plain" else TABLE_QTYPES), False, "cp"


PIPELINED, PIPELINE_EVERYWHERE, PIPELINE_KERNEL = _default_pipelined()


def set_pipelined(qtypes: frozenset[Q] | set[Q], everywhere: bool = False, kernel: str = "cp") -> None:
    """Choose the types that may run a pipelined mmvq, and whether `kernel` ("cp" or "persist") at every T and
    mode or each pipelined kernel only where PIPELINE_TABLE says it measured faster (benchmarks and checks
    compare them with the plain one); captured graphs keep their kernels."""
    global PIPELINED, PIPELINE_EVERYWHERE, PIPELINE_KERNEL
    if kernel not in PIPELINE_KERNELS:
        raise ValueError(f"no pipelined mmvq {kernel!r}: expected one of {', '.join(PIPELINE_KERNELS)}")
    unknown = set(qtypes) - set(PIPELINE_KERNELS[kernel] if everywhere else TABLE_QTYPES)
    if unknown:
        raise ValueError(f"no {kernel} mmvq for {', '.join(sorted(q.name for q in unknown))}")
    PIPELINED, PIPELINE_EVERYWHERE, PIPELINE_KERNEL = frozenset(qtypes), everywhere, kernel


def pipeline_state() -> tuple[frozenset[Q], bool, str]:
    """The current choice, as set_pipelined takes it (to restore it after a comparison)."""
    return PIPELINED, PIPELINE_EVERYWHERE, PIPELINE_KERNEL


def pipeline_kernel(qtype: Q, precise: bool, num_tokens: int) -> str | None:
    """The pipelined mmvq ("cp", "persist") a launch of num_tokens (<= 8) rows of this type runs, or None for
    the plain one."""
    if qtype not in PIPELINED:
        return None
    if PIPELINE_EVERYWHERE:
        return PIPELINE_KERNEL
    return next((kernel for most, kernel in PIPELINE_TABLE.get((qtype, precise), ()) if num_tokens <= most), None)


ACT_SLOT_PITCH, ACT_ZERO_BYTES = 544, 512  # mirror of kernels/mmvq.cuh
# Staged activations only where two blocks still fit an SM (228 KB, 1 KB reserved per block): at 4 precise
# tokens a stage grows by 4.4 KB and one block a SM streams slower than cp's two.
ACT_MAX_BLOCK_SMEM = 113 * 1024


def staged_act_bytes(qtype: Q, num_tokens: int, precise: bool) -> int:
    """Mirror of kernels/mmvq.cuh staged_act_bytes: what a stage of mmvq_cpa adds for the activations and sums."""
    slots = 2 * num_tokens if precise else num_tokens
    return ACT_SLOT_PITCH * slots + (32 * num_tokens if qtype in (Q.Q4_K, Q.Q5_K) else 0)


def _staged_warp_bytes(qtype: Q, num_tokens: int, precise: bool, tiles: int = 1) -> int:
    """Shared memory per warp of mmvq_cpa: its stages (each tile's weights, then the activations) and the zero
    row."""
    stage = tiles * STAGE_SHAPE[qtype][1] + staged_act_bytes(qtype, num_tokens, precise)
    return ACT_STAGES * stage + ACT_ZERO_BYTES


def staged_act_fits(qtype: Q, num_tokens: int, precise: bool, warps: int, tiles: int = 1,
                    max_smem: int = ACT_MAX_BLOCK_SMEM) -> bool:
    """Whether a launch of num_tokens may stage its activations: packed columns (at most 4 tokens), two blocks
    of `warps` warps in one SM, and no more than the GPU's opt-in maximum per block (max_smem)."""
    limit = min(ACT_MAX_BLOCK_SMEM, max_smem)
    return num_tokens <= 4 and warps * _staged_warp_bytes(qtype, num_tokens, precise, tiles) <= limit


def _mmvq_pipelined(dev: Device, w: DeviceWeight, group: tuple[Buffer, Buffer, Buffer | None, Buffer | None],
                    y: Buffer, bias: Buffer | None, residual: Buffer | None, t: int, ld_y: int, precise: bool,
                    staged_tiles: int = 0) -> None:
    """One launch of mmvq_cp for up to 8 tokens: precise mode packs the activations' residue into the mma's
    spare columns for t <= 4 (cp_hl) and runs it as a second mma above that (cp_x2). staged_tiles 1 or 2: the
    activations travel in the weight stages (mmvq_cpa, that many row tiles a block) where they fit, up to 4
    tokens."""
    act, sums, act_lo, sums_lo = group  # act: [nsb][16 steps][8 tokens][16] f16
    tiles = (w.rows + 15) // 16
    stages, stage_bytes = STAGE_SHAPE[w.qtype]
    if staged_tiles:
        blocks = -(-tiles // staged_tiles)
        warps = _pipelined_warps(w.cols, blocks, dev.info.multiprocessors)
        if staged_act_fits(w.qtype, t, precise, warps, staged_tiles, dev.info.max_smem_per_block):
            name = f"cpa{'2' if staged_tiles == 2 else ''}{'_hl' if precise else ''}"
            kernel = dev.kernel(f"mmvq_{qtype_tag(w.qtype)}_{name}")
            smem = warps * _staged_warp_bytes(w.qtype, t, precise, staged_tiles)
            dev.set_max_dynamic_smem(kernel, smem)
            dev.launch(kernel, blocks, 32 * warps, [w.buf, act, sums, act_lo, sums_lo, y, bias, residual, w.rows,
                                                    w.cols, t, ld_y], smem=smem)
            return
    variant = "cp" if not precise else "cp_hl" if t <= 4 else "cp_x2"
    kernel = dev.kernel(f"mmvq_{qtype_tag(w.qtype)}_{variant}")
    warps = _pipelined_warps(w.cols, tiles, dev.info.multiprocessors)
    dev.set_max_dynamic_smem(kernel, MMVQ_WARPS * stages * stage_bytes)
    dev.launch(kernel, tiles, 32 * warps, [w.buf, act, sums, act_lo, sums_lo, y, bias, residual, w.rows, w.cols, t,
                                           ld_y], smem=warps * stages * stage_bytes)


def _mmvq_persist(dev: Device, w: DeviceWeight, group: tuple[Buffer, Buffer, Buffer | None, Buffer | None],
                  y: Buffer, bias: Buffer | None, residual: Buffer | None, t: int, ld_y: int, precise: bool) -> None:
    """One launch of mmvq_persist for up to 8 tokens (mmvq_cp's column modes): one wave of warps over the whole
    matrix, each streaming an equal share of its superblocks (engine/cuda/persist.py)."""
    act, sums, act_lo, sums_lo = group  # act: [nsb][16 steps][8 tokens][16] f16
    variant = "persist" if not precise else "persist_hl" if t <= 4 else "persist_x2"
    kernel = dev.kernel(f"mmvq_{qtype_tag(w.qtype)}_{variant}")
    grid, warps, smem = persist.plan(dev, kernel, *STAGE_SHAPE[w.qtype], w.rows, w.cols)
    partials, counts = persist.scratch(dev, (w.rows + 15) // 16)
    assert 2 * grid * warps * persist.TILE_BYTES <= partials.nbytes, "more warps than share slots"
    dev.launch(kernel, grid, 32 * warps, [w.buf, act, sums, act_lo, sums_lo, y, bias, residual, partials, counts,
                                          w.rows, w.cols, t, ld_y], smem=smem)


# ---- int8 activations (kernels/mmvq_i8.cu) ----
# Q4_K launches of up to I8_TOKENS tokens multiply int8 activations (two levels: 1.5e-5 of each superblock's
# largest value) by the unconverted nibbles, in fast and precise mode: on the H200 the 27B pass at 1 / 2 / 3
# tokens took 9.36 / 10.30 / 10.20 ms against the f16 kernels' 9.69 / 11.17 / 11.56 (bench/NOTES.md v12). The
# 5-token instance (a second mma) is built and checked but not used: per kernel it beat the persistent two-pass
# kernel on rows of 24+ superblocks only, and the pass with it there (and the producers' int8 copy of 5 tokens)
# was slower, 13.53 against 13.33 ms. OPENJET_CUDA_I8=0 keeps every matmul on f16.
I8_ENV = "OPENJET_CUDA_I8"
I8_QTYPES = (Q.Q4_K,)
DEFAULT_I8_TOKENS = 4
I8_TOKENS = DEFAULT_I8_TOKENS
I8_STAGE_BASE, I8_SLOT_BYTES, I8_ZERO_BYTES = 2816, 336, 256  # mirror of kernels/mmvq_i8.cu and i8q4k.cuh
# Warps per block; None: I8_WARPS_AT, else _pipelined_warps. 4 (instead of its 5 at K = 5120) ran gate|up 1.1 x
# faster alone but the pass no faster (9.39 against 9.36 ms), so the benchmark only compares it.
I8_WARPS: int | None = None
# Warps per block by token count, where a launch of that many tokens should not take _pipelined_warps' choice
# (mmvq_i8, and mmvq_i8b at one token). 4-warp blocks beat 5 alone at one token on every 27B shape (bench/NOTES.md
# v15); with the producers launched apart, {1: 4} made the 1-token pass 7.37 -> 7.19 ms (v19; bench variant apart:
# none). 4 everywhere made the 2-token pass slower (v14).
DEFAULT_I8_WARPS_AT = {1: 4}
I8_WARPS_AT: dict[int, int] = dict(DEFAULT_I8_WARPS_AT)
# ... and for rows of at least WIDE_COLS (ffn_down's 17,408: 68 superblocks, 17 a warp in 4-warp blocks, where
# K = 5,120 leaves a warp 5), where set: more warps give each a shorter chain of units (the benchmark's dw<n>
# variants compare them; empty until measured). Q4_K (mmvq_i8, mmvq_i8v's fallback) and Q6_K (mmvq_q6_i8, whose
# larger stages fit fewer blocks an SM) each have their own.
WIDE_COLS = 8192
DEFAULT_I8_WIDE_WARPS_AT: dict[int, int] = {}
I8_WIDE_WARPS_AT: dict[int, int] = dict(DEFAULT_I8_WIDE_WARPS_AT)
DEFAULT_Q6_I8_WIDE_WARPS_AT: dict[int, int] = {}
Q6_I8_WIDE_WARPS_AT: dict[int, int] = dict(DEFAULT_Q6_I8_WIDE_WARPS_AT)
# Row tiles a block walks in sequence (instances.I8_TILE_COUNTS): each warp then streams TILES x its superblocks
# of a row through one ring (4-5 at K = 5,120 with one tile). 1 until the longer blocks are measured.
I8_TILES = 1


def _i8_default() -> bool:
    return env_switch(I8_ENV, True)


I8_MATMUL = _i8_default()


def set_i8(on: bool, tokens: int | None = None) -> None:
    """Switch the int8 matmul on or off, and optionally the most tokens a launch sends through it (at most
    instances.I8_MAX_TOKENS); captured graphs keep their kernels, and producers write the int8 copy only
    while it is on."""
    global I8_MATMUL, I8_TOKENS
    if tokens is not None and not 1 <= tokens <= I8_MAX_TOKENS:
        raise ValueError(f"int8 matmul for {tokens} tokens: built for 1 to {I8_MAX_TOKENS}")
    I8_MATMUL = bool(on)
    I8_TOKENS = tokens or I8_TOKENS


def i8_stage_bytes(num_tokens: int) -> int:
    """Mirror of kernels/mmvq_i8.cu i8_stage_bytes."""
    slots = 2 * num_tokens
    return I8_STAGE_BASE + I8_SLOT_BYTES * slots + -(-4 * slots // 16) * 16


def _i8_smem(num_tokens: int, warps: int) -> int:
    return warps * (ACT_STAGES * i8_stage_bytes(num_tokens) + I8_ZERO_BYTES)


def i8_runs(qtype: Q, num_tokens: int, act: Act, max_smem: int) -> bool:
    """Whether a matmul takes mmvq_i8: on, a Q4_K weight, at most I8_TOKENS tokens whose int8 copy the last
    producer of `act` wrote, and its shared memory within the GPU's opt-in maximum per block."""
    most = I8_TOKENS if I8_TILES == 1 else min(I8_TOKENS, 4)  # instances.py: several tiles up to 4 tokens
    if not (I8_MATMUL and qtype in I8_QTYPES and num_tokens <= min(most, act.i8_tokens)):
        return False
    return _i8_smem(num_tokens, MMVQ_WARPS) <= min(ACT_MAX_BLOCK_SMEM, max_smem)


def _mmvq_i8(dev: Device, w: DeviceWeight, group8: tuple[Buffer, Buffer, Buffer, Buffer], y: Buffer,
             bias: Buffer | None, residual: Buffer | None, t: int, ld_y: int, y2: Buffer | None = None) -> None:
    """One launch of mmvq_i8: a block of warps per 16 rows, the int8 columns staged with the weights; with y2,
    two blocks a tile (the halves of its superblocks, the second's sums into y2)."""
    q8, scale8, sums8, sums8_lo = group8
    blocks = -(-((w.rows + 15) // 16) // I8_TILES)
    warps = i8_warps(w.cols, blocks * I8_TILES, t, dev.info.multiprocessors)
    name = f"mmvq_q4_K_i8_t{t}" + (f"_r{I8_TILES}" if I8_TILES > 1 else "")
    if y2 is not None:
        name, blocks = f"{name}_halves", 2 * blocks
    kernel, smem = dev.kernel(name), _i8_smem(t, warps)
    dev.set_max_dynamic_smem(kernel, smem)
    dev.launch(kernel, blocks, 32 * warps, [w.buf, q8, scale8, sums8, sums8_lo, y, bias, residual, w.rows, w.cols,
                                            ld_y, y2], smem=smem)


# ---- int8 activations for Q6_K (kernels/mmvq_i8q6.cu) ----
# Q6_K launches of the token counts in Q6_I8_COUNTS multiply the same int8 copy as mmvq_i8 (its signed 6-bit
# weights need no conversion to float, where the f16 kernels form (q - 32) * scale in f16 for every weight).
# OPENJET_CUDA_Q6I8=0 keeps Q6_K on the f16 kernels.
# Measured on the H200 (bench/NOTES.md v21, run 0ff4387): alone, ffn_down 30.3 -> 27.9 us at one token, the output
# head 312 -> 306, attn_v 6.3 -> 4.5; the 27B pass T = 1 6.92 -> 6.84 ms, T = 2-3 0.07-0.10 ms faster. From 5
# tokens (a second pass for the lo levels) it lost to the plain f16 kernel (ffn_down 37.5 against 40.7 us), so it
# runs 1-4 tokens by default (Q6_I8_COUNTS; built for 1-8).
Q6_I8_ENV = "OPENJET_CUDA_Q6I8"
Q6_I8 = env_switch(Q6_I8_ENV, True)
DEFAULT_Q6_I8_COUNTS = frozenset(range(1, 5))
Q6_I8_COUNTS: frozenset[int] = DEFAULT_Q6_I8_COUNTS
Q6_I8_STAGE_BASE, Q6_I8_SLOT_BYTES = 4160, 320  # mirror of kernels/mmvq_i8q6.cu


def q6_i8_stage_bytes(num_tokens: int) -> int:
    """Mirror of kernels/mmvq_i8q6.cu q6i8_stage_bytes."""
    return Q6_I8_STAGE_BASE + Q6_I8_SLOT_BYTES * 2 * num_tokens + -(-8 * num_tokens // 16) * 16


def _q6_i8_shape(dev: Device, w: DeviceWeight, num_tokens: int) -> tuple[int, int, int]:
    """(blocks, warps a block, dynamic shared memory) of an mmvq_q6_i8 launch. Its ring keeps ACT_STAGES stages a
    warp: 3 or 4 made ffn_down slower (bench/NOTES.md v21)."""
    blocks = (w.rows + 15) // 16
    warps = i8_warps(w.cols, blocks, num_tokens, dev.info.multiprocessors, Q6_I8_WIDE_WARPS_AT)
    return blocks, warps, warps * ACT_STAGES * q6_i8_stage_bytes(num_tokens)


def q6_i8_runs(dev: Device, w: DeviceWeight, num_tokens: int, act: Act) -> bool:
    """Whether a matmul takes mmvq_q6_i8: it and the int8 matmuls on, a Q6_K weight, a token count of
    Q6_I8_COUNTS whose int8 copy the last producer of act wrote, and its shared memory within the block limit."""
    if not (I8_MATMUL and Q6_I8 and w.qtype == Q.Q6_K and num_tokens in Q6_I8_COUNTS
            and num_tokens <= act.i8_tokens):
        return False
    return _q6_i8_shape(dev, w, num_tokens)[2] <= min(ACT_MAX_BLOCK_SMEM, dev.info.max_smem_per_block)


def _mmvq_q6_i8(dev: Device, w: DeviceWeight, group8: tuple[Buffer, Buffer, Buffer, Buffer], y: Buffer,
                bias: Buffer | None, residual: Buffer | None, t: int, ld_y: int, y2: Buffer | None = None) -> None:
    """One launch of mmvq_q6_i8: a block of warps per 16 rows, the int8 columns staged with the weights; with y2,
    two blocks a tile (as _mmvq_i8). One token goes to its tensor-copy form where q6b.runs says so."""
    q8, scale8, _, _ = group8
    if q6b.runs(dev, w, t, halves=y2 is not None):
        q6b.launch(dev, w, q8, scale8, y, bias, residual, y2)
        return
    blocks, warps, smem = _q6_i8_shape(dev, w, t)
    name = f"mmvq_q6_K_i8_t{t}"
    if y2 is not None:
        name, blocks = f"{name}_halves", 2 * blocks
    kernel = dev.kernel(name)
    dev.set_max_dynamic_smem(kernel, smem)
    dev.launch(kernel, blocks, 32 * warps, [w.buf, q8, scale8, y, bias, residual, w.rows, w.cols, ld_y, y2],
               smem=smem)


# ---- the widest rows in two halves (ffn_down at one token) ----
# ffn_down's 320 row tiles leave 56 of 132 SMs three blocks and the rest two, and on the H200 each SM's int8 matmul
# streams at its own ~23 GB/s (bench/NOTES.md Z21), so the launch waits for the SMs with three. In halves (two
# blocks a tile, 640 blocks: 4 or 5 an SM) it evens out; the second half's sums go to a row of their own, which the
# next layer's input RMSNorm adds (rmsnorm_of(add=)), so no block waits for another. OPENJET_CUDA_DOWN_HALVES=1 (or
# the bench's halves variant) turns it on; off until measured on the H200 (the split in K summed by the tile's last
# block lost on the H100, Z21).
DOWN_HALVES_ENV = "OPENJET_CUDA_DOWN_HALVES"


def _down_halves_default() -> bool:
    return env_switch(DOWN_HALVES_ENV, False)


DOWN_HALVES = _down_halves_default()
# The mixers' output projections (ssm_out, attn_output: 320 tiles at one token) on mmvq_i8b walking half-tiles
# where that evens the blocks' work (i8b.halves_pay), their halves added by the FFN norm the same way.
# OPENJET_CUDA_OUT_HALVES=1 (or the bench's outhalves variant) turns it on; off until measured.
OUT_HALVES_ENV = "OPENJET_CUDA_OUT_HALVES"


def _out_halves_default() -> bool:
    return env_switch(OUT_HALVES_ENV, False)


OUT_HALVES = _out_halves_default()
# the counts that may go in halves: where the launch is on the int8 kernels (1-4 tokens by default; 5 with
# I8_TOKENS 5 and Q6_I8_COUNTS holding 5)
HALVES_AT = frozenset(HALVES_TOKENS)
# The Q4_K ffn_downs of these verify counts on mmvq_i8v in halves (kernels/mmvq_i8v.cu HALVES: half of the row
# staged, so its 68 superblocks fit where the whole row does not), in place of mmvq_i8 at 2-4 tokens and the f16
# persist kernel from 5 (0.914 ms a pass on an H100 at 5 tokens against mmvq_i8's 0.740 at 4). On an H100 the 27B
# pass at 5 tokens 8.988 -> 8.685 ms, at 2-4 0.03-0.05 ms faster (bench/NOTES.md Z26). An empty set turns it off;
# bench variant i8vdown5 takes it from 5 tokens only.
DEFAULT_VERIFY_HALVES_AT: frozenset[int] = frozenset(I8V_HALVES_TOKENS)
VERIFY_HALVES_AT = DEFAULT_VERIFY_HALVES_AT


def verify_halves(dev: Device, w: DeviceWeight, act: Act, num_tokens: int) -> bool:
    """Whether a launch of num_tokens takes mmvq_i8v in halves: a count of VERIFY_HALVES_AT, rows of WIDE_COLS
    or more, and the verify form taking a half (i8b.verify_runs)."""
    return (num_tokens in VERIFY_HALVES_AT and w.cols >= WIDE_COLS
            and i8b.verify_runs(dev, w, num_tokens, act, halves=True))


def splits_in_halves(dev: Device, w: DeviceWeight, act: Act, num_tokens: int,
                     producer: Producer | None = None) -> bool:
    """Whether matmul(w, act, num_tokens, producer=producer) may go in halves (y2): DOWN_HALVES, rows of WIDE_COLS
    or more, a count of HALVES_AT, and the launch on mmvq_i8 (one tile a block) or mmvq_q6_i8; or OUT_HALVES and
    the launch on mmvq_i8b where i8b.halves_pay; or q6b.HALVES, rows of WIDE_COLS or more and the launch on
    mmvq_q6_i8b; or verify_halves; or q6b.verify_runs (the Q6_K ones of q6b.VERIFY_AT's counts). producer: the
    launch's own, not yet run (what it will write is what the launch reads)."""
    if not (DOWN_HALVES or OUT_HALVES or q6b.HALVES or VERIFY_HALVES_AT or q6b.VERIFY_AT):
        return False
    if producer is not None:
        act = replace(act, i8_tokens=_i8_written(dev, act, num_tokens))
    if verify_halves(dev, w, act, num_tokens) or q6b.verify_runs(dev, w, num_tokens, act):
        return True
    kernel = _group_kernel(dev, w, act, num_tokens, num_tokens)
    if kernel == "i8b":  # (one token)
        return OUT_HALVES and i8b.halves_pay(dev, w)
    if kernel == "i8q6" and q6b.HALVES and w.cols >= WIDE_COLS and q6b.runs(dev, w, num_tokens, halves=True):
        return True
    return (DOWN_HALVES and w.cols >= WIDE_COLS and num_tokens in HALVES_AT
            and (kernel == "i8q6" or (kernel == "i8" and I8_TILES == 1)))


def i8_warps(cols: int, tiles: int, num_tokens: int, multiprocessors: int,
             wide_at: dict[int, int] | None = None) -> int:
    """Warps per block of an mmvq_i8 launch: I8_WARPS, else wide_at's (default I8_WIDE_WARPS_AT; rows of
    WIDE_COLS or more) or I8_WARPS_AT's for num_tokens, else _pipelined_warps; never more than the superblocks
    (with several tiles a block, a warp without one would miss their barriers)."""
    wide_at = I8_WIDE_WARPS_AT if wide_at is None else wide_at
    wide = wide_at.get(num_tokens) if cols >= WIDE_COLS else None
    warps = I8_WARPS or wide or I8_WARPS_AT.get(num_tokens) or _pipelined_warps(cols, tiles, multiprocessors)
    return min(warps, cols // SUPERBLOCK)


def _pipelined_warps(cols: int, tiles: int, multiprocessors: int) -> int:
    """Warps per block of the pipelined mmvq: among the counts that split the superblocks evenly (as
    _mmvq_warps), the one whose waves of about 16 resident warps per SM finish first."""
    num_sb = cols // SUPERBLOCK
    best = min(MMVQ_WARPS, num_sb)
    even = [w for w in range(best, max(best // 2, 1) - 1, -1) if num_sb % w == 0] or [best]
    capacity = 16 * multiprocessors

    def cost(warps: int) -> tuple[int, int]:
        waves = -(-tiles * warps // capacity)
        return waves * -(-num_sb // warps), -warps

    return min(even, key=cost)


def _mmvq_warps(cols: int) -> int:
    """Warps splitting K inside one block: as many as the superblocks keep busy, at most 8."""
    num_sb = (cols + SUPERBLOCK - 1) // SUPERBLOCK
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


def alloc_act(dev: Device, max_tokens: int, width: int, what: str, f32: Buffer | None = None,
              ld: int | None = None, precise: bool = False) -> Act:
    """Activation buffers for up to max_tokens rows of `width` values; f32 may be an existing [T, ld] buffer.

    precise: also keep each value's f16 rounding residue, so mmvq multiplies with f32-level activations.
    """
    ld = ld or width
    groups = (max_tokens + ACT_GROUP - 1) // ACT_GROUP
    nsb = (width + SUPERBLOCK - 1) // SUPERBLOCK
    x16 = dev.alloc(groups * nsb * 4096, f"{what}.act")
    sums = dev.alloc(groups * nsb * 128, f"{what}.sums")
    f32 = f32 if f32 is not None else dev.alloc(4 * max_tokens * ld, f"{what}.f32")
    sums_lo = dev.alloc(groups * nsb * 128, f"{what}.sums_lo")
    act_lo = dev.alloc(groups * nsb * 4096, f"{what}.act_lo") if precise else None
    act = Act(x16, sums, f32, width, ld, max_tokens, sums_lo, act_lo)
    if groups > 1:
        act.row_inv = dev.alloc(4 * max_tokens, f"{what}.row_inv")
    if width % SUPERBLOCK == 0:  # the int8 matmul's whole superblocks (one group: it runs up to 4 tokens)
        act.q8 = dev.alloc(nsb * 4096, f"{what}.q8")
        act.scale8 = dev.alloc(nsb * 64, f"{what}.scale8")
        act.sums8 = dev.alloc(nsb * 128, f"{what}.sums8")
        act.sums8_lo = dev.alloc(nsb * 128, f"{what}.sums8_lo")
    return act


# ---- norms, rope, element-wise, embedding, token choice ----


def rms_norm(dev: Device, x: Buffer, w: Buffer, out: Buffer, num_tokens: int, width: int, ld_in: int, ld_out: int,
             eps: float) -> None:
    """out[t] = RMSNorm(x[t]) * w for T rows of `width` f32 values."""
    dev.launch(dev.kernel("rms_norm"), num_tokens, 1024 if width >= 4096 else 256,
               [x, w, out, width, ld_in, ld_out, eps])


def head_norm(dev: Device, x: Buffer, w: Buffer | None, num_tokens: int, num_heads: int, head_dim: int, ld: int,
              head_stride: int, eps: float, l2_scale: float | None = None) -> None:
    """In place per head: RMSNorm times w (l2_scale None), or L2 norm times l2_scale (w unused)."""
    rows = num_tokens * num_heads
    kind, scale = (0, 1.0) if l2_scale is None else (1, l2_scale)
    dev.launch(dev.kernel("head_norm"), (rows + 7) // 8, 256,
               [x, w, num_tokens, num_heads, head_dim, ld, head_stride, eps, scale, kind])


def gated_rms_norm(dev: Device, o: Buffer, z: Buffer, w: Buffer, out: Buffer, num_tokens: int, num_heads: int,
                   head_dim: int, ld_o: int, ld_z: int, ld_out: int, eps: float) -> None:
    """out = RMSNorm(o per head) * w * silu(z) (the DeltaNet output norm)."""
    rows = num_tokens * num_heads
    dev.launch(dev.kernel("gated_rms_norm"), (rows + 7) // 8, 256,
               [o, z, w, out, num_tokens, num_heads, head_dim, ld_o, ld_z, ld_out, eps])


def rope(dev: Device, x: Buffer, positions: Buffer, num_tokens: int, num_heads: int, ld: int, head_stride: int,
         rope_dim: int, theta: float, neox: bool) -> None:
    """Rotary embedding in place on the first rope_dim dims of each head; positions: int32 [T] on the device."""
    assert rope_dim % 2 == 0 and rope_dim > 0
    total = num_tokens * num_heads * (rope_dim // 2)
    dev.launch(dev.kernel("rope_neox" if neox else "rope_norm"), (total + 255) // 256, 256,
               [x, positions, num_tokens, num_heads, ld, head_stride, rope_dim, theta])


def swiglu(dev: Device, gate: Buffer, up: Buffer, out: Buffer, num_tokens: int, width: int, ld_in: int,
           ld_out: int) -> None:
    """out = silu(gate) * up."""
    total = num_tokens * width
    dev.launch(dev.kernel("swiglu"), (total + 255) // 256, 256, [gate, up, out, num_tokens, width, ld_in, ld_out])


def sigmoid_mul(dev: Device, x: Buffer, gate: Buffer, num_tokens: int, width: int, ld_x: int, ld_gate: int) -> None:
    """x *= sigmoid(gate), in place."""
    total = num_tokens * width
    dev.launch(dev.kernel("sigmoid_mul"), (total + 255) // 256, 256, [x, gate, num_tokens, width, ld_x, ld_gate])


def get_rows(dev: Device, w: DeviceWeight, ids: Buffer, out: Buffer, num_tokens: int, ld_out: int) -> None:
    """out[t] = w[ids[t]] dequantized to f32 (the embedding lookup); ids: int32 [T] on the device."""
    instance = DISPATCH.get(("get_rows", w.qtype))
    if instance is None:
        raise ValueError(f"{w.name}: no CUDA embedding lookup for {w.qtype.name}")
    nb = w.cols // block_layout(w.qtype)[0]  # blocks per row (elements per row for F32/F16)
    dev.launch(dev.kernel(instance), (num_tokens, (w.cols + 255) // 256), 256,
               [w.buf, ids, out, w.rows, w.cols, nb, ld_out])


ARGMAX_CHUNK = 4096


def argmax(dev: Device, logits: Buffer, ids: Buffer, scratch: Buffer, num_tokens: int, vocab: int, ld: int) -> None:
    """ids[t] = argmax of logits[t] (lowest index on ties); scratch holds 8 bytes per (token, chunk)."""
    chunks = (vocab + ARGMAX_CHUNK - 1) // ARGMAX_CHUNK
    assert scratch.nbytes >= 8 * num_tokens * chunks, "argmax scratch too small"
    part_v, part_i = scratch, scratch.view(4 * num_tokens * chunks)
    dev.launch(dev.kernel("argmax_partial"), (num_tokens, chunks), 256, [logits, part_v, part_i, vocab, ld,
                                                                         ARGMAX_CHUNK])
    dev.launch(dev.kernel("argmax_final"), num_tokens, 256, [part_v, part_i, ids, chunks])


# Candidates a row's top_k / top_p set is sorted among in shared memory (kernels/sample.cu CHOOSE_CAP): a larger set
# is the host's row (-2), and a larger top_k the host's request (engine/cuda/backend.py device_chooses).
CHOOSE_CAP = 4096
# A row's parts of the passes choose_top and choose_weigh spread over CHOOSE_CHUNKS blocks (kernels/sample.cu
# ChooseParts, whose size the kernel asserts)
CHOOSE_CHUNKS = 64
CHOOSE_PARTS_BYTES = 143_624


def choose_rows(dev: Device, logits: Buffer, drafts: Buffer, uniforms: Buffer, out: Buffer, num_rows: int, vocab: int,
                ld: int, temperature: float, min_p: float, top_k: int, top_p: float,
                parts: Buffer | None = None) -> None:
    """out[t] = (token, kept) for verify row t, chosen as engine/spec/verify.py's rules would on the host (kernels/
    sample.cu choose_rows): temperature 0 the argmax, else speculative sampling of the draft drafts[t] (-1: none)
    with the row's two float64 uniforms, from the weights temperature, top_k (0: all), top_p (1: all) and min_p
    keep. Token -1: no token can be chosen; -2: the row is the host's (an infinite top, or a top_k / top_p set of
    more than CHOOSE_CAP tokens). With parts (CHOOSE_PARTS_BYTES a row) the row's passes run first over
    CHOOSE_CHUNKS blocks a row (choose_top, and for a sampled row choose_weigh), and choose_rows reads their parts:
    the same choices, without one block's passes over the row; without, one block a row does every pass."""
    assert vocab <= 1 << 20, "choose_rows weighs a segment of at most 1024 tokens in shared memory"
    assert parts is None or parts.nbytes >= num_rows * CHOOSE_PARTS_BYTES, "choose_rows' parts too small"
    if parts is not None:
        grid = (num_rows, CHOOSE_CHUNKS)
        dev.launch(dev.kernel("choose_top"), grid, 256, [logits, vocab, ld, parts])
        if temperature != 0:
            dev.launch(dev.kernel("choose_weigh"), grid, 256, [logits, vocab, ld, float(temperature), float(min_p),
                                                               int(top_k), ctypes.c_double(top_p), parts])
    # top_p in float64: the host compares its running mass with it unrounded (engine/sampling.py _nucleus)
    dev.launch(dev.kernel("choose_rows"), num_rows, 1024,
               [logits, vocab, ld, drafts, uniforms, float(temperature), float(min_p), int(top_k),
                ctypes.c_double(top_p), int(temperature == 0), parts, out])
