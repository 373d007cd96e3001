"""Checks of the non-matmul kernels against engine/reference/ops.py at the 27B shapes (fresh random inputs,
NaN-poisoned outputs, never zeros as inputs)."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import TOL_F32, Report, Timing, compare, median_time, poison, record
from bench.gpu_kernels import i8_matmul, verify_i8
from engine.cuda import instances, ops
from engine.cuda.device import Buffer, Device
from engine.cuda.repack import random_blocks
from engine.gguf.quants import dequantize
from engine.reference import ops as ref
from engine.sampling import SamplingParams

H, FFN = 5120, 17408
F32 = np.float32
# Against the float64 reference: LEVEL_ERROR_MARGIN x the error the two int8 levels predict for these values (each
# rounds to a step of its superblock's largest / (127 x 254): the gated norm's heavier tails, silu(z) x w, give
# ~1e-4 where gaussian rows give ~3e-5). A lost low level is ~250 x that, a lost sub-block ~1e-2.
LEVEL_ERROR_MARGIN = 4.0


def level_error(values: np.ndarray) -> float:
    """The relative error of a product with random weight rows that the two-level int8 form of `values` (float64,
    whole superblocks) predicts: each value off by a uniform rounding of its superblock's low-level step."""
    blocks = values.reshape(-1, 256)
    step = np.abs(blocks).max(axis=1) / (127.0 * 254.0)
    return float(np.sqrt(np.sum(256 * step * step / 12.0) / np.sum(values * values)))


class Scope:
    """Buffers of one check, freed together."""

    def __init__(self, dev: Device):
        self.dev, self.bufs = dev, []

    def put(self, array: np.ndarray, what: str = "in") -> Buffer:
        """A device copy of a host array."""
        buf = self.dev.to_device(np.ascontiguousarray(array), what)
        self.bufs.append(buf)
        return buf

    def out(self, nbytes: int, what: str = "out") -> Buffer:
        """An output buffer, poisoned with NaN."""
        buf = self.dev.alloc(nbytes, what)
        poison(self.dev, buf)
        self.bufs.append(buf)
        return buf

    def get(self, buf: Buffer, shape: tuple[int, ...], dtype=F32) -> np.ndarray:
        """A host copy of a device buffer."""
        return self.dev.download(buf, dtype, shape)

    def close(self) -> None:
        """Free every buffer of the check."""
        for buf in self.bufs:
            self.dev.memory.free(buf)


def randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Standard normal f32 (scaled): never zeros."""
    return (rng.standard_normal(shape, dtype=F32) * F32(scale)).astype(F32)


def check_norms(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int = 5) -> None:
    """rms_norm, head_norm (RMS with weight, L2 with scale), gated_rms_norm."""
    s = Scope(dev)
    x, w = randn(rng, num_tokens, H), randn(rng, H)
    out = s.out(4 * num_tokens * H)
    ops.rms_norm(dev, s.put(x), s.put(w), out, num_tokens, H, H, H, 1e-6)
    compare(report, "rms_norm", "f32", s.get(out, (num_tokens, H)), ref.rms_norm(x, w, 1e-6), TOL_F32)
    # qwen35 q norm: 24 heads of 256 inside the packed [Q | gate] rows (head stride 512)
    q = randn(rng, num_tokens, 24 * 512)
    wq = randn(rng, 256)
    qb = s.put(q)
    ops.head_norm(dev, qb, s.put(wq), num_tokens, 24, 256, 24 * 512, 512, 1e-6)
    got = s.get(qb, (num_tokens, 24, 512))
    want = q.reshape(num_tokens, 24, 512).copy()
    want[..., :256] = ref.rms_norm(want[..., :256], wq, 1e-6)
    compare(report, "head_norm", "rms.qwen35q", got, want, TOL_F32)
    # DeltaNet q: L2 norm of 16 heads of 128 times 1/sqrt(128), rows of the 10240-wide conv output
    c = randn(rng, num_tokens, 10240)
    cb = s.put(c)
    ops.head_norm(dev, cb, None, num_tokens, 16, 128, 10240, 128, 1e-6, l2_scale=128 ** -0.5)
    want = c.copy()
    want[:, :2048] = (ref.l2_norm(c[:, :2048].reshape(num_tokens, 16, 128), 1e-6) * F32(128 ** -0.5)).reshape(
        num_tokens, -1)
    compare(report, "head_norm", "l2.gdn_q", s.get(cb, (num_tokens, 10240)), want, TOL_F32)
    o, z, wn = randn(rng, num_tokens, 48 * 128), randn(rng, num_tokens, 48 * 128), randn(rng, 128)
    out = s.out(4 * num_tokens * 48 * 128)
    ops.gated_rms_norm(dev, s.put(o), s.put(z), s.put(wn), out, num_tokens, 48, 128, 6144, 6144, 6144, 1e-6)
    want = ref.gated_rms_norm(o.reshape(num_tokens, 48, 128), z.reshape(num_tokens, 48, 128), wn, 1e-6)
    compare(report, "gated_rms_norm", "f32", s.get(out, (num_tokens, 48, 128)), want, TOL_F32)
    s.close()


def check_rope(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """Partial NEOX rope (qwen35: 64 of 256 dims, theta 1e7) near and far; full adjacent-pair rope (llama)."""
    s = Scope(dev)
    for name, positions, heads, dim, rope_dim, theta, neox in (
            ("neox.64of256", np.arange(995, 1000), 24, 256, 64, 1e7, True),
            ("neox.far", np.array([200_000, 262_143]), 4, 256, 64, 1e7, True),
            ("norm.128", np.arange(37, 42), 32, 128, 128, 5e5, False)):
        num_tokens = len(positions)
        x = randn(rng, num_tokens, heads, dim)
        xb = s.put(x)
        ops.rope(dev, xb, s.put(positions.astype(np.int32)), num_tokens, heads, heads * dim, dim, rope_dim, theta,
                 neox)
        want = ref.rope(x, positions, rope_dim, theta, neox)
        compare(report, "rope", name, s.get(xb, x.shape), want, TOL_F32)
    s.close()


def check_elementwise(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int = 5) -> None:
    """swiglu over the fused gate|up projection; sigmoid gating."""
    s = Scope(dev)
    gu = randn(rng, num_tokens, 2 * FFN, scale=3.0)
    gub = s.put(gu)
    out = s.out(4 * num_tokens * FFN)
    ops.swiglu(dev, gub, gub.view(4 * FFN), out, num_tokens, FFN, 2 * FFN, FFN)
    compare(report, "swiglu", "fused", s.get(out, (num_tokens, FFN)), ref.swiglu(gu[:, :FFN], gu[:, FFN:]), TOL_F32)
    x, gate = randn(rng, num_tokens, 6144), randn(rng, num_tokens, 6144, scale=3.0)
    xb = s.put(x)
    ops.sigmoid_mul(dev, xb, s.put(gate), num_tokens, 6144, 6144, 6144)
    compare(report, "sigmoid_mul", "f32", s.get(xb, x.shape), x * ref.sigmoid(gate), TOL_F32)
    s.close()


def check_embedding(dev: Device, report: Report, rng: np.random.Generator, rows: int = 32768) -> None:
    """Embedding rows of every supported type (H = 5120) against gguf dequantization."""
    for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16, Q.F32):
        s = Scope(dev)
        data = random_blocks(qtype, (rows, H), rng)
        w = ops.upload_weight(dev, data, qtype, (rows, H), "token_embd")
        s.bufs.append(w.buf)
        ids = np.array([0, 17, rows - 1, 12345, 9], np.int32)
        out = s.out(4 * len(ids) * H)
        ops.get_rows(dev, w, s.put(ids), out, len(ids), H)
        want = dequantize(data[ids], qtype, (len(ids), H))
        compare(report, "get_rows", qtype.name, s.get(out, (len(ids), H)), want, TOL_F32)
        s.close()


def check_argmax(dev: Device, report: Report, rng: np.random.Generator, vocab: int = 248320) -> None:
    """Greedy argmax with ties (lowest index wins); sampled tokens are checked through choose_rows."""
    s = Scope(dev)
    logits = randn(rng, 3, vocab, scale=4.0)
    logits[1, [5, 200_000]] = 50.0  # a tie: index 5 must win
    logits[2, vocab - 1] = 60.0
    ids = s.out(4 * 3)
    ops.argmax(dev, s.put(logits), ids, s.out(8 * 3 * 64), 3, vocab, vocab)
    got = s.get(ids, (3,), np.int32)
    want = np.argmax(logits, axis=1)
    compare(report, "argmax", "V248320", got.astype(F32), want.astype(F32), 1e-9)
    s.close()


class _Uniforms:
    """An rng whose draws are the given numbers in turn (the host rule fed the kernel's uniforms)."""

    def __init__(self, *us: float) -> None:
        self.us = list(us)

    def random(self) -> float:
        return self.us.pop(0)


# choose_rows' sampled cases: plain temperature and min_p; Qwen's recommended setting (top_k 20, top_p 0.95); top_p
# alone; top_k 1 (a tie at the top keeps the lower id alone); top_k with min_p after it
CHOOSE_CASES = (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, min_p=0.05),
                SamplingParams(temperature=0.6, top_k=20, top_p=0.95), SamplingParams(temperature=0.7, top_p=0.8),
                SamplingParams(top_k=1), SamplingParams(top_k=50, min_p=0.05))


