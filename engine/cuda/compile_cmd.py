"""`openjet-engine compile [--arch N|auto] [--json] [--force] [--check]`: compile every kernel for one GPU
architecture into the disk cache before the first model load, with progress.

A unit is one NVRTC program: each kernels/<op>.cu file with the name expressions of its instances
(engine/cuda/instances.py), plus the megakernel's programs once engine/cuda/megakernel exposes them
(see megakernel_units). Units are compiled exactly as Device loads them (no extra options but a file's feature set
where it needs one, unit_options; a cubin, or PTX for a GPU newer than this NVRTC), so the first load afterwards is
all cache hits.

Progress is one line per file (compile time or "cached"); with --json it is JSON Lines on stdout for a parent
process, one object per line:
  {"event": "start", "arch": 90, "target": "sm_90", "is_ptx": false, "files": [...], "total": 9, "cache": DIR,
   "nvrtc": "13.0", "jobs": 2, "is_check": false}
  {"event": "file", "file": "mmvq", "group": "cuda", "status": "compiled" | "cached" | "missing" | "failed",
   "seconds": 7.7, "num_instances": 21, "done": 1, "total": 9, "error": "", "log": ""}
  {"event": "done", "target": "sm_90", "num_compiled": 8, "num_cached": 1, "num_missing": 0, "num_failed": 0,
   "seconds": 12.3, "is_ok": true}
Exit status: 0 when every file compiled or was cached (--check: every file is cached), 1 when a file failed to
compile (--check: a file is not cached), 2 for a usage error (bad --arch, no GPU for auto, no NVRTC).
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.cuda import nvrtc
from engine.errors import EngineError

MIN_ARCH = 80  # the kernels need sm_80 or newer (engine/cuda/device.py MIN_COMPUTE_CAPABILITY)
MEGAKERNEL_PACKAGE = "engine.cuda.megakernel"


@dataclass(frozen=True, slots=True)
class CompileUnit:
    """One NVRTC program: its .cu file, the name expressions to instantiate, extra options, the include folder."""

    name: str
    group: str  # "cuda" (the per-op kernels) or "megakernel": a failure blocks that engine
    source: Path
    expressions: tuple[str, ...]
    options: tuple[str, ...] = ()
    kernel_dir: Path = nvrtc.KERNEL_DIR  # -I folder; its headers are part of the cache key
    cost: float = 1.0  # relative compile time: the pool starts the slowest first so its tail is short


@dataclass(frozen=True, slots=True)
class Target:
    """What NVRTC compiles for a GPU: sm_<arch> cubins, or compute_<arch> PTX for a GPU newer than NVRTC."""

    gpu_arch: int
    arch: int
    is_ptx: bool

    @property
    def name(self) -> str:
        """sm_90, or compute_120 for PTX."""
        return f"{'compute' if self.is_ptx else 'sm'}_{self.arch}"


@dataclass(frozen=True, slots=True)
class FileResult:
    """The outcome for one unit: compiled, cached, missing (--check) or failed (with the compiler's log)."""

    file: str
    group: str
    status: str
    seconds: float
    num_instances: int
    error: str = ""
    log: str = ""


def kernel_units(kernel_dir: Path = nvrtc.KERNEL_DIR) -> list[CompileUnit]:
    """One unit per kernels/<op>.cu file, with every instance of engine/cuda/instances.py in it."""
    from engine.cuda import instances  # imports gguf and numpy: only where the table is needed

    units = []
    for file, insts in instances.files().items():
        exprs = tuple(i.expr for i in insts)
        # the GEMM's tensor-core templates compile slowest per instance (6.8 s for 6 instances vs mmvq's 5.1 s for 21)
        cost = sum(len(e) for e in exprs) * (4 if file == "gemm" else 1)
        units.append(CompileUnit(file, "cuda", kernel_dir / f"{file}.cu", exprs, (), kernel_dir, float(cost)))
    return units


def megakernel_units() -> list[CompileUnit]:
    """The megakernel's NVRTC programs; [] until engine/cuda/megakernel exposes them.

    The hook: engine/cuda/megakernel/__init__.py defines `compile_units() -> list[CompileUnit]` (this module's
    CompileUnit, group "megakernel"), listing each program exactly as its runner compiles it through
    nvrtc.compile_cached (same source, expressions, options and kernel_dir), so that the runner's first launch hits
    the cache this command fills.
    """
    try:
        package = importlib.import_module(MEGAKERNEL_PACKAGE)
    except ModuleNotFoundError as exc:
        if exc.name != MEGAKERNEL_PACKAGE:
            raise  # the package exists but something it imports does not: a real error
        return []
    provider = getattr(package, "compile_units", None)
    if provider is None:
        return []
    units = list(provider())
    for unit in units:
        assert isinstance(unit, CompileUnit), f"{MEGAKERNEL_PACKAGE}.compile_units() returned {unit!r}"
    return units


def parse_arch(text: str) -> int | None:
    """'auto' -> None; '90', 'sm_90' or '9.0' -> 90. EngineError for anything else."""
    text = text.strip().lower()
    if text == "auto":
        return None
    if match := re.fullmatch(r"(?:sm_)?(\d{2,3})", text):
        return int(match.group(1))
    if match := re.fullmatch(r"(\d{1,2})\.(\d)", text):
        return 10 * int(match.group(1)) + int(match.group(2))
    raise EngineError(f"--arch {text!r}: give a compute capability such as 90, sm_90 or 9.0, or auto")


def detect_arch() -> int:
    """The compute capability of the GPU the engine serves on (CUDA device 0), through the driver."""
    from engine.cuda.driver import NoGpuError, check

    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
    except Exception as exc:  # the loader raises its own error types where libcuda is absent
        raise NoGpuError(f"--arch auto needs an NVIDIA GPU: no driver found ({exc}); give --arch N") from exc
    if err != driver.CUresult.CUDA_SUCCESS or int(check(driver.cuDeviceGetCount(), "cuDeviceGetCount")) == 0:
        raise NoGpuError("--arch auto needs an NVIDIA GPU and the driver reports none; give --arch N")
    dev = check(driver.cuDeviceGet(0), "cuDeviceGet")
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "major")
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "minor")
    return 10 * int(major) + int(minor)


