"""Compile a GPU call's kernels here, into a kernel cache the call carries (device time is the scarce resource).

A call starts on a bare machine: every part compiles what it runs (NVRTC, ~40 s of one CPU a megakernel build,
the per-op kernels on top), one to two of a call's ~5 minutes. The cache key (engine/cuda/nvrtc.py source_digest)
holds the source and headers, the options, the architecture and NVRTC's major.minor: built here with the GPU
machine's NVRTC version from the same commit, the entries are the ones the call would make, and a part that finds
its entry loads it instead (a miss costs nothing but the compile the call would have done anyway).

  python bench/precompile.py --nvrtc DIR [--variants "name:MK_A=1;..."] [--cuda-defines A=1]

DIR holds the GPU machine's libnvrtc.so.13 and libnvrtc-builtins.so.13.0 (`pip install --target T
"nvidia-cuda-nvrtc==13.0.*"`: T/nvidia/cu13/lib). Compiled: the per-op kernels (each OPENJET_CUDA_DEFINES set
asked for, and none; gemm_wg for sm_90a), the latency probe's two builds, and the megakernel for the tiny
qwen35 of the diff / tiny parts and for the 27B shape (its types from the generator's plan,
costs.spec_from_config: no 16 GB file here) under OPENJET_MK_DEFINES as set (run it once per setting the call
uses: the megakernel's entries accumulate), and the 27B's at each variant of --variants (cycle27b's). Per-op
entries of any other source or define set are removed before packing (every header edit makes new ones).
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
            path = Path(directory) / name
            if not path.exists():
                raise SystemExit(f"--nvrtc {directory}: no {name} there (the folder of the NVRTC wheel's libraries)")
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def megakernel_specs() -> dict:
    """The specs the megakernel parts build for: the tiny qwen35 of the diff and tiny parts (gpu_megakernel
    tiny_path) and the 27B shape, as the generator writes them (the options depend on the types and head sizes)."""
    from engine.cuda.megakernel.costs import spec_from_config
    from engine.gguf.testmodel import PRESETS, tiny_config

    return {"tiny": spec_from_config(tiny_config("qwen35", vocab_size=512)),
            "27b": spec_from_config(PRESETS["qwen3.8-27b"]())}


def compile_job(job: tuple) -> float:
    """One compilation into the cache, in a worker process: (label, nvrtc folder, cache, environment, kind, arch,
    what) with kind "megakernel" (what: its options), "per-op" (what: a kernel file) or "latency" (what: sync)."""
    _, nvrtc_dir, cache, env, kind, arch, what = job
    load_nvrtc(nvrtc_dir)
    os.environ.update(env | {"OPENJET_KERNEL_CACHE": cache})
    from bench.gpu_latency import compile_probe
    from engine.cuda import instances, nvrtc
    from engine.cuda.megakernel import build

    t0 = time.perf_counter()
    if kind == "megakernel":
        build.compile_megakernel(arch, what)
    elif kind == "latency":
        compile_probe(arch, what)
    else:
        exprs = tuple(i.expr for i in instances.files()[what])
        nvrtc.compile_cached(nvrtc.KERNEL_DIR / f"{what}.cu", arch, exprs, nvrtc.file_options(what, arch))
    return time.perf_counter() - t0


def jobs(args, specs: dict) -> list[tuple]:
    """Every compilation (compile_job's tuples), the megakernel builds first (the longest)."""
    from bench.gpu_megakernel import environment, parse_variants, variant_environment
    from engine.cuda import instances
    from engine.cuda.megakernel import build

    common = (args.nvrtc, str(Path(args.out).resolve()))
    out = []
    base = os.environ.get("OPENJET_MK_DEFINES", "")
    for name, defines in [("default", "")] + parse_variants(args.variants):
        env = variant_environment(defines, base) if defines else {"OPENJET_MK_DEFINES": base}
        with environment(env):  # the options as the variant's parts compute them
            for model, spec in specs.items():
                if defines and model != "27b":  # variants are cycle27b's; diff / tiny run OPENJET_MK_DEFINES's
                    continue
                extra = build.model_options(spec) + build.arch_options(args.arch)
                out.append((f"megakernel {model} {name}", *common, env, "megakernel", args.arch, extra))
    out += [(f"latency probe sync={sync}", *common, {}, "latency", args.arch, sync) for sync in (0, 1)]
    for defines in ["", *args.cuda_defines]:
        env = {"OPENJET_CUDA_DEFINES": defines}
        out += [(f"{file} {defines}".strip(), *common, env, "per-op", args.arch, file) for file in instances.files()]
    return out


def per_op_stems(arch: int, cuda_defines: list[str]) -> set[str]:
    """The cache entries' names (without suffix) of every per-op file at each OPENJET_CUDA_DEFINES set ("" and
    cuda_defines), as nvrtc.compile_cached names them for the NVRTC loaded now."""
    from bench.gpu_megakernel import environment
    from engine.cuda import instances, nvrtc

    stems = set()
    for defines in ["", *cuda_defines]:
        with environment({"OPENJET_CUDA_DEFINES": defines}):
            for file, insts in instances.files().items():
                _, stem = nvrtc.cache_entry(nvrtc.KERNEL_DIR / f"{file}.cu", arch, tuple(i.expr for i in insts),
                                            nvrtc.file_options(file, arch))
                stems.add(stem)
    return stems


def prune_per_op(out: Path, keep: set[str], arch: int) -> list[Path]:
    """Remove the per-op entries in `out` that are not in `keep` (an earlier source's, or another define set's):
    every header edit gives each per-op file a new key, and the call carries the folder (64 MiB in all). The
    megakernel's and the latency probe's entries stay (variants accumulate across runs)."""
    from engine.cuda import instances

    prefixes = tuple(f"{file}-sm{arch}-" for file in instances.files())
    stale = [p for p in sorted(out.iterdir())
             if p.name.startswith(prefixes) and p.name.split(".")[0] not in keep]
    for p in stale:
        p.unlink()
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvrtc", required=True, help="folder of the GPU machine's libnvrtc (13.0)")
    parser.add_argument("--out", default=".kcache", help="the cache folder (more runs add to it)")
    parser.add_argument("--archive", default=".kcache.tar.xz", help="the folder packed for the call to carry "
                        "(cubins shrink ~7 x; '' for none)")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--variants", default="", help="gpu_megakernel's --variants, each compiled too")
    parser.add_argument("--cuda-defines", action="append", default=[],
                        help="an OPENJET_CUDA_DEFINES value the per-op kernels are compiled with too (repeatable; "
                        "per-op entries of any other set are removed, so give every set the call uses)")
    parser.add_argument("--expect-nvrtc", default="13.0", help="the GPU machine's NVRTC (its results' info.nvrtc)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    load_nvrtc(args.nvrtc)
    from engine.cuda import nvrtc

    version = ".".join(map(str, nvrtc.nvrtc_version()))
    if version != args.expect_nvrtc:  # the key holds the version: these entries would never be found there
        print(f"NVRTC {version} here, the GPU machine's is {args.expect_nvrtc}: --nvrtc names the wrong folder")
        return 2
    print(f"NVRTC {version} -> {args.out}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    todo = jobs(args, megakernel_specs())
    t0, failed = time.perf_counter(), []
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for job, future in [(job, pool.submit(compile_job, job)) for job in todo]:
            try:
                print(f"  {job[0]}: {future.result():.1f} s", flush=True)
            except Exception as exc:  # a build that fails here fails there too: say which, build the others
                failed.append(job[0])
                print(f"  {job[0]}: FAILED {exc}", flush=True)
    print(f"{len(todo)} compilations in {time.perf_counter() - t0:.0f} s" +
          (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    if failed:
        return 1
    stale = prune_per_op(Path(args.out), per_op_stems(args.arch, args.cuda_defines), args.arch)
    print(f"{len(stale)} stale per-op files removed (an earlier source's or define set's)", flush=True)
    if args.archive:
        with tarfile.open(args.archive, "w:xz") as tar:
            tar.add(args.out, arcname=Path(args.out).name)
        print(f"{args.archive}: {Path(args.archive).stat().st_size / 1e6:.1f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
