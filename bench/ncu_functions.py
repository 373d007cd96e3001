"""Where a megakernel launch's warps stall, function by function, from Nsight Compute's SASS source page.

The megakernel's device functions (each op's consumer, the matmul instances, the controller and loader loops in the
kernel's own body) are one cubin; the SASS page lists every instruction with its PC-sampling counts but not which
function it belongs to. This splits the listing at each unconditional RET and tells the functions apart by what
they contain (HMMA: a matmul, LDGSTS: cp.async rings or staged keys, DMUL / F2F: the rope's double-precision
angle, BAR: consumer barriers), so the stalls of one launch can be read per function.

With `--sass`, the `nvdisasm -c` listing of the same cubin (the kernel cache's entry the launch loaded: built by
the same NVRTC from the same source, so its instructions are the page's, one for one), the functions are cut at
its labels instead and named, and the table adds each function's code: static KB, and KB of instructions the
launch ran at least once. The executed total against the SM's instruction cache (~128 KB: the latency probe's
`code_after_*`, bench/MEGAKERNEL.md round 14) says whether a layer's code can stay warm from one layer to the next.

    ncu --target-processes all --kernel-name megakernel --launch-skip N --launch-count 1 \\
        --section SourceCounters --export mk -f python bench/gpu_megakernel.py --parts cycle27b ...
    ncu --import mk.ncu-rep --page source --print-source sass --csv | gzip > sass.csv.gz
    python bench/ncu_functions.py sass.csv.gz --top 20
    nvdisasm -c megakernel-sm90-<key>.cubin > mk.sass; python bench/ncu_functions.py sass.csv.gz --sass mk.sass
"""

from __future__ import annotations

import argparse
import csv
import gzip
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
INSTRUCTION_BYTES = 16  # every sm_70+ SASS instruction
SIGNATURE = ("HMMA", "IMMA", "LDGSTS", "MUFU", "DMUL", "F2F", "SHFL", "BAR", "ATOM", "RED")


def kb(instructions: int) -> float:
    """The KB that many SASS instructions take."""
    return instructions * INSTRUCTION_BYTES / 1024


@dataclass
class Function:
    index: int
    address: str
    instructions: int
    samples: int
    executed: int
    opcodes: Counter
    stalls: dict[str, int]
    name: str = ""
    ran: int = 0  # instructions executed at least once

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


def sass_functions(listing: str) -> list[tuple[str, int]]:
    """(mangled name, instructions) of each function of an `nvdisasm -c` listing in address order: the kernel's
    own body from its entry label, then each device function from its `$<kernel>$<function>:` label."""
    out: list[tuple[str, int]] = []
    for line in listing.splitlines():
        label = re.match(r"^(\$?[\w.$]+):\s*$", line)
        if label and not label.group(1).startswith((".", "$.")):
            out.append((label.group(1).split("$")[-1], 0))
        elif out and re.match(r"\s*/\*[0-9a-f]{4,}\*/\s", line):
            out[-1] = (out[-1][0], out[-1][1] + 1)
    return [(name, n) for name, n in out if n]


def demangle(names: list[str]) -> list[str]:
    """C++ names through c++filt where it is installed (binutils), else as they are."""
    if not names or not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else names


def split_functions(header: list[str], rows: list[list[str]],
                    named: list[tuple[str, int]] | None = None) -> list[Function]:
    """Consecutive instructions up to and including each unconditional RET, as functions; or, given `named`
    (sass_functions of the same cubin), the functions it lists, named."""
    col = {name: i for i, name in enumerate(header)}
    stall_cols = [h for h in header if h.startswith("stall_") and "(" not in h]
    out: list[Function] = []
    current: list[list[str]] = []
    count = lambda r, name: int(r[col[name]] or 0)  # noqa: E731

    def close(name: str = "") -> None:
        if not current:
            return
        out.append(Function(len(out), current[0][col["Address"]], len(current),
                            sum(count(r, SAMPLES) for r in current),
                            sum(count(r, "Instructions Executed") for r in current),
                            Counter(opcode(r[col["Source"]]) for r in current),
                            {h.removeprefix("stall_"): sum(count(r, h) for r in current) for h in stall_cols},
                            name, sum(1 for r in current if count(r, "Instructions Executed") > 0)))
        current.clear()

    if named is not None:
        if sum(n for _, n in named) != len(rows):
            raise ValueError(f"the listing has {sum(n for _, n in named)} instructions, the page {len(rows)}: "
                             "not the cubin this launch ran")
        at = 0
        for name, n in zip(demangle([m for m, _ in named]), [n for _, n in named]):
            current.extend(rows[at:at + n])
            at += n
            close(name)
        return out
    for r in rows:
        current.append(r)
        if opcode(r[col["Source"]]) == "RET" and not r[col["Source"]].strip().startswith("@"):
            close()
    close()
    return out


def table(functions: list[Function], top: int) -> str:
    total = sum(f.samples for f in functions) or 1
    if any(f.name for f in functions):  # named: the code's size beside the stalls
        ran = sum(f.ran for f in functions)
        lines = [f"code that ran: {kb(ran):.1f} KB of {kb(sum(f.instructions for f in functions)):.1f} KB; no_inst "
                 f"{sum(f.stalls.get('no_inst', 0) for f in functions) / total:.1%} of the samples",
                 f"{'share':>6} {'KB':>6} {'ran KB':>6} {'no_inst':>7}  function | top stalls"]
        for f in sorted(functions, key=lambda f: -f.samples)[:top]:
            stalls = ", ".join(f"{k} {v / max(f.samples, 1):.0%}" for k, v in f.top_stalls())
            lines.append(f"{f.samples / total:6.1%} {kb(f.instructions):6.1f} {kb(f.ran):6.1f} "
                         f"{f.stalls.get('no_inst', 0) / total:7.2%}  {f.name[:100]} | {stalls}")
        return "\n".join(lines)
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
    parser.add_argument("--sass", type=Path, help="`nvdisasm -c` of the launch's cubin: named functions, code KB")
    args = parser.parse_args(argv)
    named = sass_functions(args.sass.read_text()) if args.sass else None
    print(table(split_functions(*read_rows(args.csv), named), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
