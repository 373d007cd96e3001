"""The megakernel's VM against the numpy reference at every width of the Qwen3.8-27B file, on the CPU (issue 5).

  python bench/mk_wide_vm.py --work /tmp/mk27 --tokens 16

The tiny model the VM is tested on (tests/kernels/test_megakernel_vm.py) has one 256-wide superblock per row, 2 query
heads per KV head, 64-wide heads and 512 tokens; the 27B file has 5120 / 6144 / 17408-wide rows, 6 query heads per KV
head of 256 (rope on 64), DeltaNet heads of 128 with 3 value heads per key head, 248,320 tokens and 388 lm_head
partials. bench/mk_trace.py's wide_config keeps every one of those widths with 4 layers (3 DeltaNet + 1 attention)
and the MTP block, so the VM, scheduled for 132 SMs as on the H200, can run beside the reference: if their greedy
tokens and logits agree, the VM is a valid oracle for the GPU diff at those widths (gpu_megakernel.py diff27).
The two run one after the other (each holds ~12 GB of float32 weights).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.mk_trace import compare_runs, describe, trace_host, trace_megakernel, wide_path  # noqa: E402

PROMPT = [11, 201, 35, 90, 400, 17]  # bench/gpu_megakernel.py's


def run(work: Path, num_tokens: int) -> dict:
    """Reference, then VM; their traces compared."""
    from engine.cuda.megakernel.backend import MegakernelBackend
    from engine.cuda.megakernel.schedule import ScheduleConfig
    from engine.reference.backend import ReferenceBackend

    path = wide_path(work / "qwen38-27b-widths-4layers.gguf")
    t0 = time.perf_counter()
    ref = trace_host(ReferenceBackend.from_gguf(path, context_size=512), "reference", PROMPT, num_tokens)
    t_ref = time.perf_counter() - t0
    gc.collect()
    vm = MegakernelBackend.on_vm(path, context_size=512, config=ScheduleConfig(num_sms=132), order="program")
    mk = trace_megakernel(vm, "vm", PROMPT, num_tokens)
    report = compare_runs(mk, ref)
    worst = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(mk.logits, ref.logits))
    return {"model": str(path), "prompt": PROMPT, "tokens": {"reference": ref.tokens, "vm": mk.tokens},
            "compare": report, "max_rel_dlogit": worst, "launches": dict(vm.launches),
            "seconds": {"reference": round(t_ref), "vm": round(time.perf_counter() - t0 - t_ref)}}


def main(argv: list[str] | None = None) -> int:
    """Run, print the comparison, write the JSON; exit 1 when the VM's tokens differ from the reference's."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/mk27"), help="where the 4-layer file is written")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" /
                        f"mk-wide-vm-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args(argv)
    result = run(args.work, args.tokens)
    args.out.write_text(json.dumps(result, indent=1))
    print(describe(result["compare"]), f"; max relative |dlogit| {result['max_rel_dlogit']:.2e}")
    return 0 if result["compare"]["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