def resolve_target(gpu_arch: int, supported: list[int]) -> Target:
    """The compilation Device would do for this GPU: a cubin where NVRTC knows the architecture, else PTX for the
    newest one it knows below it (JIT-compiled by the driver)."""
    if gpu_arch < MIN_ARCH:
        raise EngineError(f"sm_{gpu_arch} is older than sm_{MIN_ARCH}, the oldest architecture OpenJet's kernels run on")
    if gpu_arch in supported:
        return Target(gpu_arch, gpu_arch, False)
    return Target(gpu_arch, max(a for a in supported if a <= gpu_arch), True)


def unit_options(unit: CompileUnit, target: Target) -> tuple[str, ...]:
    """The unit's options for this target: a per-op file's own feature set where it needs one (as Device adds it,
    nvrtc.file_options), after the unit's."""
    if unit.group != "cuda" or target.is_ptx:
        return unit.options
    from engine.cuda import instances

    return unit.options + instances.arch_options(unit.name, target.arch)


def cache_entry(unit: CompileUnit, target: Target, directory: Path) -> tuple[Path, Path, str]:
    """(metadata, image, key) of the unit's entry in the cache, named as nvrtc.compile_cached names it (a test
    checks the two agree); the metadata is written last, so its presence means the entry is complete."""
    key = nvrtc.source_digest(unit.source, (*unit_options(unit, target), f"ptx={target.is_ptx}"), target.arch,
                              unit.expressions, unit.kernel_dir)
    stem = directory / f"{unit.source.stem}-{'compute' if target.is_ptx else 'sm'}{target.arch}-{key[:24]}"
    return stem.with_suffix(".json"), stem.with_suffix(".ptx" if target.is_ptx else ".cubin"), key


def is_cached(unit: CompileUnit, target: Target, directory: Path) -> bool:
    """Whether loading the unit would be a cache hit (no compilation)."""
    meta_path, image_path, key = cache_entry(unit, target, directory)
    try:
        return json.loads(meta_path.read_text()).get("key") == key and image_path.is_file()
    except (OSError, ValueError):
        return False