def check_choose_rows(dev: Device, report: Report, rng: np.random.Generator, vocab: int = 248320,
                      trials: int = 40) -> None:
    """choose_rows against the host's rules on the same rows and uniform numbers, one block a row and spread over
    its chunks first (ops.choose_rows' parts; checks named spread.*): greedy, each row's argmax (a tie to the lowest
    id); sampled (CHOOSE_CASES), engine/sampling.py keep_or_resample for a row's deterministic draft (the top token,
    one at random, a tie at the top, the least likely) and sample() for the last row. The float32 weights and sums
    may move a draw that lands within rounding of a boundary: at most 1 % of the rows may differ. Rows of nearly
    equal logits: top_k 20 has thousands of tokens within 16x of the top, so the kernel narrows its threshold until
    the candidates fit ops.CHOOSE_CAP, and still chooses as the host; top_p 0.95 of them holds more than CHOOSE_CAP
    tokens: the host's rows (-2). A NaN row and an all -inf row give -1, an infinite top -2."""
    s = Scope(dev)
    logits = randn(rng, 6, vocab, scale=2.0)
    logits[:, rng.integers(0, vocab, 40)] += rng.uniform(4, 12, 40).astype(F32)  # a few likely tokens a row
    logits[3, [11, vocab - 7]] = 40.0  # a tie at the top
    top = np.argmax(logits, axis=1)
    drafts = np.array([top[0], int(rng.integers(vocab)), top[2], 11, int(np.argsort(logits[4])[0]), -1], np.int32)
    lb, db, ub, out = s.put(logits), s.put(drafts), s.out(16 * 6), s.out(8 * 6)
    flat = randn(rng, 3, vocab, scale=0.05)
    flat_drafts = np.array([int(np.argmax(flat[0])), 5, -1], np.int32)
    bad = np.zeros((3, vocab), F32)
    bad[0, 7], bad[1, :], bad[2, 9] = np.nan, -np.inf, np.inf
    bufs, flat_bufs, bad_bufs = (lb, db, ub, out), (s.put(flat), s.put(flat_drafts), ub, out), (s.put(bad), db, ub, out)
    for form, parts in choose_forms(s, 6):
        got = _choose(dev, s, bufs, 6, vocab, SamplingParams(temperature=0), parts)
        record(report, "choose_rows", f"{form}greedy", "argmax, kept",
               float(np.any(got[:, 0] != top) or np.any(got[:5, 1] != (top[:5] == drafts[:5]))), 0.5)
        for params in CHOOSE_CASES:
            differ = _choose_trials(dev, s, bufs, logits, drafts, params, rng, trials, parts)
            record(report, "choose_rows", f"{form}{_case_name(params)}", f"{trials}x6 rows", differ, 0.01)
        params = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
        differ = _choose_trials(dev, s, flat_bufs, flat, flat_drafts, params, rng, trials, parts)
        record(report, "choose_rows", f"{form}flat.{_case_name(params)}", f"{trials}x3 rows", differ, 0.01)
        got = _choose(dev, s, flat_bufs, 3, vocab, SamplingParams(top_p=0.95), parts)
        record(report, "choose_rows", f"{form}flat.p0.95", f"over {ops.CHOOSE_CAP}: -2", float(np.any(got[:, 0] != -2)),
               0.5)
        got = _choose(dev, s, bad_bufs, 3, vocab, SamplingParams(), parts)
        record(report, "choose_rows", f"{form}nan,-inf,+inf", "-1, -1, -2", float(got[:, 0].tolist() != [-1, -1, -2]),
               0.5)
    s.close()


