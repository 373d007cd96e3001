"""Closers (kernels/act8_close.cuh, engine/cuda/ops.py Closer): the one-token int8 matmul that forms the next
matmul's int8 input behind itself, checked against the producer launched apart on the same output and against
the float64 reference, then both forms timed at the 27B pairs (bench/NOTES.md Z1).

Every check draws fresh random inputs (never zeros) and poisons what it compares: y and the scales and sums with
NaN, the levels with -128 (a level the producers never write: they clamp to +-127).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import Report, Timing, compare, median_time, patched, poison, record
from bench.gpu_fused import LEVEL_ERROR_MARGIN, TOL_APART, level_error
from bench.gpu_kernels import REF_ROWS, SHAPES_27B, _reference_rows, bulk_i8, i8_matmul
from engine.cuda import closers, i8b, ops
from engine.cuda.device import Buffer, Device
from engine.cuda.repack import random_blocks

EPS = 1e-6
UNWRITTEN_LEVEL = 0x80  # -128 as a byte


@dataclass(frozen=True, slots=True)
class Pair:
    """A matmul whose output the closer turns into the next matmul's input: (rows, cols) of both, the mode, the
    consumer's type, the producing matmul's type."""

    name: str
    producer: tuple[int, int]
    consumer: tuple[int, int]
    mode: str
    consumer_qtype: Q
    producer_qtype: Q = Q.Q4_K
    tokens: int = 1
    five: bool = False  # the int8 matmuls (Q4_K and Q6_K) take 5 tokens too, as gpu_bench27b's close5 runs them


# The pass's pairs at 27B, one of each kernel, mode and consumer kernel: ssm_out -> FFN norm -> gate | up (mmvq_i8b,
# 20 superblocks of one tile a block); gate | up -> SwiGLU -> ffn_down in both of its types (2,176 tiles, several
# a block); ffn_down in both of its types (mmvq_i8, mmvq_q6_i8) -> the next layer's input norm -> attention's q
# (mmvq_i8b), attn_v (mmvq_q6_i8) or the DeltaNet's alpha | beta (mmvq_q8_0_i8). Small ones: two superblocks (a
# row closed by whichever closes last), a consumer on mmvq_i8b.
PAIRS = [Pair("ffn_norm", SHAPES_27B["ssm_out"], SHAPES_27B["ffn_gate_up"], "rmsnorm", Q.Q4_K),
         Pair("swiglu", SHAPES_27B["ffn_gate_up"], SHAPES_27B["ffn_down"], "swiglu", Q.Q4_K),
         Pair("swiglu_q6", SHAPES_27B["ffn_gate_up"], SHAPES_27B["ffn_down"], "swiglu", Q.Q6_K),
         Pair("input_norm", SHAPES_27B["ffn_down"], SHAPES_27B["attn_q"], "rmsnorm", Q.Q4_K),
         Pair("input_norm_q6", SHAPES_27B["ffn_down"], SHAPES_27B["attn_kv"], "rmsnorm", Q.Q6_K, Q.Q6_K),
         Pair("input_norm_gates", SHAPES_27B["ffn_down"], (96, 5120), "rmsnorm", Q.Q8_0),
         Pair("small_norm", (512, 768), (1024, 512), "rmsnorm", Q.Q4_K),
         Pair("small_swiglu", (1024, 768), (512, 512), "swiglu", Q.Q4_K),
         # verify passes: the FFN norm behind mmvq_i8v (5 tokens, gate | up on mmvq_i8v), SwiGLU behind mmvq_i8 at
         # 3 tokens (its ffn_down on mmvq_i8 too), the input norm behind ffn_down at 2, (Q6_K) 4 and (into the
         # gates' mmvq_q8_0_i8) 3 tokens
         Pair("ffn_norm", SHAPES_27B["ssm_out"], SHAPES_27B["ffn_gate_up"], "rmsnorm", Q.Q4_K, tokens=5),
         Pair("swiglu", SHAPES_27B["ffn_gate_up"], SHAPES_27B["ffn_down"], "swiglu", Q.Q4_K, tokens=3),
         Pair("input_norm", SHAPES_27B["ffn_down"], SHAPES_27B["attn_q"], "rmsnorm", Q.Q4_K, tokens=2),
         Pair("input_norm_q6", SHAPES_27B["ffn_down"], SHAPES_27B["attn_kv"], "rmsnorm", Q.Q6_K, Q.Q6_K, tokens=4),
         Pair("input_norm_gates", SHAPES_27B["ffn_down"], (96, 5120), "rmsnorm", Q.Q8_0, tokens=3),
         # close5: ffn_down and attn_v on int8 at 5 tokens, so SwiGLU and the input norm close there too
         Pair("swiglu", SHAPES_27B["ffn_gate_up"], SHAPES_27B["ffn_down"], "swiglu", Q.Q6_K, tokens=5, five=True),
         Pair("input_norm", SHAPES_27B["ffn_down"], SHAPES_27B["attn_kv"], "rmsnorm", Q.Q6_K, tokens=5, five=True),
         Pair("input_norm_q6", SHAPES_27B["ffn_down"], SHAPES_27B["attn_q"], "rmsnorm", Q.Q4_K, Q.Q6_K, tokens=5,
              five=True)]
GATED_TOKENS = (1, 5)  # the delta rule with the gated norm closed behind it (check_gated)
PLAIN_TOKENS = (1, 5)  # attention with its output's copy closed behind attn_combine (check_plain)
# Levels that differ from the producer's: SwiGLU and the plain copy none (the same float operations on the same
# values), a count; RMSNorm's are the levels of x * w, the producer's of x * w / rms, which round differently at a
# tie's edge (in numpy 4 of 8.2 M hi levels and 1,264 lo levels, bench/MEGAKERNEL.md eighth session), and the gated
# norm sums a head's squares in another order (its 1 / rms may differ in the last bit), both a fraction
# (FRACTION_MODES). Levels off their places or unwritten differ at about half the positions.
LEVEL_MISMATCH_TOL = {("swiglu", "hi"): 0.5, ("swiglu", "lo"): 0.5, ("plain", "hi"): 0.5, ("plain", "lo"): 0.5,
                      ("gatednorm", "hi"): 1e-3, ("gatednorm", "lo"): 1e-2, ("rmsnorm", "hi"): 1e-3,
                      ("rmsnorm", "lo"): 1e-2}
FRACTION_MODES = frozenset({"rmsnorm", "gatednorm"})
TOL_SCALES = 1e-5  # scales and sums times 1 / rms summed in another order: ~1e-7
# mmvq_q8_0_i8 against the precise f16 Q8_0 kernel. On the H100 (4e6f40a) the int8 kernel was 3.4e-5 from the
# float64 reference and 2.3e-4 from the f16 one: the difference is the f16 kernel's own, so the bound is its class.
TOL_I8_VS_F16 = 1e-3
TIMED = ("ffn_norm", "swiglu", "input_norm", "input_norm_q6")  # one-token pairs, one of each kernel and mode
TOL_Y = 1e-6  # the matmul's own output: the same sums as without the closer (a closer writing into y: 1e-2 or more)


@contextmanager
def closing(on: bool, five: bool = False):
    """Closers switched for the block, with the int8 matmuls they need on (Q8_0's too; five: Q4_K's and Q6_K's at 5
    tokens as well); restored after it."""
    saved = i8b.CLOSE, ops.Q8_I8, ops.Q6_I8_COUNTS
    try:
        i8b.CLOSE, ops.Q8_I8 = on, True
        ops.Q6_I8_COUNTS = frozenset(range(1, 6)) if five else ops.DEFAULT_Q6_I8_COUNTS
        with i8_matmul(True, 5 if five else None), bulk_i8(True):
            i8b.MAX_SUPERBLOCKS = i8b.DEFAULT_MAX_SUPERBLOCKS  # as the pass runs them: ffn_down on mmvq_i8
            yield
    finally:
        i8b.CLOSE, ops.Q8_I8, ops.Q6_I8_COUNTS = saved


def _int8_copy(dev: Device, act: ops.Act, tokens: int) -> dict[str, np.ndarray]:
    """The first `tokens` tokens' part of act's int8 copy: hi and lo levels [T, nsb, 256], scales [T, nsb, 2],
    sums (hi + lo) [T, nsb, 8]."""
    nsb = act.num_superblocks
    q = dev.download(act.q8, np.int8, (nsb, 2, 8, 256))
    scale = dev.download(act.scale8, np.float32, (nsb, 2, 8))
    sums = dev.download(act.sums8, np.float16, (nsb, 8, 8)).astype(np.float64)
    sums += dev.download(act.sums8_lo, np.float16, (nsb, 8, 8)).astype(np.float64)
    t = slice(0, tokens)
    return {"hi": q[:, 0, t].transpose(1, 0, 2), "lo": q[:, 1, t].transpose(1, 0, 2),
            "scale": scale[:, :, t].transpose(2, 0, 1), "sums": sums[:, t].transpose(1, 0, 2)}


def _poison_int8(dev: Device, act: ops.Act) -> None:
    dev.fill_u32(act.q8, UNWRITTEN_LEVEL * 0x01010101)
    for buf in (act.scale8, act.sums8, act.sums8_lo):
        poison(dev, buf)


@dataclass(slots=True)
class Runs:
    """What a writer did with its closer (two launches: its own output and the int8 copy each; the consumer's
    output from that copy) and without it (its own output, the producer's copy, the consumer's output)."""

    launches: list
    out_closed: np.ndarray
    own_apart: np.ndarray
    ref8: dict
    out_apart: np.ndarray


def _closed_then_apart(dev: Device, variant: str, t: int, make_closer, write, produce, own: Buffer, own_apart: Buffer,
                       shape: tuple[int, int], closed: ops.Act, apart: ops.Act, consumer: ops.DeviceWeight,
                       out: Buffer, five: bool = False) -> Runs:
    """The writer (write(buffer, closer)) twice with the closer make_closer() gives under closing(True), each launch
    poisoned first; then once without, its producer (produce(buffer)) launched apart into `apart`; the consumer on
    each int8 copy."""
    with closing(True, five):
        closer = make_closer()
        if closer is None:
            raise AssertionError(f"{variant}: no closer with CLOSE on")
        launches = []
        for _ in range(2):
            poison(dev, own)
            _poison_int8(dev, closed)
            write(own, closer)
            launches.append((dev.download(own, np.float32, shape), _int8_copy(dev, closed, t)))
        out_closed = _consume(dev, consumer, closed, out, t)
    with closing(False, five):
        poison(dev, own_apart)
        write(own_apart, None)
        _poison_int8(dev, apart)
        produce(own_apart)
        ref8 = _int8_copy(dev, apart, t)
        out_apart = _consume(dev, consumer, apart, out, t)
    return Runs(launches, out_closed, dev.download(own_apart, np.float32, shape), ref8, out_apart)


def check_close(dev: Device, report: Report, rng: np.random.Generator, pair: Pair) -> None:
    """One closer launch of pair.tokens tokens against the same matmul with its producer launched apart: y
    unchanged, the int8 copy (levels, scales, sums), the consumer's output, a second launch equal to the first (the
    counters left zero); and the consumer's output against the float64 reference."""
    (rows, cols), (c_rows, width), t = pair.producer, pair.consumer, pair.tokens
    data = random_blocks(pair.producer_qtype, (rows, cols), rng)
    c_data = random_blocks(pair.consumer_qtype, (c_rows, width), rng)
    w = ops.upload_weight(dev, data, pair.producer_qtype, (rows, cols), f"{pair.name}.w")
    consumer = ops.upload_weight(dev, c_data, pair.consumer_qtype, (c_rows, width), f"{pair.name}.consumer")
    x = ops.alloc_act(dev, t, cols, "x", precise=True)
    # SwiGLU takes gate | up as a model's are (O(1): random Q4_K rows times N(0, 1) gave ~200, whose SwiGLU
    # sub-block sums overflowed the f16 pair, the producer's as the closer's: NaN on both sides, 4e6f40a); RMSNorm
    # does not depend on the scale, and gets a residual so that its rms is far from 1
    scale = 0.01 if pair.mode == "swiglu" else 1.0
    dev.upload(x.f32, (scale * rng.standard_normal((t, cols)) * rng.uniform(0.5, 2.0, (t, 1))).astype(np.float32))
    res = None if pair.mode == "swiglu" else dev.to_device((3.0 * rng.standard_normal((t, rows))).astype(np.float32),
                                                           "res")
    norm = dev.to_device((1.0 + 0.2 * rng.standard_normal(width)).astype(np.float32), "norm")
    closed, apart = (ops.alloc_act(dev, t, width, f"{pair.name}.{k}", precise=True) for k in ("closed", "apart"))
    scratch = closers.alloc_close_scratch(dev, width, "close.scratch")
    y, y_apart = dev.alloc(4 * t * rows, "y"), dev.alloc(4 * t * rows, "y_apart")
    out = dev.alloc(4 * t * c_rows, "out")
    variant = f"{pair.name}.{pair.producer_qtype.name}.{pair.mode}.{pair.consumer_qtype.name}.T{t}"
    variant += ".five" if pair.five else ""
    rms = pair.mode == "rmsnorm"

    def make_closer():
        ops.act_f16(dev, x.f32, x, t, cols)  # x's int8 copy: the writer's launch takes it
        return closers.closer_for(dev, w, t, pair.mode, closed, [consumer], scratch, norm if rms else None, EPS, x=x)

    def write(buf: Buffer, closer) -> None:
        ops.act_f16(dev, x.f32, x, t, cols)
        ops.matmul(dev, w, x, buf, t, rows, residual=res, closer=closer)

    def produce(buf: Buffer) -> None:
        if rms:
            ops.act_rmsnorm(dev, buf, norm, apart, t, rows, EPS)
        else:
            ops.act_swiglu(dev, buf, buf.view(4 * width), apart, t, rows)

    try:
        runs = _closed_then_apart(dev, variant, t, make_closer, write, produce, y, y_apart, (t, rows), closed, apart,
                                  consumer, out, pair.five)
        _compare_launches(report, variant, pair.mode, runs.launches, runs.own_apart, runs.ref8)
        _check_counters(dev, report, variant, scratch, width)
        values = _values(runs.own_apart.astype(np.float64), dev.download(norm, np.float32, (width,)), pair.mode,
                         width)
        _compare_consumer(report, variant, runs.out_closed, runs.out_apart, values, c_data, pair.consumer_qtype, rng)
        if pair.consumer_qtype == Q.Q8_0:  # the new kernel against the f16 one on the producer's act
            with closing(False), patched(ops, Q8_I8=False):
                f16 = _consume(dev, consumer, apart, out, t)
            compare(report, "close.consumer", variant + ".q8_i8_vs_f16", runs.out_apart, f16, TOL_I8_VS_F16)
    finally:
        for buf in [w.buf, consumer.buf, *([res] if res is not None else []), norm, scratch, y, y_apart, out,
                    *x.buffers(), *closed.buffers(),
                    *apart.buffers()]:
            dev.memory.free(buf)


