"""One 27B-shape matmul launched over and over, for a hardware profiler to attach to (Nsight Compute on the GPU
machine): the stall reasons, occupancy and DRAM throughput that CUDA-event timings cannot show.

  ncu --kernel-name regex:mmvq --launch-skip 20 --launch-count 1 --section SpeedOfLight \\
      python bench/gpu_profile.py --shape ffn_gate_up --tokens 1
  OPENJET_CUDA_Q6B=1 ncu ... python bench/gpu_profile.py --shape ffn_down --qtype Q6_K --halves  (q6b as a pass runs it)

The launches rotate over weight copies larger than the L2 (bench.gpu_kernels.timed_matrix), as the timings do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402


def set_switch(item: str) -> None:
    """`[module.]NAME=INT`: engine.cuda.<module> (ops when none) gets NAME = INT; a name it lacks is an error (a
    switch that moved to another module must not be set silently on the old one)."""
    import importlib

    target, _, value = item.partition("=")
    module_name, _, name = target.rpartition(".")
    module = importlib.import_module(f"engine.cuda.{module_name or 'ops'}")
    if not hasattr(module, name):
        raise SystemExit(f"--ops {item}: engine.cuda.{module_name or 'ops'} has no switch {name}")
    setattr(module, name, int(value))


def main(argv: list[str] | None = None) -> int:
    """Set up the matrix, run the matmul --reps times, print its median time."""
    from bench.gpu_kernels import SHAPES_27B, timed_matrix
    from engine.cuda import ops
    from engine.cuda.device import Device

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="ffn_gate_up", choices=sorted(SHAPES_27B))
    parser.add_argument("--qtype", default="Q4_K", choices=[q.name for q in ops.MATMUL_QTYPES])
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--fast", action="store_true", help="fast mode (no f16 residue) for the f16 kernels")
    parser.add_argument("--halves", action="store_true",
                        help="the launch in halves (its second half's sums into another output), as a pass runs it "
                             "where ops.splits_in_halves says so: one-token Q6_K ffn_down under OPENJET_CUDA_Q6B=1, "
                             "the verify passes' ffn_down")
    parser.add_argument("--ops", action="append", default=[], metavar="[MODULE.]NAME=INT",
                        help="set a switch of engine/cuda/ops.py (I8_WARPS=4, I8_TILES=2, ...) or of another module "
                             "of engine/cuda (gemm.WG=4) first")
    args = parser.parse_args(argv)
    for item in args.ops:
        set_switch(item)
    with Device() as dev:
        m = timed_matrix(dev, np.random.default_rng(0), args.shape, Q[args.qtype], precise=not args.fast,
                         tokens=max(8, args.tokens))
        ops.act_f16(dev, m.act.f32, m.act, args.tokens, m.act.ld)  # the int8 copy for this many tokens
        y2 = None
        if args.halves:
            if not ops.splits_in_halves(dev, m.ws[0], m.act, args.tokens):
                raise SystemExit(f"--halves: {args.shape} {args.qtype} at {args.tokens} tokens does not go in halves "
                                 "under these switches")
            y2 = dev.alloc(m.y.nbytes, "y2")
        for i in range(args.reps):
            ops.matmul(dev, m.ws[i % len(m.ws)], m.act, m.y, args.tokens, m.rows, y2=y2)
        dev.synchronize()
        med, _ = m.time(dev, args.tokens, y2=y2)
        print(f"{args.shape} {args.qtype} T={args.tokens}{' halves' if y2 else ''}: {med * 1e3:.1f} us, "
              f"{m.nbytes / med / 1e6:.0f} GB/s")
        if y2 is not None:
            dev.memory.free(y2)
        m.free(dev)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