def choose_forms(s: Scope, rows: int) -> tuple[tuple[str, Buffer | None], ...]:
    """choose_rows' two forms, as (check name prefix, parts): one block a row's passes, and spread over its chunks
    (parts poisoned first, so a part read before it is written fails)."""
    return ("", None), ("spread.", s.out(rows * ops.CHOOSE_PARTS_BYTES, "choose.parts"))


def time_choose_rows(dev: Device, report: Report, rng: np.random.Generator, vocab: int = 248320) -> None:
    """choose_rows on 1 and 5 rows of a 248,320-token head (a few likely tokens a row, as check_choose_rows'),
    greedy and each sampled case, in both forms, by CUDA events (ms, medians): what a cycle's choice costs on the
    device."""
    s = Scope(dev)
    logits = randn(rng, 5, vocab, scale=2.0)
    logits[:, rng.integers(0, vocab, 40)] += rng.uniform(4, 12, 40).astype(F32)
    drafts = np.argmax(logits, axis=1).astype(np.int32)
    drafts[-1] = -1
    lb, db, ub, out = s.put(logits), s.put(drafts), s.put(rng.random((5, 2))), s.out(8 * 5)
    for form, parts in choose_forms(s, 5):
        for params in (SamplingParams(temperature=0), *CHOOSE_CASES):
            for rows in (1, 5):
                med, spread = median_time(dev, lambda: ops.choose_rows(
                    dev, lb, db, ub, out, rows, vocab, vocab, params.temperature, params.min_p, params.top_k,
                    params.top_p, parts), inner=10)
                name = f"{form}{'greedy' if params.temperature == 0 else _case_name(params)}"
                report.timings.append(Timing("choose_rows", f"{name}.rows{rows}", f"{rows}x{vocab}", med, spread,
                                             4 * vocab * rows))
                print(f"  choose_rows {name} {rows} rows: {1e3 * med:.1f} us", flush=True)
    s.close()


def _choose(dev: Device, s: Scope, bufs: tuple[Buffer, ...], rows: int, vocab: int,
            params: SamplingParams, parts: Buffer | None = None) -> np.ndarray:
    """ops.choose_rows on bufs (logits, drafts, uniforms, out) with the request's parameters: out [rows, 2]."""
    logits, drafts, uniforms, out = bufs
    ops.choose_rows(dev, logits, drafts, uniforms, out, rows, vocab, vocab, params.temperature, params.min_p,
                    params.top_k, params.top_p, parts)
    return s.get(out, (rows, 2), np.int32)


