"""Run-time compilation of the kernels with NVRTC (cuda.bindings.nvrtc), cached on disk.

A kernel file engine/cuda/kernels/<op>.cu is compiled as one NVRTC program for one compute capability into a
cubin (machine code, loadable with no JIT) and PTX. Template instances are reached through NVRTC name expressions
("mmvq<QT_Q4_K>"), so the cubin's mangled names are looked up, never hand-written. No GPU or driver is needed to
compile: CI compiles every kernel for every supported architecture on a CPU machine.

The cache key covers everything the output depends on: the source and every header of the kernels folder, the
options, the architecture, the name expressions and the NVRTC version.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
BASE_OPTIONS = ("-std=c++17", "--restrict", "-lineinfo")
# Bump when the cache layout changes: old entries are simply never hit again.
CACHE_FORMAT = 1
# Defines every per-op kernel compiles with, "NAME=value,NAME2=value" (a benchmark knob: e.g. WEIGHT_EVICT_FIRST=1,
# kernels/common.cuh); part of the options, so of the cache key.
DEFINES_ENV = "OPENJET_CUDA_DEFINES"


class KernelCompileError(EngineError):
    """NVRTC refused a kernel source; the message carries the compiler log."""


@dataclass(frozen=True, slots=True)
class CompiledKernels:
    """One compiled .cu file: a cubin (or PTX for a GPU newer than this NVRTC), and expression -> mangled symbol."""

    name: str
    arch: int
    image: bytes
    is_ptx: bool
    symbols: dict[str, str]
    log: str
    from_cache: bool = False


def _nvrtc():
    """The NVRTC bindings, with a readable error where cuda-python is missing."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - cuda-python is a hard dependency
        raise KernelCompileError(f"cuda-python (cuda.bindings.nvrtc) is not importable: {exc}") from exc
    return nvrtc


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library in use."""
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, err, "nvrtcVersion")
    return int(major), int(minor)


def supported_archs() -> list[int]:
    """Compute capabilities this NVRTC can compile cubins for (e.g. [75, 80, ..., 120])."""
    nvrtc = _nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(nvrtc, err, "nvrtcGetSupportedArchs")
    return [int(a) for a in archs]


def _check(nvrtc, err, what: str, log: str = "") -> None:
    """Raise KernelCompileError for a failed NVRTC call."""
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        detail = f"\n{log}" if log else ""
        raise KernelCompileError(f"{what} failed: {text.decode(errors='replace')}{detail}")


def _headers(kernel_dir: Path) -> list[Path]:
    """Every header a kernel may include, in a stable order."""
    return sorted(kernel_dir.rglob("*.cuh"))


def source_digest(source_path: Path, options: tuple[str, ...], arch: int, expressions: tuple[str, ...],
                  kernel_dir: Path = KERNEL_DIR) -> str:
    """The cache key of one compilation (hex sha256)."""
    h = hashlib.sha256()
    h.update(f"format={CACHE_FORMAT};arch={arch};nvrtc={nvrtc_version()}".encode())
    h.update(("\0".join(options) + "\1" + "\0".join(expressions)).encode())
    for path in [source_path, *_headers(kernel_dir)]:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_dir() -> Path:
    """~/.cache/openjet/kernels (XDG_CACHE_HOME honoured; OPENJET_KERNEL_CACHE overrides)."""
    override = os.environ.get("OPENJET_KERNEL_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "openjet" / "kernels"


def _get_log(nvrtc, prog) -> str:
    """The program log of the last compilation (warnings or errors)."""
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(nvrtc, err, "nvrtcGetProgramLogSize")
    buf = bytearray(size)  # never b" " * size: for size 1 that is CPython's shared b" ", which NVRTC would overwrite
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    _check(nvrtc, err, "nvrtcGetProgramLog")
    return buf.rstrip(b"\0").decode(errors="replace").strip()


def _get_blob(nvrtc, prog, size_fn, get_fn, what: str) -> bytes:
    """Read one NVRTC output buffer (cubin or PTX)."""
    err, size = size_fn(prog)
    _check(nvrtc, err, f"{what} size")
    buf = bytearray(size)  # a fresh mutable buffer (see _get_log)
    (err,) = get_fn(prog, buf)
    _check(nvrtc, err, what)
    return bytes(buf)


def compile_file(source_path: Path, arch: int, expressions: tuple[str, ...], options: tuple[str, ...] = (),
                 kernel_dir: Path = KERNEL_DIR, ptx: bool = False) -> CompiledKernels:
    """Compile one .cu file for sm_<arch> (cubin) or compute_<arch> (PTX) with NVRTC, uncached.

    Raises KernelCompileError carrying the compiler log.
    """
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source_path.read_bytes(), source_path.name.encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        for expr in expressions:
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            _check(nvrtc, err, f"nvrtcAddNameExpression({expr})")
        target = f"-arch=compute_{arch}" if ptx else f"-arch=sm_{arch}"
        opts = [*BASE_OPTIONS, *options, target, f"-I{kernel_dir}"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _get_log(nvrtc, prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise KernelCompileError(f"{source_path.name} for {target[6:]} did not compile:\n{log}")
        if ptx:
            image = _get_blob(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, "nvrtcGetPTX")
        else:
            image = _get_blob(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, "nvrtcGetCUBIN")
        symbols = {}
        for expr in expressions:
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(nvrtc, err, f"nvrtcGetLoweredName({expr})")
            symbols[expr] = lowered.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompiledKernels(source_path.stem, arch, image, ptx, symbols, log)


def cache_entry(source_path: Path, arch: int, expressions: tuple[str, ...], options: tuple[str, ...] = (),
                kernel_dir: Path = KERNEL_DIR, ptx: bool = False) -> tuple[str, str]:
    """A compilation's cache key and the name (without suffix) of its entries: file, target, the key's first 24
    digits."""
    key = source_digest(source_path, (*options, f"ptx={ptx}"), arch, expressions, kernel_dir)
    return key, f"{source_path.stem}-{'compute' if ptx else 'sm'}{arch}-{key[:24]}"


def compile_cached(source_path: Path, arch: int, expressions: tuple[str, ...], options: tuple[str, ...] = (),
                   kernel_dir: Path = KERNEL_DIR, directory: Path | None = None, ptx: bool = False) -> CompiledKernels:
    """compile_file through the disk cache: a hit costs one hash of the sources and two file reads."""
    directory = directory or cache_dir()
    key, name = cache_entry(source_path, arch, expressions, options, kernel_dir, ptx)
    stem = directory / name
    meta_path, image_path = stem.with_suffix(".json"), stem.with_suffix(".ptx" if ptx else ".cubin")
    if meta_path.exists() and image_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("key") == key:
            return CompiledKernels(source_path.stem, arch, image_path.read_bytes(), ptx, meta["symbols"],
                                   meta.get("log", ""), from_cache=True)
    compiled = compile_file(source_path, arch, expressions, options, kernel_dir, ptx)
    directory.mkdir(parents=True, exist_ok=True)
    _atomic_write(image_path, compiled.image)
    meta = {"key": key, "symbols": compiled.symbols, "log": compiled.log, "nvrtc": list(nvrtc_version())}
    # the metadata goes last: its presence means the image beside it is complete
    _atomic_write(meta_path, json.dumps(meta, indent=1).encode())
    return compiled


def _atomic_write(path: Path, data: bytes) -> None:
    """Write through a temp file and rename, so a concurrent reader never sees half a cubin."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def kernel_options() -> tuple[str, ...]:
    """The per-op kernels' extra options: -D for each item of OPENJET_CUDA_DEFINES."""
    items = [i.strip() for i in os.environ.get(DEFINES_ENV, "").split(",") if i.strip()]
    for item in items:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*(=[A-Za-z0-9_]+)?", item):
            raise ValueError(f"{DEFINES_ENV}: {item!r} is not NAME=value")
    return tuple(f"-D{i}" for i in items)