def compile_unit(unit: CompileUnit, target: Target, directory: Path, is_forced: bool = False) -> FileResult:
    """Compile one unit through the cache (is_forced: drop its entry first); a compile error becomes a failed
    result carrying NVRTC's log. Runs in the pool's worker processes."""
    t0 = time.perf_counter()
    if is_forced:
        meta_path, image_path, _ = cache_entry(unit, target, directory)
        meta_path.unlink(missing_ok=True)  # metadata first: a half-removed entry is never a hit
        image_path.unlink(missing_ok=True)
    try:
        out = nvrtc.compile_cached(unit.source, target.arch, unit.expressions, unit_options(unit, target),
                                   unit.kernel_dir, directory, ptx=target.is_ptx)
    except nvrtc.KernelCompileError as exc:
        log = str(exc).partition("\n")[2] or str(exc)  # the first line repeats the file and target, named fully here
        return FileResult(unit.name, unit.group, "failed", time.perf_counter() - t0, len(unit.expressions),
                          f"{unit.source} did not compile for {target.name}", log)
    status = "cached" if out.from_cache else "compiled"
    return FileResult(unit.name, unit.group, status, time.perf_counter() - t0, len(unit.expressions))


def compile_units(units: list[CompileUnit], target: Target, directory: Path, *, is_forced: bool = False,
                  jobs: int = 1, on_result: Callable[[FileResult], None] | None = None) -> list[FileResult]:
    """Compile every unit, `jobs` at a time in worker processes, reporting each result as it finishes."""
    ordered = sorted(units, key=lambda u: -u.cost)
    results: list[FileResult] = []

    def finish(result: FileResult) -> None:
        """Keep and report one result."""
        results.append(result)
        if on_result is not None:
            on_result(result)

    if not is_forced:  # cache hits are reported at once, without starting a worker process
        hits = [u for u in ordered if is_cached(u, target, directory)]
        for unit in hits:
            finish(compile_unit(unit, target, directory))
        ordered = [u for u in ordered if u not in hits]
    if jobs <= 1 or len(ordered) <= 1:
        for unit in ordered:
            finish(compile_unit(unit, target, directory, is_forced))
        return results
    # spawn, not fork: the caller may hold a CUDA context (the workers only ever touch NVRTC)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(compile_unit, u, target, directory, is_forced) for u in ordered]
        for future in as_completed(futures):
            finish(future.result())
    return results


def select_units(units: list[CompileUnit], only: str | None) -> list[CompileUnit]:
    """The units named by --only (comma-separated file names), all of them without it; each source must exist."""
    if only:
        wanted = [name.strip().removesuffix(".cu") for name in only.split(",") if name.strip()]
        known = {u.name: u for u in units}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise EngineError(f"--only: no kernel file {', '.join(unknown)}; the files are {', '.join(known)}")
        units = [known[name] for name in dict.fromkeys(wanted)]
    for unit in units:
        if not unit.source.is_file():
            raise EngineError(f"kernel source {unit.source} does not exist")
    return units


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `openjet-engine compile`."""
    parser.add_argument("--arch", default="auto", metavar="N|auto",
                        help="compute capability to compile for: 90, sm_90 or 9.0; auto: the GPU present (default)")
    parser.add_argument("--json", action="store_true", help="print progress as JSON Lines events on stdout")
    parser.add_argument("--force", action="store_true", help="compile again even where the cache has the file")
    parser.add_argument("--check", action="store_true",
                        help="compile nothing: report which files are cached (exit 1 when some are not)")
    parser.add_argument("--only", metavar="FILE[,FILE]", help="only these kernel files (e.g. norm,rope)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="compiler processes at once (default: one per CPU core, at most one per file)")
    parser.add_argument("--kernel-dir", type=Path, default=None,
                        help="compile the kernel sources in this folder instead of the installed ones")


def _plural(count: int, noun: str, suffix: str = "s") -> str:
    """'1 file', '3 files'."""
    return f"{count} {noun}{'' if count == 1 else suffix}"


def _file_line(result: FileResult) -> str:
    """One text progress line: the file, its instance count, and its compile time or status."""
    outcome = f"{result.seconds:6.1f} s" if result.status == "compiled" else result.status
    return f"  {result.file:<14} {result.num_instances:3d} instances  {outcome}"


class _Progress:
    """Writes start, per-file and done events as text lines or JSON Lines, and counts outcomes."""

    def __init__(self, is_json: bool, target: Target, units: list[CompileUnit]):
        self.is_json, self.target, self.total = is_json, target, len(units)
        self.results: list[FileResult] = []
        self.t0 = time.perf_counter()

    def emit(self, event: dict[str, object], text: str | None) -> None:
        """One event on stdout, flushed at once so a parent reading the pipe sees it now."""
        if self.is_json:
            print(json.dumps(event), flush=True)
        elif text is not None:
            print(text, flush=True)

    def on_result(self, result: FileResult) -> None:
        """Report one finished file; a compile error goes to stderr with NVRTC's log."""
        self.results.append(result)
        event = {"event": "file", **asdict(result), "seconds": round(result.seconds, 3),
                 "done": len(self.results), "total": self.total}
        self.emit(event, _file_line(result))
        if result.status == "failed":
            print(f"openjet-engine compile: {result.error}\n{result.log}", file=sys.stderr, flush=True)

    def finish(self) -> dict[str, object]:
        """The done event (also emitted)."""
        counts = {s: sum(r.status == s for r in self.results) for s in ("compiled", "cached", "missing", "failed")}
        event = {"event": "done", "target": self.target.name, **{f"num_{s}": n for s, n in counts.items()},
                 "seconds": round(time.perf_counter() - self.t0, 3),
                 "is_ok": counts["failed"] == 0 and counts["missing"] == 0}
        parts = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        self.emit(event, f"{_plural(self.total, 'file')} for {self.target.name}: {parts} in {event['seconds']:.1f} s")
        return event


