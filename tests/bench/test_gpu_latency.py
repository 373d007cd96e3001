"""The latency probe (bench/gpu_latency.py): its slots and constants agree with the kernel, its figures come from
the right slots, and the kernel compiles with the code it claims to time."""

from __future__ import annotations

import re

from bench import gpu_latency
from bench.gpu_latency import BODY_KB, CODE_KB, OTHER_KB, SLOTS, source_slots, summarize, table
from engine.cuda import nvrtc
from engine.cuda.megakernel import build

SOURCE = gpu_latency.SOURCE.read_text()


def define(name: str) -> int:
    return int(re.search(rf"#define {name} (\d+)", SOURCE).group(1))


def test_slots_and_constants_are_the_kernels() -> None:
    assert source_slots(SOURCE) == SLOTS
    assert define("CHASE_STEPS") == gpu_latency.CHASE_STEPS and define("PING_ROUNDS") == gpu_latency.PING_ROUNDS
    assert re.search(r"#define SOLO_BYTES \(8 << 20\)", SOURCE) and gpu_latency.SOLO_BYTES == 8 << 20
    blocks = re.search(r"OTHER_BLOCKS\[5\] = \{([^}]*)\}", SOURCE).group(1)
    assert tuple(4 * int(b) for b in blocks.split(",")) == OTHER_KB
    assert max(OTHER_KB) == 4 * define("OTHER_BLOCKS_ALL")
    assert CODE_KB == 4 * define("CODE_BLOCKS_ALL") and BODY_KB == 4 * define("BODY_BLOCKS")


def test_the_dram_walk_cannot_be_served_from_l2() -> None:
    """Every node of the DRAM ring in a 128-byte line of its own, and the lines far more than the largest L2 we run
    on (the H200's 60 MB): round 11's ring (65,536 nodes, 2 MB of sectors) stayed in L2 and measured it."""
    nbytes, stride = gpu_latency.DRAM_RING
    assert stride >= 128 and nbytes % stride == 0
    assert (nbytes // stride) * 128 >= 8 * (60 << 20)
    assert (nbytes // 4) < 2**32  # the ring's u32 links address every word of it
    assert gpu_latency.DRAM_RING[0] >= (64 << 20) + gpu_latency.SOLO_BYTES  # the solo stream reads 64 MB in


def test_launch_arguments_are_the_kernels_struct() -> None:
    body = re.search(r"struct Probe \{(.*?)\};", SOURCE, re.S).group(1)
    members = [name for line in body.splitlines() for name in re.findall(r"(\w+)\s*[,;]", line.split("//")[0])]
    assert [name for name, _ in gpu_latency.ProbeArgs._fields_] == members


def test_summary_reads_each_figure_from_its_slot() -> None:
    # a 2 GHz clock; every other slot a distinct count of cycles
    raw = {name: 1000 * (i + 1) for i, name in enumerate(SLOTS)}
    raw.update(ns0=1_000, ns1=21_000, clk0=5_000, clk1=45_000, load_ns=2_000_000, load_bytes=9_000_000_000)
    got = summarize(raw)
    assert got["clock_ghz"] == 2.0
    assert got["l2"] == round(raw["l2"] / gpu_latency.CHASE_STEPS / 2, 1)
    assert got["dram"] == round(raw["dram"] / gpu_latency.CHASE_STEPS / 2, 1)
    assert got["l1"] == round(raw["l1"] / gpu_latency.CHASE_STEPS / 2, 1)
    assert got["solo_gb_s"] == round((8 << 20) * 2 / raw["solo"], 1)
    assert got["ping"] == round(raw["ping"] / gpu_latency.PING_ROUNDS / 2, 1)
    assert (got["fence_idle"], got["sc_stores"]) == (raw["fence_idle"] / 2, raw["sc_stores"] / 2)
    assert got["code_after_16k"] == round(raw["code_after0"] / 16 / 2, 1)
    assert got["code_after_256k"] == round(raw["code_after4"] / 16 / 2, 1)
    assert got["code_dram"] == round(raw["code_dram"] / 128 / 2, 1)
    assert got["code_warm"] == round(raw["code_warm"] / 16 / 2, 1)
    assert got["load_tb_s"] == 4.5 and got["error"] == raw["error"]
    text = table({"a.idle": got, "b.load": got})
    assert "a.idle" in text and "code_after_128k" in text and "error" not in text


def test_probe_compiles_with_the_release_protocol_and_unfolded_code() -> None:
    ptx = nvrtc.compile_file(gpu_latency.SOURCE, 90, ("latency_probe", "latency_ring"),
                             build.options() + ("-DMK_SYNC_ACQREL=1",), kernel_dir=build.MEGAKERNEL_DIR,
                             ptx=True).image.decode()
    # the ping runs the megakernel's knob protocol; the fence rows time both fences
    assert "red.release.gpu.global.add.u32" in ptx and "ld.relaxed.gpu.global.u32" in ptx
    assert "fence.acq_rel.gpu" in ptx and "membar.gl" in ptx
    # 128 + 256 KB of straight-line code (code_run, code_other), none folded away
    assert len(re.findall(r"\bfma\.rn\.f32\b", ptx)) == (128 + 256) * 1024 // 16
    # every call the source makes is in the PTX: taken for pure functions, the calls were merged and hoisted
    # (rounds 11-13: 6 calls of code_run for 11, one of code_other for 5), and the timed spans held no code
    assert len(re.findall(r"call\.uni[^;]*code_run", ptx)) == 2 + 2 * len(OTHER_KB)
    assert len(re.findall(r"call\.uni[^;]*code_other", ptx)) == len(OTHER_KB)


def test_error_line_reads_the_control_words_the_kernel_writes() -> None:
    """The probe's ctl sits after two stages of counters (latency_probe.cu: g.ctl = words + 2 + 2 NUM_OPCODES):
    the error and its info words come from there."""
    import numpy as np

    from engine.cuda.megakernel.instructions import NUM_OPCODES
    from engine.cuda.megakernel.layout import Ctl, Err

    assert re.search(r"g\.ctl = reinterpret_cast<i32\*>\(p\.words \+ 2 \+ 2 \* NUM_OPCODES\)", SOURCE)
    words = np.zeros(gpu_latency.WORDS, np.int32)
    ctl = 2 + 2 * NUM_OPCODES
    words[ctl + Ctl.ERROR] = int(Err.WAIT_TIMEOUT)
    words[ctl + Ctl.ERROR_INFO : ctl + Ctl.ERROR_INFO + 6] = [0, -1, 0, 0, 7, 130]
    assert gpu_latency.error_line(words) == ("WAIT_TIMEOUT (sm, instruction, stage, op, counter, expected = "
                                             "0, -1, 0, 0, 7, 130)")
