"""What the megakernel's fixed cost per instruction is made of (bench/gpu_megakernel.py part `latency`).

A d = 0 cycle spends ~8 of its 12.7 ms outside the weights' streaming, in steps of a few microseconds each
(bench/MEGAKERNEL.md "Where the skeleton's time may go"): dependent L2 round trips, fences, the counters' signal
and wait, and code run once a layer. bench/kernels/latency_probe.cu measures each of them on one SM, with the
other SMs idle and with them streaming DRAM; it is built twice, with the megakernel's counter protocol as it is
(mk_common.cuh) and with MK_SYNC_ACQREL=1. The figures, in ns at the SM clock measured in the same launch:

  l2 / dram / l1   one dependent load of a chain over 2 MB (L2) / 1 GB (DRAM) / 8 KB through L1
  solo_gb_s        one SM's stream of 8 MB (256 threads, 64 KB in flight), alone or beside the loaders
  fence            the build's fence_release() alone / after 16 KB of the block's stores and a barrier
  sc               __threadfence() likewise
  ping             one round trip: block 0 signals block 1 and waits for its answer, each side's signal after the
                   block's stores and a barrier (an instruction's end): two steps' synchronisation
  code_dram        per KB of 128 KB of straight-line code, its first run (from DRAM: L2 was flushed)
  code_warm        per KB of a 16 KB body run right after itself (the instruction cache)
  code_after_<n>k  per KB of the same body after n KB of other code ran (the caches between L2 and the SM, then
                   L2, unless the loaders pushed it out)
Loaded runs: `load` streams at normal L2 priority, `load_ef` (default build only) evict-first, as the megakernel's
rings do (its code and tables then stay in L2).
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np

from bench.gpu_common import Report

SOURCE = Path(__file__).resolve().parent / "kernels" / "latency_probe.cu"
# latency_probe.cu's enum Slot, in order (tests/bench/test_gpu_latency.py checks)
SLOTS = ("ns0", "ns1", "clk0", "clk1", "l2", "dram", "l1", "solo", "fence_idle", "fence_stores", "sc_idle", "sc_stores",
         "ping", "code_dram",
         "code_warm", *(f"code_after{i}" for i in range(5)), "load_ns", "load_bytes", "sink", "error")
CODE_KB, BODY_KB = 128, 16  # latency_probe.cu CODE_BLOCKS_ALL and BODY_BLOCKS, 4 KB each
OTHER_KB = (16, 32, 64, 128, 256)  # latency_probe.cu OTHER_BLOCKS
CHASE_STEPS, PING_ROUNDS, SOLO_BYTES = 256, 64, 8 << 20  # latency_probe.cu's #defines
# (bytes, bytes between nodes). The DRAM ring's nodes each in a line of their own, 8 M lines (1 GB) against the
# L2's ~0.5 M: at 4,096 bytes apart over 256 MB its 65,536 nodes were 2 MB of sectors, which stayed in L2 after
# the ring's own writes, and the walk measured L2 (345 ns, round 11)
L2_RING, DRAM_RING, L1_RING = (2 << 20, 256), (1 << 30, 128), (8 << 10, 128)
STREAM_BYTES, FLUSH_BYTES = 2 << 30, 256 << 20  # what the loaders read; what evicts L2 before a launch
WORDS = 4096  # the probe's control words (latency_probe.cu Probe::words)


class ProbeArgs(ctypes.Structure):
    """latency_probe.cu's struct Probe."""

    _fields_ = [("words", ctypes.c_uint64), ("l2_ring", ctypes.c_uint64), ("dram_ring", ctypes.c_uint64),
                ("l1_ring", ctypes.c_uint64),
                ("stream", ctypes.c_uint64), ("stream_words", ctypes.c_int64), ("scratch", ctypes.c_uint64),
                ("out", ctypes.c_uint64), ("y", ctypes.c_float), ("z", ctypes.c_float), ("load", ctypes.c_int32)]


