"""The closers' GPU check (bench/gpu_close.py) without a GPU: its level tolerances against the closer's arithmetic
emulated in numpy (kernels/act8_close.cuh, act8.cuh Act8Levels), so the check neither passes a misplaced level nor
fails an exact kernel; and the whole check run on a device that keeps its buffers in host memory and runs no
kernel, so what the GPU call spends its minutes on cannot stop on a Python error (every comparison there fails:
nothing is computed)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from bench import gpu_close
from bench.gpu_common import Report
from engine.cuda import i8b, tma
from engine.cuda.memory import Buffer

F32 = np.float32


def _levels(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Act8Levels of superblocks v [n, 256] in float32: (hi, lo, s)."""
    mx = np.abs(v).max(axis=1, keepdims=True)
    s = mx / F32(127)
    qh = np.clip(np.rint(v * (F32(127) / mx)), -127, 127)
    ql = np.clip(np.rint((v - qh * s) * (F32(254) / s)), -127, 127)
    return qh, ql, s


def _rows(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """Rows whose magnitudes spread as a residual stream's do (0.05 to 50 times a gaussian), a few large channels."""
    x = rng.standard_normal((n, width)).astype(F32) * F32(10.0) ** rng.uniform(-1.3, 1.7, (n, 1)).astype(F32)
    x[:, rng.choice(width, 8, replace=False)] *= F32(20)
    return x


def test_rmsnorm_closers_levels_stay_within_the_checks_tolerance() -> None:
    """The closer's levels are those of x * w, the producer's of x * inv * w (act.cu's order): they part only at
    rounding ties, far below the check's fractions, while levels of the wrong values part almost everywhere."""
    rng = np.random.default_rng(21)
    width = 5120
    x, w = _rows(rng, 64, width), (F32(1) + F32(0.3) * rng.standard_normal(width).astype(F32))
    inv = (F32(1) / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6)).astype(F32)
    hi_c, lo_c, s_c = _levels((x * w).reshape(-1, 256))
    hi_p, lo_p, s_p = _levels(((x * inv) * w).reshape(-1, 256))
    for got, want, level in ((hi_c, hi_p, "hi"), (lo_c, lo_p, "lo")):
        fraction = np.mean(got != want)
        assert fraction < gpu_close.LEVEL_MISMATCH_TOL["rmsnorm", level] / 10, (level, fraction)
    scaled = (s_c.reshape(64, -1) * inv).reshape(-1, 1)
    assert np.max(np.abs(scaled / s_p - 1)) < gpu_close.TOL_SCALES / 10
    hi_w, _, _ = _levels((x * w * F32(1.5)).reshape(-1, 256) + F32(0.01))  # a wrong value: the check must see it
    assert np.mean(hi_w != hi_p) > 100 * gpu_close.LEVEL_MISMATCH_TOL["rmsnorm", "hi"]


def test_a_gated_norms_last_bit_moves_few_levels() -> None:
    """The closer sums a head's squares in another order than act.cu: its 1 / rms may differ in the last bit."""
    rng = np.random.default_rng(22)
    v = rng.standard_normal((4096, 256)).astype(F32)
    hi, lo, _ = _levels(v)
    hi2, lo2, _ = _levels(v * np.nextafter(F32(1), F32(2)))
    assert np.mean(hi != hi2) < gpu_close.LEVEL_MISMATCH_TOL["gatednorm", "hi"] / 10
    assert np.mean(lo != lo2) < gpu_close.LEVEL_MISMATCH_TOL["gatednorm", "lo"] / 10


def _copy(rng: np.random.Generator, tokens: int = 1, nsb: int = 20) -> dict[str, np.ndarray]:
    levels = rng.integers(-127, 128, (tokens, nsb, 256)).astype(np.int8)
    return {"hi": levels, "lo": levels.copy(), "scale": rng.uniform(0.1, 1, (tokens, nsb, 2)),
            "sums": rng.standard_normal((tokens, nsb, 8))}


@pytest.mark.parametrize("mode, ties_pass", [("rmsnorm", True), ("gatednorm", True), ("swiglu", False),
                                             ("plain", False)])
def test_level_ties_pass_where_the_closer_computes_otherwise_and_misplaced_levels_fail(mode: str,
                                                                                       ties_pass: bool) -> None:
    rng = np.random.default_rng(23)
    ref = _copy(rng)
    tie = {k: v.copy() for k, v in ref.items()}
    tie["lo"][0, 3, 17] += 1  # one level a step off: a rounding tie
    report = Report()
    gpu_close._compare_int8(report, "x", tie, ref, mode)
    assert all(c.ok for c in report.checks if c.variant == "x.lo") is ties_pass
    moved = {k: v.copy() for k, v in ref.items()}
    moved["hi"] = np.roll(moved["hi"], 8, axis=2)  # levels off their places
    report = Report()
    gpu_close._compare_int8(report, "x", moved, ref, mode)
    assert not all(c.ok for c in report.checks if c.variant == "x.hi")


