"""Where the mid-size matmuls' bandwidth goes (gpu_check part `stream`; bench/NOTES.md "v9").

For each 27B matrix, graph-replayed back to back over weight copies bigger than the L2 (as the matmul timings):
- `cp`: the fast T = 1 mmvq_cp that decode ran before v10;
- `cpa`: the same with the activations staged beside the weights (bench/NOTES.md v10; what decode runs now), and
  CPA_SHAPES' builds of it;
- `loads`: the same kernel compiled with OPENJET_PROBE_LOADS_ONLY: the same grid, copies and stage ring, no
  decoding and no mma (what the access pattern and the launch shape alone cost);
- `decode`: OPENJET_PROBE_DECODE_ONLY (kernels/probe.cuh): the stage reads and every fragment decoded, no mma;
- `mma`: OPENJET_PROBE_MMA_ONLY: the stage reads, the activation loads and the mma chain, no decoding;
- `stream.same`: a contiguous read of the same bytes (bench/kernels/stream_probe.cu) by as many warps;
- `stream.wave`: the same read by one full wave (64 warps on every SM).
If `loads` is as slow as `cp`, the arithmetic is not the limit; if `stream.same` is much faster than `loads`,
the weight layout (16 scattered 128-byte rows per stage) is. The H200 run of 2026-12-01 (commit 61314a6) found
`loads` 1.3-2.2 x faster than `cp` and within 10 % of `stream.same`: the arithmetic is the limit; `decode` and
`mma` then say whether the unpacking or the activation loads and mma chain cost it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.gpu_common import Report, Timing, median_time
from bench.gpu_kernels import timed_matrix
from engine.cuda import instances, nvrtc, ops
from engine.cuda.device import Device, Kernel

PROBE_SOURCE = Path(__file__).resolve().parent / "kernels" / "stream_probe.cu"
MATRICES = [("attn_kv", Q.Q6_K), ("ssm_out", Q.Q4_K), ("attn_q", Q.Q4_K), ("ffn_up", Q.Q4_K),
            ("ffn_down", Q.Q6_K), ("ffn_gate_up", Q.Q4_K), ("output", Q.Q6_K)]
WAVE_WARPS_PER_SM = 64
# the probe builds of mmvq_cp, by label (kernels/mmvq.cu, kernels/probe.cuh)
PROBES = {"loads": "OPENJET_PROBE_LOADS_ONLY", "decode": "OPENJET_PROBE_DECODE_ONLY", "mma": "OPENJET_PROBE_MMA_ONLY",
          "act": "OPENJET_PROBE_ACT_ONLY", "act.hot": "OPENJET_PROBE_ACT_HOT", "mma.noact": "OPENJET_PROBE_MMA_NOACT", "mma.split": "OPENJET_PROBE_MMA_SPLIT"}


def _load(dev: Device, source: Path, expr: str, name: str, options: tuple[str, ...] = ()) -> Kernel:
    """Compile one kernel expression (not through the cache: a probe build) and load it."""
    compiled = nvrtc.compile_file(source, dev.info.arch, (expr,), options=options)
    return dev.load_kernels(compiled.image, {name: compiled.symbols[expr]}, name)[name]


def _probe_builds(dev: Device, qtype: Q) -> dict[str, Kernel]:
    """The probe builds of this type's mmvq_cp, by label, allowed the real kernel's shared memory."""
    tag = instances.qtype_tag(qtype)
    expr = instances.INSTANCES[f"mmvq_{tag}_cp"].expr
    stages, stage_bytes = ops.STAGE_SHAPE[qtype]
    builds = {}
    for label, define in PROBES.items():
        builds[label] = _load(dev, nvrtc.KERNEL_DIR / "mmvq.cu", expr, f"mmvq_{tag}_cp.{label}", (f"-D{define}",))
        dev.set_max_dynamic_smem(builds[label], ops.MMVQ_WARPS * stages * stage_bytes)
    return builds


def run_stream_probe(dev: Device, report: Report, rng: np.random.Generator) -> None:
    print("stream probe: mmvq builds vs their loads only vs a contiguous read (us, TB/s)", flush=True)
    stream = _load(dev, PROBE_SOURCE, "stream_read", "stream_read")
    builds = {qtype: _probe_builds(dev, qtype) for qtype in {q for _, q in MATRICES}}  # one module per type
    saved = ops.pipeline_state()
    try:
        for name, qtype in MATRICES:
            _probe_matrix(dev, report, rng, stream, builds[qtype], name, qtype)
        print("staged activations by token count, precise (us): cp | cpa (one tile a block) | cpa2 (two)", flush=True)
        for name, qtype in STAGED_TIMED:
            _time_staged(dev, report, rng, name, qtype)
        time_staged_l1(dev, report, rng)
    finally:
        ops.set_pipelined(*saved)


def _probe_matrix(dev: Device, report: Report, rng: np.random.Generator, stream: Kernel, probes: dict[str, Kernel],
                  name: str, qtype: Q) -> None:
    m = timed_matrix(dev, rng, name, qtype, precise=False)
    rows, cols, nbytes, ws, act, y, copies = m.rows, m.cols, m.nbytes, m.ws, m.act, m.y, len(m.ws)
    tiles = (rows + 15) // 16
    warps = ops._pipelined_warps(cols, tiles, dev.info.multiprocessors)
    stages, stage_bytes = ops.STAGE_SHAPE[qtype]
    smem = warps * stages * stage_bytes
    words = nbytes // 16
    wave = WAVE_WARPS_PER_SM * dev.info.multiprocessors
    out = dev.alloc(4 * max(wave, tiles * warps), "probe.out")
    ops.set_pipelined(frozenset({qtype}), True, "cp")
    group = act.group(0)
    x, s, _, s_lo = group
    state = {"i": 0}

    def rotate():
        state["i"] += 1
        return ws[state["i"] % copies]

    def read(total_warps: int):
        per_warp = -(-words // total_warps)
        return lambda: dev.launch(stream, -(-total_warps // 8), 256, [rotate().buf, out, ctypes.c_int64(words),
                                                                       ctypes.c_int64(per_warp)])

    def probe(kernel: Kernel):
        return lambda: dev.launch(kernel, tiles, 32 * warps, [rotate().buf, x, s, None, s_lo, y, None, None, rows,
                                                              cols, 1, rows], smem=smem)

    def staged(tiles_a_block: int):
        return lambda: ops._mmvq_pipelined(dev, rotate(), group, y, None, None, 1, rows, False, tiles_a_block)

    variants = {"cp": lambda: ops.matmul(dev, rotate(), act, y, 1, rows), "cpa": staged(1), "cpa2": staged(2),
                **{label: probe(kernel) for label, kernel in probes.items()},
                "stream.same": read(tiles * warps), "stream.wave": read(wave)}
    cells = []
    for label, fn in variants.items():
        med, spread = median_time(dev, fn, reps=20, warmup=3, inner=copies * 2)
        timing = Timing("stream", f"{name}.{qtype.name}.{label}", f"{rows}x{cols}", med, spread, nbytes,
                        {"warps": tiles * warps if label != "stream.wave" else wave})
        report.timings.append(timing)
        cells.append(f"{label} {med * 1e3:6.1f} {timing.gbps / 1e3:4.2f}")
    print(f"  {name:<11} {qtype.name:<5} {nbytes / 1e6:7.1f} MB  {tiles * warps:5d} warps  " + " | ".join(cells),
          flush=True)
    m.free(dev)
    dev.memory.free(out)


STAGED_TIMED = [("attn_q", Q.Q4_K), ("ffn_gate_up", Q.Q4_K), ("ffn_down", Q.Q6_K)]


def _time_staged(dev: Device, report: Report, rng: np.random.Generator, name: str, qtype: Q) -> None:
    """One matrix, precise mode, 1-4 tokens: mmvq_cp against the staged activations with one and two row tiles
    a block (v10 lost at 2-3 tokens with one)."""
    m = timed_matrix(dev, rng, name, qtype, precise=True)
    for t in (1, 2, 3, 4):
        cells = []
        for kernel in ("cp", "cpa", "cpa2"):
            ops.set_pipelined(frozenset({qtype}), True, kernel)
            timing = m.record(dev, report, t, "stream", f"{name}.{qtype.name}.T{t}.precise.{kernel}")
            cells.append(f"{kernel} {timing.median_ms * 1e3:6.1f}")
        print(f"  {name:<11} {qtype.name:<5} T={t}  " + " | ".join(cells), flush=True)
    m.free(dev)


def time_staged_l1(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """mmvq_cpa / cpa2 with their activation copies through L2 only (cp.async.cg, the build in use) against the
    OPENJET_STAGE_ACT_L1 build (cp.async.ca: allocated in L1 too, so the SM's next block may hit), 1-4 tokens,
    both modes. The L1 builds replace the instances in the device's kernel table for their turn."""
    print("staged activation copies, L2 only | L1 too (us)", flush=True)
    names = [n for n in instances.INSTANCES if "_cpa" in n]
    builds = {}
    for n in names:
        builds[n] = _load(dev, nvrtc.KERNEL_DIR / "mmvq.cu", instances.INSTANCES[n].expr, n + ".l1",
                          ("-DOPENJET_STAGE_ACT_L1",))
    originals = {n: dev.kernel(n) for n in names}
    saved = ops.pipeline_state()
    try:
        for name, qtype in STAGED_TIMED:
            for precise in (False, True):
                m = timed_matrix(dev, rng, name, qtype, precise=precise)
                for kernel in ("cpa", "cpa2"):
                    ops.set_pipelined(frozenset({qtype}), True, kernel)
                    cells = []
                    for t in (1, 2, 3, 4):
                        pair = []
                        for l1 in (False, True):
                            if l1:
                                dev._kernels.update(builds)
                            mode = "precise" if precise else "fast"
                            try:
                                timing = m.record(dev, report, t, "stream", f"{name}.{qtype.name}.T{t}.{mode}.{kernel}"
                                                  f"{'.l1' if l1 else ''}")
                            finally:
                                dev._kernels.update(originals)
                            pair.append(f"{timing.median_ms * 1e3:5.1f}")
                        cells.append(f"T{t} {' | '.join(pair)}")
                    print(f"  {name:<11} {qtype.name:<5} {'precise' if precise else 'fast':<7} {kernel:<4} "
                          + "   ".join(cells), flush=True)
                m.free(dev)
    finally:
        ops.set_pipelined(*saved)