def summarize(raw: dict[str, int]) -> dict[str, float]:
    """One launch's slots as per-event figures in ns (at the clock the launch measured)."""
    per_ns = (raw["clk1"] - raw["clk0"]) / max(raw["ns1"] - raw["ns0"], 1)  # SM cycles per ns
    ns = lambda cycles, n=1: round(cycles / n / per_ns, 1)  # noqa: E731
    out = {"clock_ghz": round(per_ns, 3), "l2": ns(raw["l2"], CHASE_STEPS), "dram": ns(raw["dram"], CHASE_STEPS),
           "l1": ns(raw["l1"], CHASE_STEPS), "solo_gb_s": round(SOLO_BYTES * per_ns / max(raw["solo"], 1), 1),
           "fence_idle": ns(raw["fence_idle"]), "fence_stores": ns(raw["fence_stores"]),
           "sc_idle": ns(raw["sc_idle"]), "sc_stores": ns(raw["sc_stores"]), "ping": ns(raw["ping"], PING_ROUNDS)}
    out["code_dram"] = ns(raw["code_dram"], CODE_KB)
    out["code_warm"] = ns(raw["code_warm"], BODY_KB)
    for i, kb in enumerate(OTHER_KB):
        out[f"code_after_{kb}k"] = ns(raw[f"code_after{i}"], BODY_KB)
    out["load_tb_s"] = round(raw["load_bytes"] / max(raw["load_ns"], 1) / 1e3, 2)
    out["error"] = raw["error"]
    return out


def table(results: dict[str, dict[str, float]]) -> str:
    """The summaries side by side, a row a figure (ns; code per KB)."""
    tags = list(results)
    rows = [k for k in next(iter(results.values())) if k != "error"]
    lines = [f"{'':16}" + "".join(f"{t:>16}" for t in tags)]
    lines += [f"{k:16}" + "".join(f"{results[t][k]:>16}" for t in tags) for k in rows]
    return "\n".join(lines)


def _ring(dev, ring_kernel, buf, nbytes: int, stride: int, rng: np.random.Generator) -> None:
    """A random cycle through the nodes of buf, `stride` bytes apart, starting at node 0."""
    n = nbytes // stride
    order = np.concatenate([[0], 1 + rng.permutation(n - 1)]).astype(np.uint32)
    order_buf = dev.to_device(order, "latency.order")
    dev.launch(ring_kernel, (n + 255) // 256, 256, [buf, order_buf, n, stride // 4])
    dev.synchronize()
    dev.memory.free(order_buf)


def launch_coresident(dev, kernel, blocks: int, args: ProbeArgs, smem: int) -> None:
    """A cooperative launch: every block resident at once or a launch error, never blocks queued behind others.
    The loaded runs of round 11 (a plain launch) read as if block 0's wait for its loaders timed out after 2 s (the
    error set, the ping broken before its clock started, the loaders' 2 s of bytes over block 0's ~1 ms: 17,000
    TB/s), which a cooperative launch rules out."""
    from cuda.bindings import driver as drv

    from engine.cuda.driver import check

    ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(args))
    check(drv.cuLaunchCooperativeKernel(kernel.handle, blocks, 1, 1, 256, 1, 1, smem, dev.stream,
                                        ctypes.addressof(ptrs)), "launch latency_probe")
    dev.synchronize()


def error_line(words: np.ndarray) -> str:
    """The megakernel's error word and its six info words (sm, instruction, wait stage, wait op, counter,
    expected) from the probe's control words (latency_probe.cu: ctl after two stages of counters)."""
    from engine.cuda.megakernel.instructions import NUM_OPCODES
    from engine.cuda.megakernel.layout import Ctl, Err

    ctl = words[2 + 2 * NUM_OPCODES:]
    info = ", ".join(str(int(v)) for v in ctl[Ctl.ERROR_INFO : Ctl.ERROR_INFO + 6])
    return f"{Err(int(ctl[Ctl.ERROR])).name} (sm, instruction, stage, op, counter, expected = {info})"