class _HostDevice:
    """Buffers in host memory at made-up addresses; kernels are looked up and launched as nothing."""

    def __init__(self) -> None:
        self.info = SimpleNamespace(name="NVIDIA H100 80GB HBM3",
                                    arch=90, max_smem_per_block=232448, multiprocessors=132)
        self.memory = SimpleNamespace(free=lambda buf: None)
        self.pdl, self.skip, self._next, self._mem = False, None, 1 << 32, {}
        self.launched: list[str] = []

    def alloc(self, nbytes: int, what: str) -> Buffer:
        ptr, self._next = self._next, self._next + (nbytes + 4095) // 4096 * 4096 + 4096
        self._mem[ptr] = np.zeros(nbytes, np.uint8)
        return Buffer(ptr, nbytes, what)

    def _bytes(self, buf: Buffer) -> np.ndarray:
        base = max(p for p in self._mem if p <= buf.ptr)
        return self._mem[base][buf.ptr - base:buf.ptr - base + buf.nbytes]

    def upload(self, buf: Buffer, array: np.ndarray, offset: int = 0) -> None:
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        self._bytes(buf)[offset:offset + raw.size] = raw

    def to_device(self, array: np.ndarray, what: str) -> Buffer:
        buf = self.alloc(array.nbytes, what)
        self.upload(buf, array)
        return buf

    def download(self, buf: Buffer, dtype, shape, offset: int = 0) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        assert offset + n <= buf.nbytes, f"{buf.what}: read past the end"
        return self._bytes(buf)[offset:offset + n].view(dtype).reshape(shape).copy()

    def fill_u32(self, buf: Buffer, value: int, count: int | None = None) -> None:
        words = self._bytes(buf)[: (buf.nbytes // 4) * 4].view(np.uint32)
        words[: count if count is not None else words.size] = value & 0xFFFFFFFF

    def kernel(self, name: str) -> SimpleNamespace:
        from engine.cuda import instances

        assert name in instances.INSTANCES, f"no instance {name}"
        return SimpleNamespace(name=name)

    def set_max_dynamic_smem(self, kernel, nbytes: int) -> None:
        assert nbytes <= self.info.max_smem_per_block, (kernel.name, nbytes)

    def launch(self, kernel, grid, block, args, smem: int = 0) -> None:
        self.launched.append(kernel.name)

    def join(self) -> None:
        pass

    @contextmanager
    def beside(self):
        yield


def test_the_check_runs_through_on_a_device_that_computes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "quant_map", lambda w: tma.TensorMap())  # the driver encodes it on the GPU
    small = [gpu_close.Pair("small_norm", (512, 768), (1024, 512), "rmsnorm", Q.Q4_K),
             gpu_close.Pair("small_swiglu", (1024, 768), (512, 512), "swiglu", Q.Q4_K, tokens=3),
             gpu_close.Pair("small_gates", (512, 768), (96, 512), "rmsnorm", Q.Q8_0, tokens=2),
             gpu_close.Pair("small_q6", (512, 768), (64, 512), "rmsnorm", Q.Q6_K, Q.Q6_K, tokens=4),
             gpu_close.Pair("small_verify", (512, 768), (1024, 512), "rmsnorm", Q.Q4_K, tokens=5),
             gpu_close.Pair("small_five", (512, 7168), (64, 512), "rmsnorm", Q.Q6_K, Q.Q6_K, tokens=5, five=True)]
    monkeypatch.setattr(gpu_close, "PAIRS", small)
    monkeypatch.setattr(gpu_close, "GATED_TOKENS", (5,))
    monkeypatch.setattr(gpu_close, "PLAIN_TOKENS", (1,))
    dev, report = _HostDevice(), Report()
    gpu_close.run_close_checks(dev, report, np.random.default_rng(3))
    launched = set(dev.launched)
    for name in ("mmvq_q4_K_i8b_s3n2_close_rmsnorm", "mmvq_q4_K_i8v_t3_close_swiglu", "mmvq_q8_0_i8",
                 "mmvq_q6_K_i8_t4_close_rmsnorm", "mmvq_q4_K_i8v_t5_close_rmsnorm", "gdn_k128_close_gatednorm",
                 "mmvq_q6_K_i8_t5_close_rmsnorm", "mmvq_q6_K_i8_t5", "attn_combine_close_plain", "act_plain_t1",
                 "act_rmsnorm_t1", "act_swiglu_t1", "act_gatednorm_t1"):
        assert name in launched, name
    ops_seen = {c.op for c in report.checks}
    assert {"close.own", "close.levels", "close.scales", "close.sums", "close.again", "close.consumer",
            "close.counters"} <= ops_seen
    assert not any(c.ok for c in report.checks if c.op == "close.levels" and c.variant.endswith(".unwritten"))