def _choose_trials(dev: Device, s: Scope, bufs: tuple[Buffer, ...], logits: np.ndarray, drafts: np.ndarray,
                   params: SamplingParams, rng: np.random.Generator, trials: int,
                   parts: Buffer | None = None) -> float:
    """The fraction of rows whose choice differs from the host's over `trials` sets of uniform numbers."""
    differ = 0
    for _ in range(trials):
        u = rng.random((len(drafts), 2))
        dev.upload(bufs[2], u)
        got = _choose(dev, s, bufs, len(drafts), logits.shape[1], params, parts)
        differ += choose_differences(got, logits, drafts, u, params)
    return differ / (trials * len(drafts))


def _case_name(params: SamplingParams) -> str:
    """t0.6.k20.p0.95.minp0.0"""
    return f"t{params.temperature}.k{params.top_k}.p{params.top_p}.minp{params.min_p}"


def choose_differences(got: np.ndarray, logits: np.ndarray, drafts: np.ndarray, u: np.ndarray,
                       params: SamplingParams) -> int:
    """Rows whose (token, kept) differ from the host's rules fed the same uniform numbers."""
    # got: [T, 2] int32 (choose_rows' out); logits: [T, V]; u: [T, 2]
    from engine.sampling import keep_or_resample, sample

    differ = 0
    for t in range(len(drafts)):
        want = (keep_or_resample(logits[t], params, int(drafts[t]), _Uniforms(*u[t])) if drafts[t] >= 0
                else (False, sample(logits[t], params, _Uniforms(u[t, 0]))))
        differ += (int(got[t, 0]), bool(got[t, 1])) != (want[1], want[0])
    return differ


def run_op_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """Every non-matmul kernel but the penalties' and the sequence mixers' (bench/gpu_penalties.py,
    bench/gpu_mixers.py: part "kernels" of bench/gpu_check.py runs them after these)."""
    print("op checks (27B shapes)", flush=True)
    run_act_checks(dev, report, rng)
    check_norms(dev, report, rng)
    check_rope(dev, report, rng)
    check_elementwise(dev, report, rng)
    check_embedding(dev, report, rng)
    check_argmax(dev, report, rng)
    check_choose_rows(dev, report, rng)


def run_act_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """The producers (kernels/act.cu) at decode, verify and prefill widths."""
    check_act(dev, report, rng)
    check_act(dev, report, rng, 77, 768, head=64, precise=True)  # a partial block of superblocks, 64-wide heads
    check_act(dev, report, rng, 200, 6144, head=256)  # a prefill-sized run; heads spanning two warps
    check_act(dev, report, rng, 3, 5120, head=32, precise=True)
    check_act(dev, report, rng, 5, 6144, head=128, precise=True)  # a verify pass: each token on blocks of its own
    check_act(dev, report, rng, 8, 5120, head=64)
    check_act(dev, report, rng, 1, 5120, head=128, precise=True)