def _consume(dev: Device, consumer: ops.DeviceWeight, act: ops.Act, out: Buffer, tokens: int) -> np.ndarray:
    """The consumer's output [T, rows] from act (out poisoned first)."""
    poison(dev, out)
    ops.matmul(dev, consumer, act, out, tokens, consumer.rows)
    return dev.download(out, np.float32, (tokens, consumer.rows))


def _compare_launches(report: Report, variant: str, mode: str, launches: list, own_apart: np.ndarray,
                      ref8: dict) -> None:
    """The two launches with the closer, each (the writer's own output, the int8 copy), against the writer's output
    without it and the producer's int8 copy: the output unchanged, the copy as the producer's, the second launch
    bit for bit the first (the counters left zero)."""
    (own, got), (own_again, again) = launches
    compare(report, "close.own", variant, own, own_apart, TOL_Y)
    _compare_int8(report, variant, got, ref8, mode)
    same = sum(int(np.count_nonzero(got[k] != again[k])) for k in got)
    record(report, "close.again", variant, "int8 copy", float(same + np.count_nonzero(own_again != own)), 0.5)


def check_plain(dev: Device, report: Report, rng: np.random.Generator, tokens: int, context: int = 512) -> None:
    """Attention (the 27B's gated heads over a `context`-key cache, keys split) with its output's copy closed behind
    attn_combine, against the same attention with the copy launched apart (act_plain): the output unchanged, the
    int8 copy (levels equal: the same values), attn_output's output; and that against the float64 reference."""
    from engine.cuda import mixers

    hq, hkv, d, cap, t = 24, 4, 256, 4096, tokens
    width, rows, stride = hq * d, 5120, 2 * d  # qwen35 packs [Q | gate] per head
    s = []

    def put(a: np.ndarray, what: str, dtype=np.float32):
        s.append(dev.to_device(np.ascontiguousarray(a, dtype), what))
        return s[-1]

    total = context + t
    kcache = put(rng.standard_normal((hkv, cap, d)), "k", np.float16)
    vcache = put(rng.standard_normal((hkv, cap, d)), "v", np.float16)
    q = put(rng.standard_normal((t, hq * stride)), "q")
    pos = put(np.arange(context, total), "pos", np.int32)
    splits = mixers.attn_splits(t, hkv, mixers.attn_tile_tokens(hq, hkv, d, t), dev.info.multiprocessors)
    scratch_attn = dev.alloc(mixers.attn_scratch_bytes(splits, t, hq, d), "attn_scratch")
    s.append(scratch_attn)
    out, out_apart = put(np.zeros((t, width)), "out"), put(np.zeros((t, width)), "out_apart")
    c_data, consumer, closed, apart, scratch, o_buf = _consumer_side(dev, rng, t, rows, width, "attn_output")
    variant = f"plain.T{t}.s{splits}"

    def attend(o: Buffer, closer) -> None:
        mixers.attention(dev, q, kcache, vcache, pos, o, t, hq, hkv, d, cap, hq * stride, stride, width, d ** -0.5,
                         gate=q.view(4 * d), ld_gate=hq * stride, gate_head_stride=stride, scratch=scratch_attn,
                         splits=splits, closer=closer)

    combined = splits > 1 and not mixers.attn_runs_mma(t, d, dev.info.max_smem_per_block)
    try:
        runs = _closed_then_apart(
            dev, variant, t,
            lambda: closers.plain_closer_for(dev, t, closed, [consumer], scratch, out, width, d, combined), attend,
            lambda buf: ops.act_f16(dev, buf, apart, t, width), out, out_apart, (t, width), closed, apart, consumer,
            o_buf)
        _compare_launches(report, variant, "plain", runs.launches, runs.own_apart, runs.ref8)
        _check_counters(dev, report, variant, scratch, width)
        _compare_consumer(report, variant, runs.out_closed, runs.out_apart, runs.own_apart.astype(np.float64),
                          c_data, Q.Q4_K, rng)
    finally:
        for buf in [*s, consumer.buf, scratch, o_buf, *closed.buffers(), *apart.buffers()]:
            dev.memory.free(buf)


