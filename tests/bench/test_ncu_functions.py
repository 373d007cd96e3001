"""bench/ncu_functions.py: a SASS source page split into functions, with their samples and stalls."""

from __future__ import annotations

import csv
import gzip

from bench.ncu_functions import main, opcode, read_rows, split_functions

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
          "stall_long_sb", "stall_barrier (Not Issued)"]
ROWS = [
    ["0x7f0000", "LDS.64 R6, [R0]", "90", "10", "88", "0", "0"],
    ["0x7f0010", "@P0 RET.REL.NODEC R2", "1", "10", "0", "0", "0"],  # predicated: not the end of a function
    ["0x7f0020", "RET.REL.NODEC R20", "0", "10", "0", "0", "0"],
    ["0x7f0030", "HMMA.16816.F32 R8, R8, R4, R8", "5", "40", "0", "1", "0"],
    ["0x7f0040", "@!P1 LDGSTS.E.BYPASS.128 [R7], desc[UR4][R8.64]", "4", "40", "0", "3", "0"],
    ["0x7f0050", "RET.REL.NODEC R2", "0", "40", "0", "0", "0"],
    ["0x7f0060", "EXIT", "0", "1", "0", "0", "0"],
]


def write(path, gz: bool) -> None:
    opener = gzip.open if gz else open
    with opener(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "megakernel(Globals)"])
        w.writerow(HEADER)
        w.writerows(ROWS)


def test_opcode_drops_predicates_and_modifiers():
    assert opcode("@!P1 LDGSTS.E.BYPASS.128 [R7], desc[UR4][R8.64]") == "LDGSTS"
    assert opcode("  HMMA.16816.F32 R8, R8, R4, R8") == "HMMA"
    assert opcode("@UP0 BRA 0x10") == "BRA"


def test_functions_end_at_unconditional_returns(tmp_path):
    path = tmp_path / "sass.csv.gz"
    write(path, gz=True)
    functions = split_functions(*read_rows(path))
    assert [f.instructions for f in functions] == [3, 3, 1]
    body, matmul, tail = functions
    assert (body.samples, body.executed, body.stalls["barrier"]) == (91, 30, 88)
    assert body.top_stalls(1) == [("barrier", 88)]
    assert matmul.signature() == "HMMA1 LDGSTS1" and matmul.stalls["long_sb"] == 4
    assert "barrier (Not Issued)" not in matmul.stalls and tail.samples == 0


def test_the_table_lists_the_busiest_function_first(tmp_path, capsys):
    path = tmp_path / "sass.csv"
    write(path, gz=False)
    assert main([str(path), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1].split()[:2] == ["91.0%", "0"] and "HMMA1" in lines[2]
