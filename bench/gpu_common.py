"""Helpers shared by the GPU check and benchmark scripts: result records, comparisons, timing, copy bandwidth."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from engine.cuda.device import Buffer, Device  # noqa: E402

NAN_BITS = 0x7FC00000  # f32 quiet NaN: outputs are poisoned with it before every checked launch
TOL_F32 = 1e-3  # ||out - ref|| / ||ref|| for float32 arithmetic
TOL_F16 = 1e-2  # with f16 (or int8) operands


@contextmanager
def patched(obj, **values):
    """obj's attributes set to values for the block (a module's switches, e.g. gemm.STAGED), as they were after."""
    saved = {name: getattr(obj, name) for name in values}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)


def results_json(obj, depth: int = 0, flat_at: int = 4) -> str:
    """obj as JSON for bench/results: indented down to depth flat_at, each value there on one line (the kept
    profiles and traces, ~60 % of a cycle result's bytes as indented JSON; every call's files travel with the
    working tree to the GPU machine, 64 MiB in all)."""
    if depth >= flat_at or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, separators=(",", ":"), default=float)
    pad = " " * (depth + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(str(k))}: {results_json(v, depth + 1, flat_at)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    items = [pad + results_json(v, depth + 1, flat_at) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + " " * depth + "]"


@dataclass(slots=True)
class Check:
    """One correctness comparison."""

    op: str
    variant: str
    shape: str
    rel_err: float
    tol: float
    unwritten: int = 0

    @property
    def ok(self) -> bool:
        """Finite, within tolerance, every output written."""
        return bool(np.isfinite(self.rel_err)) and self.rel_err < self.tol and self.unwritten == 0


@dataclass(slots=True)
class Timing:
    """One timed operation: median of CUDA-event times, and the bytes it must move."""

    op: str
    variant: str
    shape: str
    median_ms: float
    spread_ms: float
    bytes_moved: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        """Achieved GB/s over the bytes that had to move."""
        return self.bytes_moved / (self.median_ms * 1e-3) / 1e9 if self.median_ms > 0 else 0.0


@dataclass(slots=True)
class Report:
    """Everything one run produced."""

    checks: list[Check] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def write(self, path: Path) -> None:
        """Write as JSON."""
        data = {"info": self.info, "notes": self.notes,
                "checks": [asdict(c) | {"ok": c.ok} for c in self.checks],
                "timings": [asdict(t) | {"gbps": t.gbps} for t in self.timings]}
        path.write_text(results_json(data))


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN anywhere gives NaN)."""
    out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
    denom = np.linalg.norm(ref64)
    return float(np.linalg.norm(out64 - ref64) / (denom if denom > 0 else 1.0))


def compare(report: Report, op: str, variant: str, out: np.ndarray, ref: np.ndarray, tol: float) -> Check:
    """Record a comparison of a poisoned-then-written output against its reference."""
    check = Check(op, variant, "x".join(map(str, ref.shape)), rel_err(out, ref), tol,
                  int(np.count_nonzero(np.isnan(out)) - np.count_nonzero(np.isnan(ref))))
    report.checks.append(check)
    status = "ok " if check.ok else "FAIL"
    print(f"  {status} {op:<14} {variant:<10} {check.shape:<18} rel {check.rel_err:.2e} (tol {tol:.0e})"
          + (f" unwritten {check.unwritten}" if check.unwritten else ""), flush=True)
    return check


def record(report: Report, op: str, variant: str, shape: str, value: float, tol: float) -> Check:
    """Record a check whose figure of merit is computed by the caller (lower is better)."""
    check = Check(op, variant, shape, float(value), tol)
    report.checks.append(check)
    print(f"  {'ok ' if check.ok else 'FAIL'} {op:<14} {variant:<10} {shape:<18} value {value:.3e} (tol {tol:.0e})",
          flush=True)
    return check


def median_time(dev: Device, fn, reps: int = 30, warmup: int = 5, inner: int = 1) -> tuple[float, float]:
    """(median, interquartile spread) in ms per call of fn() by CUDA events. With inner > 1, `inner` calls are
    captured in one CUDA graph and the graph is timed, so host launch overhead stays out of the figure."""
    if inner > 1:
        for _ in range(2):
            fn()  # compile and load before capture
        with dev.capture() as holder:
            for _ in range(inner):
                fn()
        graph = holder[0]
        times = sorted(t / inner for t in dev.time_ms(graph.launch, reps=reps, warmup=warmup))
        graph.destroy()
    else:
        times = sorted(dev.time_ms(fn, reps=reps, warmup=warmup))
    q1, q3 = times[len(times) // 4], times[(3 * len(times)) // 4]
    return statistics.median(times), q3 - q1


class _Event:
    """A CUDA event recorded on the device's stream: record(), then elapsed(later) in ms once both have run."""

    def __init__(self, dev: Device, handle):
        self.dev, self.handle = dev, handle

    def record(self) -> None:
        from cuda.bindings import driver as drv

        from engine.cuda.driver import check

        check(drv.cuEventRecord(self.handle, self.dev.stream), "cuEventRecord")

    def elapsed(self, later: "_Event") -> float:
        from cuda.bindings import driver as drv

        from engine.cuda.driver import check

        check(drv.cuEventSynchronize(later.handle), "cuEventSynchronize")
        return float(check(drv.cuEventElapsedTime(self.handle, later.handle), "cuEventElapsedTime"))


@contextmanager
def device_events(dev: Device, count: int):
    """count timing events on dev's stream, destroyed on exit."""
    from cuda.bindings import driver as drv

    from engine.cuda.driver import check

    events = [_Event(dev, check(drv.cuEventCreate(0), "cuEventCreate")) for _ in range(count)]
    try:
        yield events
    finally:
        for ev in events:
            check(drv.cuEventDestroy(ev.handle), "cuEventDestroy")


def copy_bandwidth(dev: Device, nbytes: int = 2 << 30) -> Timing:
    """Device-to-device copy of nbytes: GB/s counts bytes read plus bytes written."""
    src, dst = dev.alloc(nbytes, "bw.src"), dev.alloc(nbytes, "bw.dst")
    dev.fill_u32(src, 0x3F800000)
    med, spread = median_time(dev, lambda: dev.copy(dst, src, nbytes), reps=20, warmup=3)
    dev.memory.free(src)
    dev.memory.free(dst)
    return Timing("copy", "d2d", f"{nbytes >> 20}MiB", med, spread, 2 * nbytes)


def poison(dev: Device, buf: Buffer) -> None:
    """Fill a buffer with NaN so that any element a kernel fails to write is caught."""
    dev.fill_u32(buf, NAN_BITS)


def machine_info(dev: Device) -> dict:
    """GPU, driver, toolchain and commit, for the results file."""
    from engine.cuda import nvrtc

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    drv_version = ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        drv_version = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"gpu": dev.info.name, "arch": f"sm_{dev.info.arch}", "sms": dev.info.multiprocessors,
            "memory_gib": round(dev.info.total_memory / 2**30, 1), "l2_mib": dev.info.l2_bytes >> 20,
            "driver": drv_version, "nvrtc": ".".join(map(str, nvrtc.nvrtc_version())),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": os.environ.get("OPENJET_COMMIT", commit),
            "python": sys.version.split()[0], "numpy": np.__version__}
