"""Where a megakernel launch's warps stall, function by function, from Nsight Compute's SASS source page.

The megakernel's device functions (each op's consumer, the matmul instances, the controller and loader loops in the
kernel's own body) are one cubin; the SASS page lists every instruction with its PC-sampling counts but not which
function it belongs to. This splits the listing at each unconditional RET and tells the functions apart by what
they contain (HMMA: a matmul, LDGSTS: cp.async rings or staged keys, DMUL / F2F: the rope's double-precision
angle, BAR: consumer barriers), so the stalls of one launch can be read per function.

    ncu --target-processes all --kernel-name megakernel --launch-skip N --launch-count 1 \\
        --section SourceCounters --export mk -f python bench/gpu_megakernel.py --parts cycle27b ...
    ncu --import mk.ncu-rep --page source --print-source sass --csv | gzip > sass.csv.gz
    python bench/ncu_functions.py sass.csv.gz --top 20
"""

from __future__ import annotations

import argparse
import csv
import gzip
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
SIGNATURE = ("HMMA", "IMMA", "LDGSTS", "MUFU", "DMUL", "F2F", "SHFL", "BAR", "ATOM", "RED")


@dataclass
class Function:
    index: int
    address: str
    instructions: int
    samples: int
    executed: int
    opcodes: Counter
    stalls: dict[str, int]

    def signature(self) -> str:
        return " ".join(f"{op}{self.opcodes[op]}" for op in SIGNATURE if self.opcodes[op])

    def top_stalls(self, n: int = 4) -> list[tuple[str, int]]:
        return sorted(self.stalls.items(), key=lambda kv: -kv[1])[:n]


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """The header and instruction rows of a `--page source --print-source sass --csv` export (gzip or not)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r[:2] == ["Address", "Source"])
    header = rows[start]
    return header, [r for r in rows[start + 1:] if len(r) == len(header)]


def opcode(source: str) -> str:
    """The opcode of a SASS line without its predicate and modifiers: '@!P0 LDG.E.64 R2, ...' -> 'LDG'."""
    return re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0].split(".")[0]


def split_functions(header: list[str], rows: list[list[str]]) -> list[Function]:
    """Consecutive instructions up to and including each unconditional RET, as functions."""
    col = {name: i for i, name in enumerate(header)}
    stall_cols = [h for h in header if h.startswith("stall_") and "(" not in h]
    out: list[Function] = []
    current: list[list[str]] = []

    def close() -> None:
        if not current:
            return
        count = lambda r, name: int(r[col[name]] or 0)  # noqa: E731
        out.append(Function(len(out), current[0][col["Address"]], len(current),
                            sum(count(r, SAMPLES) for r in current),
                            sum(count(r, "Instructions Executed") for r in current),
                            Counter(opcode(r[col["Source"]]) for r in current),
                            {h.removeprefix("stall_"): sum(count(r, h) for r in current) for h in stall_cols}))
        current.clear()

    for r in rows:
        current.append(r)
        if opcode(r[col["Source"]]) == "RET" and not r[col["Source"]].strip().startswith("@"):
            close()
    close()
    return out


def table(functions: list[Function], top: int) -> str:
    total = sum(f.samples for f in functions) or 1
    lines = [f"{'share':>6} {'fn':>4} {'address':>8} {'insts':>6} {'executed':>12}  signature / top stalls"]
    for f in sorted(functions, key=lambda f: -f.samples)[:top]:
        stalls = ", ".join(f"{k} {v / max(f.samples, 1):.0%}" for k, v in f.top_stalls())
        lines.append(f"{f.samples / total:6.1%} {f.index:4d} {f.address[-8:]:>8} {f.instructions:6d} {f.executed:12d}  "
                     f"{f.signature()} | {stalls}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, help="the SASS source page as CSV (.csv or .csv.gz)")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    print(table(split_functions(*read_rows(args.csv)), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
