"""Compile a GPU call's kernels here, into a kernel cache the call carries (device time is the scarce resource).

A call starts on a bare machine: every part compiles what it runs (NVRTC, ~40 s of one CPU a megakernel build,
the per-op kernels on top), one to two of a call's ~5 minutes. The cache key (engine/cuda/nvrtc.py source_digest)
holds the source and headers, the options, the architecture and NVRTC's major.minor: built here with the GPU
machine's NVRTC version from the same commit, the entries are the ones the call would make, and a part that finds
its entry loads it instead (a miss costs nothing but the compile the call would have done anyway).

  python bench/precompile.py --nvrtc DIR [--variants "name:MK_A=1;..."] [--cuda-defines A=1]

DIR holds the GPU machine's libnvrtc.so.13 and libnvrtc-builtins.so.13.0 (`pip install --target T
"nvidia-cuda-nvrtc==13.0.*"`: T/nvidia/cu13/lib). Compiled: the per-op kernels (each OPENJET_CUDA_DEFINES set
asked for, and none), the latency probe's two builds, and the megakernel for the tiny qwen35 of the diff / tiny parts and for the 27B shape (its
types from the generator's plan, costs.spec_from_config: no 16 GB file here), at the defaults and at each variant
of --variants, under OPENJET_MK_DEFINES as set (run it once per setting the call uses: the folder accumulates).
The call carries the archive and starts with `tar -xJf .kcache.tar.xz && export OPENJET_KERNEL_CACHE=$PWD/.kcache`
(bench/MEGAKERNEL.md Status).
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import sys
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NVRTC_LIBS = ("libnvrtc-builtins.so.13.0", "libnvrtc.so.13")  # builtins first: libnvrtc opens it by name


def load_nvrtc(directory: str | None) -> None:
    """Make cuda.bindings use the NVRTC in `directory` (this process: call before anything compiles)."""
    if directory:
        for name in NVRTC_LIBS:
            ctypes.CDLL(str(Path(directory) / name), mode=ctypes.RTLD_GLOBAL)


def megakernel_specs() -> dict:
    """The specs the megakernel parts build for: the tiny qwen35 of the diff and tiny parts (gpu_megakernel
    tiny_path) and the 27B shape, as the generator writes them (the options depend on the types and head sizes)."""
    from engine.cuda.megakernel.costs import spec_from_config
    from engine.gguf.testmodel import PRESETS, tiny_config

    return {"tiny": spec_from_config(tiny_config("qwen35", vocab_size=512)),
            "27b": spec_from_config(PRESETS["qwen3.8-27b"]())}


def _megakernel_job(job: tuple) -> tuple[str, float]:
    nvrtc_dir, cache, env, arch, extra, tag = job
    load_nvrtc(nvrtc_dir)
    os.environ.update(env | {"OPENJET_KERNEL_CACHE": cache})
    from engine.cuda.megakernel import build

    t0 = time.perf_counter()
    build.compile_megakernel(arch, extra)
    return tag, time.perf_counter() - t0


def _per_op_job(job: tuple) -> tuple[str, float]:
    nvrtc_dir, cache, env, arch, file = job
    load_nvrtc(nvrtc_dir)
    os.environ.update(env | {"OPENJET_KERNEL_CACHE": cache})
    from engine.cuda import instances, nvrtc

    t0 = time.perf_counter()
    exprs = tuple(i.expr for i in instances.files()[file])
    nvrtc.compile_cached(nvrtc.KERNEL_DIR / f"{file}.cu", arch, exprs, nvrtc.kernel_options())
    return f"{file} {env.get('OPENJET_CUDA_DEFINES', '')}".strip(), time.perf_counter() - t0


def _latency_job(job: tuple) -> tuple[str, float]:
    nvrtc_dir, cache, arch, sync = job
    load_nvrtc(nvrtc_dir)
    os.environ["OPENJET_KERNEL_CACHE"] = cache
    from bench.gpu_latency import compile_probe

    t0 = time.perf_counter()
    compile_probe(arch, sync)
    return f"latency probe sync={sync}", time.perf_counter() - t0


def jobs(args, specs: dict) -> list[tuple]:
    """Every compilation, as (function, job) pairs: the megakernel builds first (the longest)."""
    from bench.gpu_megakernel import environment, parse_variants, variant_environment
    from engine.cuda import instances
    from engine.cuda.megakernel import build

    cache, out = str(Path(args.out).resolve()), []
    base = os.environ.get("OPENJET_MK_DEFINES", "")
    for name, defines in [("default", "")] + parse_variants(args.variants):
        env = variant_environment(defines, base) if defines else {"OPENJET_MK_DEFINES": base}
        with environment(env):  # the options as the variant's parts compute them
            for model, spec in specs.items():
                extra = build.model_options(spec) + build.arch_options(args.arch)
                out.append((_megakernel_job, (args.nvrtc, cache, env, args.arch, extra, f"megakernel {model} {name}")))
    out += [(_latency_job, (args.nvrtc, cache, args.arch, sync)) for sync in (0, 1)]
    for defines in ["", *args.cuda_defines]:
        env = {"OPENJET_CUDA_DEFINES": defines}
        out += [(_per_op_job, (args.nvrtc, cache, env, args.arch, file)) for file in instances.files()]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvrtc", required=True, help="folder of the GPU machine's libnvrtc (13.0)")
    parser.add_argument("--out", default=".kcache", help="the cache folder (more runs add to it)")
    parser.add_argument("--archive", default=".kcache.tar.xz", help="the folder packed for the call to carry "
                        "(cubins shrink ~7 x; '' for none)")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--variants", default="", help="gpu_megakernel's --variants, each compiled too")
    parser.add_argument("--cuda-defines", action="append", default=[],
                        help="an OPENJET_CUDA_DEFINES value the per-op kernels are compiled with too (repeatable)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    load_nvrtc(args.nvrtc)
    from engine.cuda import nvrtc

    print(f"NVRTC {'.'.join(map(str, nvrtc.nvrtc_version()))} -> {args.out}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    todo = jobs(args, megakernel_specs())
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for future in [pool.submit(fn, job) for fn, job in todo]:
            tag, seconds = future.result()
            print(f"  {tag}: {seconds:.1f} s", flush=True)
    print(f"{len(todo)} compilations in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.archive:
        with tarfile.open(args.archive, "w:xz") as tar:
            tar.add(args.out, arcname=Path(args.out).name)
        print(f"{args.archive}: {Path(args.archive).stat().st_size / 1e6:.1f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
