"""NVRTC compilation of megakernel.cu: its own headers (this folder) and the shared ones of engine/cuda/kernels
(SHARED_HEADERS), cached on disk like every kernel (engine/cuda/nvrtc.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from engine.cuda import nvrtc

MEGAKERNEL_DIR = Path(__file__).resolve().parent
SOURCE = MEGAKERNEL_DIR / "megakernel.cu"
ENTRY = "megakernel"
SHARED_HEADERS = ("common.cuh", "quants.cuh", "kquants.cuh", "stage.cuh", "act8.cuh", "mmvq.cuh", "i8q4k.cuh",
                  "i8q6k.cuh")


def shared_digest() -> str:
    """Hash of the shared headers the megakernel includes: part of the options, so it is part of the cache key."""
    h = hashlib.sha256()
    for name in SHARED_HEADERS:
        h.update(name.encode() + b"\0" + (nvrtc.KERNEL_DIR / name).read_bytes())
    return h.hexdigest()[:16]


def options(debug: bool = False) -> tuple[str, ...]:
    """NVRTC options: the shared kernels folder on the include path, its hash, and MK_DEBUG when asked."""
    # -default-device: the generic lambdas handed to dn_dispatch carry no annotation; NVRTC 13.0 takes them for host
    # code (13.5 does not), and every function in this source is device code anyway.
    out = ("-default-device", f"-I{nvrtc.KERNEL_DIR}", f"-DMK_SHARED_HEADERS=0x{shared_digest()}")
    if os.environ.get("OPENJET_MK_LINEINFO") == "1":  # source lines for a profiler (Nsight Compute)
        out += ("-lineinfo",)
    return out + (("-DMK_DEBUG",) if debug else ())


def compile_megakernel(arch: int, extra: tuple[str, ...] = (), directory: Path | None = None, ptx: bool = False,
                       debug: bool = False) -> nvrtc.CompiledKernels:
    """The megakernel for sm_<arch> (or PTX for compute_<arch>) through the disk cache, with extra options (e.g.
    model_options(spec)); KernelCompileError carries NVRTC's log."""
    return nvrtc.compile_cached(SOURCE, arch, (ENTRY,), options(debug) + tuple(extra), kernel_dir=MEGAKERNEL_DIR,
                                directory=directory, ptx=ptx)


# The largest dynamic shared memory a block may opt in to, per architecture (less 1 KB for static shared memory).
SMEM_LIMITS = {80: 162 * 1024, 86: 98 * 1024, 89: 98 * 1024, 90: 226 * 1024, 100: 226 * 1024, 120: 98 * 1024}


def smem_bytes(arch: int) -> int:
    """Dynamic shared memory the megakernel takes on sm_<arch>: 140 KB on sm_90, where a matmul batch can take 8
    tiles (matvec.cuh MV_BATCH), every warp still has a ring of 4 Q4_K stages, and the 2-5-row int8 matmuls hold
    the levels of a 5,120-wide act in one batch with 2 stages a warp beside them (mv_int8.cuh MK_ACT8_ROWS_SB); 96
    KB (which every GPU from sm_80 on allows) elsewhere. Not more: shared memory and L1 share one 256 KB array, and
    the kernel's spills and the norms' weights live in L1. Measured (bench/MEGAKERNEL.md), d = 0 cycle on the H200:
    96 KB 23.8 ms, 132 KB 22.4, 224 KB 29.1 (round 2's matmul); 200 KB with 8-stage rings 26.3 against 19.3 at 132
    KB (round 3); on the H100 (round 12), d = 0 / d = 4: 132 KB (10 superblocks a batch) 12.34 / 18.72 ms, 140 KB
    12.37 / 17.79, 148 12.45 / 17.79, 164 (3 stages) 12.65 / 18.03. OPENJET_MK_SMEM_KB overrides it, up to the
    architecture's limit (a benchmark knob)."""
    want = os.environ.get("OPENJET_MK_SMEM_KB")
    if want is None:
        return 140 * 1024 if arch == 90 else 96 * 1024
    return min(int(want) * 1024, SMEM_LIMITS.get(arch, 96 * 1024))


def arch_options(arch: int) -> tuple[str, ...]:
    """The defines that depend on the GPU the kernel will run on."""
    return (f"-DMK_SMEM_BYTES={smem_bytes(arch)}",)


def threads(options: tuple[str, ...]) -> int:
    """Threads of the block the options compile (opcodes.cuh MK_THREADS): the controller and loader warps (with
    MK_CONTROLLER=1) and MK_CONSUMER_WARPS consumer warps, 8 unless a define says otherwise."""
    warps, roles = 8, 0
    for opt in options:
        if opt.startswith("-DMK_CONSUMER_WARPS="):
            warps = int(opt.split("=", 1)[1])
        if opt.startswith("-DMK_CONTROLLER="):
            roles = 2 if int(opt.split("=", 1)[1]) else 0
    return (roles + warps) * 32


def tuning_defines() -> tuple[str, ...]:
    """Defines from OPENJET_MK_DEFINES ("MK_PREFETCH_AHEAD=0,NAME=VALUE"): the tuning knobs a benchmark sweeps."""
    items = [i.strip() for i in os.environ.get("OPENJET_MK_DEFINES", "").split(",") if i.strip()]
    for item in items:
        name = item.split("=", 1)[0]
        if not name.startswith("MK_") or not name.replace("_", "").isalnum():
            raise ValueError(f"OPENJET_MK_DEFINES: {item!r} is not MK_NAME=value")
    return tuple(f"-D{i}" for i in items)


def tuning_define(name: str) -> str | None:
    """The value OPENJET_MK_DEFINES gives define `name`, or None (for the VM to mirror a variant it changes)."""
    values = dict(d[2:].split("=", 1) if "=" in d else (d[2:], "1") for d in tuning_defines())
    return values.get(name)


def model_options(spec) -> tuple[str, ...]:
    """Defines that compile only what this model needs (its weight types and DeltaNet head sizes), plus any tuning
    defines asked for."""
    from engine.cuda.megakernel.upload import qtype_mask

    cfg = spec.cfg
    out = (f"-DMK_QT_MASK={qtype_mask(spec)}",) + tuning_defines()
    if "deltanet" in cfg.layer_kinds:
        out += (f"-DMK_DN_DK={cfg.ssm_head_dim}", f"-DMK_DN_DV={cfg.ssm_v_head_dim}")
    return out