def _target_from_args(args: argparse.Namespace) -> Target:
    """The Target for --arch (auto: the GPU present), checked against this NVRTC."""
    try:
        supported = nvrtc.supported_archs()
    except nvrtc.KernelCompileError as exc:
        raise EngineError(f"NVRTC is not usable here: {exc}") from exc
    requested = parse_arch(args.arch)
    return resolve_target(detect_arch() if requested is None else requested, supported)


def _units_from_args(args: argparse.Namespace) -> list[CompileUnit]:
    """The units to handle: every kernel file (from --kernel-dir if given) and the megakernel's, cut by --only."""
    kernel_dir = args.kernel_dir.resolve() if args.kernel_dir else nvrtc.KERNEL_DIR
    if not kernel_dir.is_dir():
        raise EngineError(f"--kernel-dir {kernel_dir} is not a folder")
    extra = megakernel_units() if args.kernel_dir is None else []  # the megakernel sources live beside its code
    return select_units(kernel_units(kernel_dir) + extra, args.only)


def _cache_from_args(args: argparse.Namespace) -> Path:
    """The kernel cache folder (OPENJET_KERNEL_CACHE, else under XDG_CACHE_HOME), created unless only checking."""
    directory = nvrtc.cache_dir()
    if not args.check:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EngineError(f"the kernel cache {directory} cannot be created: {exc}") from exc
    return directory


def run(args: argparse.Namespace) -> int:
    """Compile (or with --check, look up) every unit for the target; exit 0 ok, 1 a file failed or is missing."""
    if args.jobs is not None and args.jobs < 1:
        raise EngineError(f"--jobs must be at least 1, got {args.jobs}")
    target = _target_from_args(args)
    units = _units_from_args(args)
    directory = _cache_from_args(args)
    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(units)))
    progress = _Progress(args.json, target, units)
    major, minor = nvrtc.nvrtc_version()
    verb = "checking" if args.check else "compiling"
    progress.emit({"event": "start", "arch": target.gpu_arch, "target": target.name, "is_ptx": target.is_ptx,
                   "files": [u.name for u in units], "total": len(units), "cache": str(directory),
                   "nvrtc": f"{major}.{minor}", "jobs": jobs, "is_check": args.check},
                  f"{verb} {_plural(len(units), 'kernel file')} for {target.name} (NVRTC {major}.{minor}"
                  f"{'' if args.check else ', up to ' + _plural(jobs, 'process', 'es')}) in {directory}")
    if args.check:
        for unit in units:
            status = "cached" if is_cached(unit, target, directory) else "missing"
            progress.on_result(FileResult(unit.name, unit.group, status, 0.0, len(unit.expressions)))
    else:
        compile_units(units, target, directory, is_forced=args.force, jobs=jobs, on_result=progress.on_result)
    return 0 if progress.finish()["is_ok"] else 1