def _read_act(s: Scope, act, num_tokens: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The act layout and the hi + lo sub-block sums read back as rows [T, k] and [T, k / 32]."""
    groups, nsb = (num_tokens + 7) // 8, act.num_superblocks
    pos = np.arange(256)
    c, h, i, r = pos >> 6, (pos >> 5) & 1, (pos >> 2) & 7, pos & 3
    rows = np.zeros((num_tokens, k), np.float64)
    for buf in (act.x16, act.x16_lo) if act.x16_lo is not None else (act.x16,):  # hi (+ the precise residue)
        raw = s.get(buf, (groups, nsb, 16, 8, 16), np.float16)  # [group, sb, step, token, 4c + r]
        back = raw[:, :, 2 * i + h, :, 4 * c + r]  # advanced indices split by a slice go first: [256, group, sb, token]
        rows += back.transpose(1, 3, 2, 0).reshape(groups * 8, nsb * 256)[:num_tokens, :k].astype(np.float64)
    sums = [s.get(b, (groups, nsb, 8, 8), np.float16).astype(np.float64).transpose(0, 2, 1, 3).reshape(groups * 8, -1)
            for b in (act.sums, act.sums_lo)]
    return rows.astype(F32), (sums[0] + sums[1])[:num_tokens, : k // 32]


def _read_act8(s: Scope, act, num_tokens: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 copy (kernels/mmvq_i8.cu's act8 layout, one group) read back as the values its two levels stand
    for, [T, k], and its hi + lo sub-block sums, [T, k / 32]."""
    nsb, pos = act.num_superblocks, np.arange(256)
    where = 64 * (pos >> 6) + 16 * ((pos & 31) >> 3) + 8 * ((pos >> 5) & 1) + (pos & 7)  # act.cu act_i8
    q = s.get(act.q8, (nsb, 2, 8, 256), np.int8)[..., where].astype(np.float64)
    scale = s.get(act.scale8, (nsb, 2, 8)).astype(np.float64)
    values = (q * scale[..., None]).sum(1)  # [sb, token, 256]
    rows = values.transpose(1, 0, 2).reshape(8, nsb * 256)[:num_tokens, :k]
    sums = sum(s.get(b, (nsb, 8, 8), np.float16).astype(np.float64) for b in (act.sums8, act.sums8_lo))
    return rows, sums.transpose(1, 0, 2).reshape(8, -1)[:num_tokens, : k // 32]


def check_act(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int = 11, k: int = H,
              head: int = 128, precise: bool = False) -> None:
    """Every act variant (plain, RMSNorm, SwiGLU, gated per-head norm) against the reference, through the inverse
    layout; the sums must be those of exactly the f16 values written (hi + lo). Where the launch writes the int8
    copy too (up to the int8 matmuls' widest), its two levels against the reference (within 4 x the error the
    levels' steps predict, level_error) and its sums against them."""
    s = Scope(dev)
    act = ops.alloc_act(dev, num_tokens, k, "x", precise=precise)
    s.bufs += act.buffers()
    act8 = [b for b in (act.q8, act.scale8, act.sums8, act.sums8_lo) if b is not None]
    x, x2, w = randn(rng, num_tokens, k), randn(rng, num_tokens, k, scale=2.0), randn(rng, k)
    xb, x2b, wb = s.put(x), s.put(x2), s.put(w)
    wh = randn(rng, head)
    gated = ref.gated_rms_norm(x.reshape(num_tokens, -1, head), x2.reshape(num_tokens, -1, head), wh, 1e-6)
    cases = (("plain", lambda: ops.act_f16(dev, xb, act, num_tokens, k, out32=act.f32), x),
             ("rmsnorm", lambda: ops.act_rmsnorm(dev, xb, wb, act, num_tokens, k, 1e-6, out32=act.f32),
              ref.rms_norm(x, w, 1e-6)),
             ("swiglu", lambda: ops.act_swiglu(dev, xb, x2b, act, num_tokens, k, out32=act.f32), ref.swiglu(x, x2)),
             ("gatednorm", lambda: ops.act_gatednorm(dev, xb, x2b, s.put(wh), act, num_tokens, head, k, k, 1e-6,
                                                     out32=act.f32), gated.reshape(num_tokens, k)))
    for name, run, want in cases:
        for buf in [act.x16, act.sums, act.sums_lo, act.f32] + ([act.x16_lo] if precise else []) + act8:
            poison(dev, buf)
        run()
        rows, sums = _read_act(s, act, num_tokens, k)
        tag = f"{name}.T{num_tokens}.k{k}" + (f".h{head}" if name == "gatednorm" else "") + (".precise" if precise else "")
        compare(report, "act", tag, rows, want, TOL_F32 if precise else 1e-3)  # hi + lo: f32-level
        compare(report, "act", f"{tag}.f32", s.get(act.f32, (num_tokens, k)), want, TOL_F32)
        exact = rows.astype(np.float64).reshape(num_tokens, -1, 32).sum(-1)
        compare(report, "act", f"{tag}.sums", sums.astype(F32), exact.astype(F32), 1e-6)
        if act.i8_tokens:
            rows8, sums8 = _read_act8(s, act, num_tokens, k)
            compare(report, "act", f"{tag}.i8", rows8, want,
                    LEVEL_ERROR_MARGIN * level_error(np.asarray(want, np.float64)))
            compare(report, "act", f"{tag}.i8.sums", sums8, rows8.reshape(num_tokens, -1, 32).sum(-1), 1e-6)
    s.close()


# The producers of the 27B pass (kernels/act.cu: mode, row width), timed at each verify width with and without the
# int8 copy for the int8 matmuls (what writing it costs a launch: every producer of a verify pass writes it while
# a matmul of that width takes it), and with the copy on the group's blocks (act_<mode>_g1) instead of a block
# per token (act_<mode>_t1, ops.ACT_SPLIT_TOKENS).
PRODUCERS_TIMED = (("rmsnorm", H), ("swiglu", 17408), ("gatednorm", 6144), ("plain", 6144))


@contextmanager
def split_tokens(counts: frozenset[int]):
    """ops.ACT_SPLIT_TOKENS set to counts for the duration."""
    saved, ops.ACT_SPLIT_TOKENS = ops.ACT_SPLIT_TOKENS, counts
    try:
        yield
    finally:
        ops.ACT_SPLIT_TOKENS = saved


def time_producers(dev: Device, report: Report, rng: np.random.Generator, token_counts=(1, 2, 4, 5, 8)) -> None:
    """Each PRODUCERS_TIMED launch at each token count: its int8 copy off | on | on, one group's blocks (us)."""
    print("producer timings (us): without | with the int8 copy | with it, on the group's blocks", flush=True)
    for mode, k in PRODUCERS_TIMED:
        act = ops.alloc_act(dev, 8, k, "x", precise=True)
        x = dev.to_device(randn(rng, 8, k), "x")
        x2 = dev.to_device(randn(rng, 8, k), "x2")
        w = dev.to_device(randn(rng, k), "w")
        src = {"rmsnorm": ops.rmsnorm_of(x, w, k, 1e-6), "gatednorm": ops.gatednorm_of(x, x2, w, 128, k, k, 1e-6),
               "plain": ops.plain_of(x, k), "swiglu": ops.Producer("swiglu", ops.ActSrc(x.ptr, x2.ptr, 0, 0, k, k,
                                                                                           k, 0, 0.0))}[mode]
        cells = []
        for t in token_counts:
            times = []
            for copy, split in ((False, ops.ACT_SPLIT_TOKENS), (True, ops.ACT_SPLIT_TOKENS), (True, frozenset())):
                with i8_matmul(copy, min(t, instances.I8_MAX_TOKENS) if copy else None), verify_i8(copy), \
                        split_tokens(split):
                    med, spread = median_time(dev, lambda: ops.produce(dev, src, act, t), reps=30, warmup=5,
                                              inner=20)
                    want = t if copy and t <= ops._i8_copy_tokens(dev, act) else 0  # SwiGLU's width: 4 at most
                    assert act.i8_tokens == want, (mode, t, copy, act.i8_tokens)
                tag = f"{mode}.k{k}.T{t}" + (".i8copy" if copy else "") + (".group" if not split else "")
                report.timings.append(Timing("producer", tag, f"{t}x{k}", med, spread))
                times.append(med * 1e3)
            cells.append(f"T={t} {times[0]:5.1f} | {times[1]:5.1f} | {times[2]:5.1f}")
        print(f"  {mode:<9} k={k:<6} " + "   ".join(cells), flush=True)
        for buf in act.buffers() + [x, x2, w]:
            dev.memory.free(buf)