def compile_probe(arch: int, sync: int):
    """The probe's build with MK_SYNC_ACQREL=sync, through the kernel cache (bench/precompile.py fills it ahead)."""
    from engine.cuda import nvrtc
    from engine.cuda.megakernel import build

    return nvrtc.compile_cached(SOURCE, arch, ("latency_probe", "latency_ring"),
                                build.options() + (f"-DMK_SYNC_ACQREL={sync}",), kernel_dir=build.MEGAKERNEL_DIR)


def run_latency_probe(dev, report: Report, rng: np.random.Generator) -> dict[str, dict[str, float]]:
    """Both builds, idle and loaded; printed and kept as report.info["latency_probe"]."""
    from engine.cuda.megakernel import build

    sms = dev.info.multiprocessors
    smem = build.smem_bytes(dev.info.arch)  # the megakernel's: one block an SM, its L1 left over
    sizes = {"l2": L2_RING[0], "dram": DRAM_RING[0], "l1": L1_RING[0], "stream": STREAM_BYTES, "flush": FLUSH_BYTES,
             "words": 4 * WORDS, "scratch": 2 * 256 * 64, "out": 8 * len(SLOTS)}
    bufs = {name: dev.alloc(nbytes, f"latency.{name}") for name, nbytes in sizes.items()}
    results: dict[str, dict[str, float]] = {}
    try:
        for sync in (0, 1):
            compiled = compile_probe(dev.info.arch, sync)
            # a name per build: Device keeps a kernel's shared-memory opt-in by name (the second build's launch
            # failed with CUDA_ERROR_INVALID_VALUE when both were "latency_probe", 2026-12-05)
            loaded = dev.load_kernels(compiled.image, {f"{n}.sync{sync}": compiled.symbols[n]
                                                       for n in ("latency_probe", "latency_ring")}, "latency_probe")
            k = {n.split(".")[0]: kernel for n, kernel in loaded.items()}
            dev.set_max_dynamic_smem(k["latency_probe"], smem)
            if sync == 0:
                _ring(dev, k["latency_ring"], bufs["l2"], *L2_RING, rng)
                _ring(dev, k["latency_ring"], bufs["dram"], *DRAM_RING, rng)
                _ring(dev, k["latency_ring"], bufs["l1"], *L1_RING, rng)
            for load in ((0, 1, 2) if sync == 0 else (0, 1)) if sms >= 3 else (0,):
                for name in ("words", "out", "flush"):
                    dev.fill_u32(bufs[name], 0)  # the flush's write evicts L2 (rings, code) before each launch
                args = ProbeArgs(bufs["words"].ptr, bufs["l2"].ptr, bufs["dram"].ptr, bufs["l1"].ptr,
                                 bufs["stream"].ptr, STREAM_BYTES // 16, bufs["scratch"].ptr, bufs["out"].ptr,
                                 1.0001, 1e-7, load)
                launch_coresident(dev, k["latency_probe"], sms, args, smem)
                raw = dict(zip(SLOTS, dev.download(bufs["out"], np.uint64, (len(SLOTS),)).tolist()))
                tag = f"{'acqrel' if sync else 'default'}.{('idle', 'load', 'load_ef')[load]}"
                results[tag] = summarize(raw) | {"raw": raw}
                if raw["error"]:  # a wait timed out: the figures after it are missing
                    words = dev.download(bufs["words"], np.int32, (WORDS,))
                    line = f"latency probe {tag}: {error_line(words)}"
                    report.notes.append(line)
                    print(line, flush=True)
    finally:
        for buf in bufs.values():
            dev.memory.free(buf)
    print("latency probe (ns; code: ns per KB)\n" + table({t: {k: v for k, v in r.items() if k != "raw"}
                                                            for t, r in results.items()}), flush=True)
    report.info["latency_probe"] = results
    return results


def source_slots(source: str) -> tuple[str, ...]:
    """The slot names of latency_probe.cu's enum Slot, lower-case without the S_ prefix (NUM_SLOTS dropped)."""
    body = re.search(r"enum Slot \{(.*?)\};", source, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    names = [n.strip() for n in body.split(",") if n.strip()]
    return tuple(n[2:].lower() for n in names if n != "NUM_SLOTS")