def _consumer_side(dev: Device, rng: np.random.Generator, tokens: int, rows: int, width: int, name: str):
    """A random Q4_K consumer [rows, width] (its data too, for the reference), the closed and the apart act, the
    closer's scratch, and the consumer's output buffer."""
    c_data = random_blocks(Q.Q4_K, (rows, width), rng)
    consumer = ops.upload_weight(dev, c_data, Q.Q4_K, (rows, width), name)
    closed, apart = (ops.alloc_act(dev, tokens, width, f"{name}.{k}", precise=True) for k in ("closed", "apart"))
    scratch = closers.alloc_close_scratch(dev, width, "close.scratch")
    return c_data, consumer, closed, apart, scratch, dev.alloc(4 * tokens * rows, f"{name}.out")


def _check_counters(dev: Device, report: Report, variant: str, scratch: Buffer, width: int) -> None:
    """Every counter of the closer's scratch back at zero after its launches (the next launch starts from them)."""
    counts = dev.download(scratch, np.uint32, (width // 256 + 1,))
    record(report, "close.counters", variant, f"{counts.size}", float(np.count_nonzero(counts)), 0.5)


def _compare_consumer(report: Report, variant: str, out_closed: np.ndarray, out_apart: np.ndarray,
                      values: np.ndarray, c_data: np.ndarray, c_qtype: Q, rng: np.random.Generator) -> None:
    """The consumer's output [T, rows] from the closer's input against it from the producer's, and against the
    float64 reference of the values [T, width] the producer makes."""
    c_rows, width = out_closed.shape[1], values.shape[1]
    tol_apart = max(TOL_APART, 0.5 * level_error(values))
    compare(report, "close.consumer", variant + ".vs_apart", out_closed, out_apart, tol_apart)
    pick = np.sort(rng.choice(c_rows, size=min(c_rows, REF_ROWS), replace=False))
    ref = values @ _reference_rows(c_data, c_qtype, (c_rows, width), pick).T
    compare(report, "close.consumer", variant, out_closed[:, pick], ref, LEVEL_ERROR_MARGIN * level_error(values))


def _values(y: np.ndarray, norm: np.ndarray, mode: str, width: int) -> np.ndarray:
    """What the producer makes of the matmul's output y [T, rows], in float64."""
    if mode == "rmsnorm":
        return y / np.sqrt(np.mean(y * y, axis=1, keepdims=True) + EPS) * norm
    gate, up = y[:, :width], y[:, width:]
    return gate / (1.0 + np.exp(-gate)) * up


def check_gated(dev: Device, report: Report, rng: np.random.Generator, tokens: int) -> None:
    """The delta rule (27B DeltaNet shapes, random state and inputs, not committing) with the gated norm closed
    behind it, against the same rule with the norm launched apart: o unchanged, the int8 copy, ssm_out's output,
    a second launch equal to the first; and ssm_out's output against the float64 reference."""
    from engine.cuda import mixers

    hk, hv, dk, dv, t = 16, 48, 128, 128, tokens
    inner, rows, ld_z = hv * dv, 5120, hv * dv + 64  # z inside a wider row, as the projection lays it out
    s = []

    def put(a: np.ndarray, what: str):
        s.append(dev.to_device(np.ascontiguousarray(a, np.float32), what))
        return s[-1]

    qk = put(rng.standard_normal((t, 2 * hk * dk)), "qk")
    v = put(rng.standard_normal((t, inner)), "v")
    state = put(0.1 * rng.standard_normal((hv, dk, dv)), "state")
    gates = dict(alpha=put(2 * rng.standard_normal((t, hv)), "alpha"), b=put(2 * rng.standard_normal((t, hv)), "b"),
                 a=put(-np.exp(0.5 * rng.standard_normal(hv)), "a"), dt_bias=put(rng.standard_normal(hv), "dt"),
                 ld_gate=hv, g=put(np.zeros((t, hv)), "g"), beta=put(np.zeros((t, hv)), "beta"))
    z = put(rng.standard_normal((t, ld_z)), "z")
    norm = put(1.0 + 0.2 * rng.standard_normal(dv), "ssm_norm")
    o, o_apart = put(np.zeros((t, inner)), "o"), put(np.zeros((t, inner)), "o_apart")
    c_data, consumer, closed, apart, scratch, out = _consumer_side(dev, rng, t, rows, inner, "ssm_out")
    variant = f"gated.T{t}"

    def rule(o_buf: Buffer, closer) -> None:
        mixers.gdn_recurrent(dev, qk, qk.view(4 * hk * dk), v, state, o_buf, t, hk, hv, dk, dv, 2 * hk * dk, inner,
                             inner, False, closer=closer, **gates)

    try:
        runs = _closed_then_apart(
            dev, variant, t,
            lambda: closers.gated_closer_for(dev, t, closed, [consumer], scratch, o, inner, z, ld_z, norm, dv, EPS),
            rule, lambda buf: ops.act_gatednorm(dev, buf, z, norm, apart, t, dv, inner, ld_z, EPS), o, o_apart,
            (t, inner), closed, apart, consumer, out)
        ov = runs.own_apart
        _compare_launches(report, variant, "gatednorm", runs.launches, ov, runs.ref8)
        _check_counters(dev, report, variant, scratch, inner)
        heads = ov.astype(np.float64).reshape(t, hv, dv)
        zv = dev.download(z, np.float32, (t, ld_z))[:, :inner].astype(np.float64)
        normed = heads / np.sqrt(np.mean(heads * heads, axis=2, keepdims=True) + EPS)
        values = (normed * dev.download(norm, np.float32, (dv,))).reshape(t, inner) * zv / (1.0 + np.exp(-zv))
        _compare_consumer(report, variant, runs.out_closed, runs.out_apart, values, c_data, Q.Q4_K, rng)
    finally:
        for buf in [*s, consumer.buf, scratch, out, *closed.buffers(), *apart.buffers()]:
            dev.memory.free(buf)


def _compare_int8(report: Report, variant: str, got: dict, ref: dict, mode: str) -> None:
    """The closer's int8 copy against the producer's: levels equal (RMSNorm: but for rare ties), none unwritten,
    scales and sums within rounding."""
    total = got["hi"].size
    unwritten = sum(int(np.count_nonzero(got[k] == -128)) for k in ("hi", "lo"))
    record(report, "close.levels", variant + ".unwritten", f"{total}x2", float(unwritten), 0.5)
    for level in ("hi", "lo"):
        differ = int(np.count_nonzero(got[level] != ref[level]))
        value = differ / total if mode in FRACTION_MODES else differ
        record(report, "close.levels", f"{variant}.{level}", f"{total}", float(value), LEVEL_MISMATCH_TOL[mode, level])
    compare(report, "close.scales", variant, got["scale"], ref["scale"], TOL_SCALES)
    compare(report, "close.sums", variant, got["sums"], ref["sums"], TOL_SCALES)


def run_close_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """PAIRS, on GPUs with the tensor-copy matmul (sm_90+); elsewhere one record says they were not run."""
    if dev.info.arch < i8b.MIN_ARCH:
        record(report, "close", f"not run on sm_{dev.info.arch}", "-", 0.0, 1.0)
        return
    print("closer checks", flush=True)
    for pair in PAIRS:
        check_close(dev, report, rng, pair)
    for t in GATED_TOKENS:
        check_gated(dev, report, rng, t)
    for t in PLAIN_TOKENS:
        check_plain(dev, report, rng, t)


def time_close(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """The 27B pairs' matmul with its consumer's producer launched apart against the closer behind it (us),
    without PDL, from HBM: what the closer adds to the matmul's tail against what the producer launch costs."""
    if dev.info.arch < i8b.MIN_ARCH:
        return
    print("closer timings (us): matmul alone | matmul + producer launch | matmul with the closer", flush=True)
    for pair in PAIRS:
        if pair.name in TIMED and pair.tokens == 1:
            _time_pair(dev, report, rng, pair)


def _time_pair(dev: Device, report: Report, rng: np.random.Generator, pair: Pair) -> None:
    (rows, cols), (c_rows, width) = pair.producer, pair.consumer
    data = random_blocks(pair.producer_qtype, (rows, cols), rng)
    copies = max(1, min(8, (256 << 20) // data.nbytes))  # together past the L2: each launch streams from HBM
    ws = [ops.upload_weight(dev, data, pair.producer_qtype, (rows, cols), f"{pair.name}.{i}") for i in range(copies)]
    consumer = ops.DeviceWeight(Buffer(0, 0, "consumer"), pair.consumer_qtype, c_rows, width, "consumer")
    x = ops.alloc_act(dev, 1, cols, "x", precise=True)
    dev.upload(x.f32, rng.standard_normal(cols).astype(np.float32))
    norm = dev.to_device((1.0 + 0.2 * rng.standard_normal(width)).astype(np.float32), "norm")
    dst = ops.alloc_act(dev, 1, width, "dst", precise=True)
    scratch = closers.alloc_close_scratch(dev, width, "close.scratch")
    y = dev.alloc(4 * rows, "y")
    rms = pair.mode == "rmsnorm"
    cells = []
    try:
        # alone: the matmul without its consumer's input (what the producer and the closer each add to it)
        for label in ("alone", "apart", "closed"):
            on = label == "closed"
            with closing(on):
                ops.act_f16(dev, x.f32, x, 1, cols)
                closer = closers.closer_for(dev, ws[0], 1, pair.mode, dst, [consumer], scratch,
                                            norm if rms else None, EPS) if on else None
                count = {"i": 0}

                def run(closer=closer, produce=label == "apart"):
                    ops.matmul(dev, ws[count["i"] % len(ws)], x, y, 1, rows, closer=closer)
                    if produce and rms:
                        ops.act_rmsnorm(dev, y, norm, dst, 1, width, EPS)
                    elif produce:
                        ops.act_swiglu(dev, y, y.view(4 * width), dst, 1, rows)
                    count["i"] += 1

                med, spread = median_time(dev, run, reps=20, warmup=3, inner=2 * len(ws))
            report.timings.append(Timing("close", f"{pair.name}.{pair.mode}.{label}", f"{rows}x{cols}", med, spread,
                                         data.nbytes))
            cells.append(f"{label} {med * 1e3:6.1f}")
    finally:
        for buf in [*(w.buf for w in ws), norm, scratch, y, *x.buffers(), *dst.buffers()]:
            dev.memory.free(buf)
    print(f"  {pair.name:<10} {pair.mode:<8} " + " | ".join(cells), flush=True)
