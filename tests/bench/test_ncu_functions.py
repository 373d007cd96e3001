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


LISTING = """
\t.section\t.text._Z10megakernel7Globals,"ax",@progbits
_Z10megakernel7Globals:
.text._Z10megakernel7Globals:
        /*0000*/                   LDS.64 R6, [R0] ;
.L_x_1:
        /*0010*/               @P0 RET.REL.NODEC R2 ;
        /*0020*/                   RET.REL.NODEC R20 ;
        .type           $_Z10megakernel7Globals$_Z6matvecv,@function
$_Z10megakernel7Globals$_Z6matvecv:
        /*0030*/                   HMMA.16816.F32 R8, R8, R4, R8 ;
        /*0040*/              @!P1 LDGSTS.E.BYPASS.128 [R7], desc[UR4][R8.64] ;
        /*0050*/                   RET.REL.NODEC R2 ;
$_Z10megakernel7Globals$_Z4tailv:
        /*0060*/                   EXIT ;
"""


def test_a_listing_names_the_functions_and_sizes_their_code(tmp_path, capsys):
    from bench.ncu_functions import kb, sass_functions

    named = sass_functions(LISTING)
    assert [n for _, n in named] == [3, 3, 1]  # local labels (.L_x_1) do not cut a function
    path = tmp_path / "sass.csv"
    write(path, gz=False)
    functions = split_functions(*read_rows(path), named)
    assert [f.name for f in functions][1:] in (["matvec()", "tail()"], ["_Z6matvecv", "_Z4tailv"])  # c++filt or not
    assert functions[1].ran == 3 and kb(functions[1].ran) == 3 * 16 / 1024
    listing = tmp_path / "mk.sass"
    listing.write_text(LISTING)
    assert main([str(path), "--sass", str(listing)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("code that ran: 0.1 KB of 0.1 KB")  # 7 instructions, all run: 112 bytes
    lines = out.splitlines()  # the busiest function first, by name
    assert "megakernel" in lines[2] and "91.0%" in lines[2] and "matvec" in lines[3]


def test_a_listing_of_another_cubin_is_refused(tmp_path):
    import pytest

    from bench.ncu_functions import sass_functions

    path = tmp_path / "sass.csv"
    write(path, gz=False)
    with pytest.raises(ValueError, match="not the cubin"):
        split_functions(*read_rows(path), sass_functions(LISTING)[:2])