def file_options(file: str, arch: int, ptx: bool = False) -> tuple[str, ...]:
    """The options a kernel file compiles with for sm_<arch>: OPENJET_CUDA_DEFINES's, and the architecture's
    feature set where the file needs it (instances.ARCH_FEATURE_FILES; not for PTX, which a newer GPU JITs)."""
    from engine.cuda import instances

    return kernel_options() + (() if ptx else instances.arch_options(file, arch))


def _compile_job(job: tuple[str, int, tuple[str, ...], bool, str | None]) -> tuple[str, int, float, bool]:
    """Worker of compile_all: (file, arch, expressions, ptx, cache directory) -> (file, arch, seconds, from_cache)."""
    import time

    file, arch, expressions, ptx, directory = job
    t0 = time.perf_counter()
    out = compile_cached(KERNEL_DIR / f"{file}.cu", arch, expressions, file_options(file, arch, ptx), ptx=ptx,
                         directory=Path(directory) if directory else None)
    return file, arch, time.perf_counter() - t0, out.from_cache


def compile_all(archs: list[int], workers: int | None = None, directory: Path | None = None,
                ptx: bool = False) -> list[tuple[str, int, float, bool]]:
    """Compile every kernel file for every architecture into the cache, in parallel processes (the slowest
    files first). Returns (file, arch, seconds, from_cache) per compilation; raises the first KernelCompileError."""
    from concurrent.futures import ProcessPoolExecutor

    from engine.cuda import instances

    by_file = instances.files()
    # the GEMM and matmul files dominate: start them first so the pool's tail is short
    order = sorted(by_file, key=lambda f: -sum(len(i.expr) for i in by_file[f]) * (4 if f == "gemm" else 1))
    jobs = [(f, a, tuple(i.expr for i in by_file[f]), ptx, str(directory) if directory else None)
            for f in order for a in archs]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        return [_compile_job(j) for j in jobs]
    # spawn, not fork: the caller may hold a CUDA context (the workers only ever touch NVRTC)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_compile_job, jobs))
