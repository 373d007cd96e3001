"""Host-side contracts of the persistent stream-K mmvq (no GPU needed): the split of a matrix's units over the
warps (every unit once, every cut tile's shares where the summing warp looks for them), the mirror of the
kernel's arithmetic, the launch shape, the switch that selects it, and the compiled kernels' resources."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import instances, nvrtc, ops, persist
from tests.kernels import ptxas

SOURCE = nvrtc.KERNEL_DIR / "mmvq_persist.cu"
H200_SMS = 132
# (tiles, superblocks per tile) of the 27B model's matrices (rows / 16, K / 256), and small edge cases
SHAPES = {"attn_q": (768, 20), "ffn_gate_up": (2176, 20), "ffn_up": (1088, 20), "ffn_down": (320, 68),
          "ssm_out": (320, 24), "attn_kv": (64, 20), "ssm_ab": (3, 20), "odd_rows": (63, 3), "one": (1, 1)}


def _kernel_expr(name: str) -> str:
    """The body expression of `__device__ ... name(...) { return EXPR; }` in the kernel source."""
    text = SOURCE.read_text()
    match = re.search(rf"{name}\(u32 \w+, u32 U, u32 P\) \{{ return ([^;]+); \}}", text)
    assert match, f"{name} not found in {SOURCE.name}"
    return match.group(1)


def _c_u32(expr: str, **values: int) -> int:
    """Evaluate a C expression of unsigned 32-bit operands (+ - * / and parentheses only)."""
    assert re.fullmatch(r"[\w\s()+\-*/]+", expr), expr
    value = eval(expr.replace("/", "//"), {}, values)  # noqa: S307 - our own kernel's arithmetic
    assert 0 <= value < 1 << 32, f"{expr} leaves 32 bits for {values}"
    return value


def _plan(tiles: int, nb: int, num_warps: int) -> list[persist.Segment]:
    """Every warp's segments."""
    return [seg for w in range(num_warps) for seg in persist.warp_segments(w, tiles, nb, num_warps)]


def test_the_python_mirror_computes_what_the_kernel_computes() -> None:
    start, own = _kernel_expr("persist_start"), _kernel_expr("persist_owner")
    rng = np.random.default_rng(0)
    for _ in range(2000):
        units = int(rng.integers(1, 400_000))
        num_warps = int(rng.integers(1, min(units, 2112) + 1))
        w, u = int(rng.integers(0, num_warps + 1)), int(rng.integers(0, units))
        assert _c_u32(start, w=w, U=units, P=num_warps) == persist.range_start(w, units, num_warps)
        assert _c_u32(own, u=u, U=units, P=num_warps) == persist.owner(u, units, num_warps)


@pytest.mark.parametrize("units", [1, 2, 3, 7, 20, 61, 100])
def test_owner_is_the_warp_whose_range_holds_the_unit(units: int) -> None:
    for num_warps in range(1, units + 1):
        starts = [persist.range_start(w, units, num_warps) for w in range(num_warps + 1)]
        assert starts[0] == 0 and starts[-1] == units
        assert all(b - a >= 1 for a, b in zip(starts, starts[1:])), "P <= U leaves no range empty"
        for u in range(units):
            w = persist.owner(u, units, num_warps)
            assert starts[w] <= u < starts[w + 1]


@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
def test_every_unit_is_computed_once_and_every_cut_tile_finds_its_shares(shape: str) -> None:
    tiles, nb = SHAPES[shape]
    units = tiles * nb
    for blocks_per_sm in (1, 4):
        grid, warps = persist.launch_shape(units, H200_SMS, blocks_per_sm, 3)
        num_warps = grid * warps
        plan = _plan(tiles, nb, num_warps)
        covered = Counter((s.tile, sb) for s in plan for sb in range(s.sb0, s.sb1))
        assert len(covered) == units and set(covered.values()) == {1}
        slots = [s.slot for s in plan if s.slot is not None]
        assert len(slots) == len(set(slots)) and all(0 <= s < 2 * num_warps for s in slots)
        by_tile: dict[int, list[persist.Segment]] = {}
        for seg in plan:
            by_tile.setdefault(seg.tile, []).append(seg)
        for tile, segs in by_tile.items():
            if len(segs) == 1:  # stored straight by its one warp
                assert segs[0].slot is None and (segs[0].sb0, segs[0].sb1) == (0, nb)
                continue
            assert all(s.slot is not None for s in segs)
            written = [s.slot for s in sorted(segs, key=lambda s: s.warp)]
            assert persist.share_slots(tile, tiles, nb, num_warps) == written, f"tile {tile}"


def test_each_warp_cuts_at_most_two_tiles() -> None:
    tiles, nb = SHAPES["ffn_down"]
    grid, warps = persist.launch_shape(tiles * nb, H200_SMS, 4, 3)
    for w in range(grid * warps):
        segs = persist.warp_segments(w, tiles, nb, grid * warps)
        assert sum(s.slot is not None for s in segs) <= 2
        assert all(s.slot is None for s in segs[1:-1]), "only the first and last tile of a range can be cut"


def test_launch_shape_is_one_wave_and_never_starves_a_warp() -> None:
    assert persist.launch_shape(768 * 20, H200_SMS, 4, 3) == (528, 4)  # attn_q: all 132 x 16 warps
    assert persist.launch_shape(310_400, H200_SMS, 4, 2) == (528, 4)  # output: still one wave
    assert persist.launch_shape(64 * 20, H200_SMS, 4, 2) == (160, 4)  # attn_kv: 2 units a warp
    assert persist.launch_shape(60, H200_SMS, 4, 3) == (5, 4)  # ssm_ab
    assert persist.launch_shape(6, H200_SMS, 4, 3) == (1, 2)  # fewer units than a block's ring
    assert persist.launch_shape(1, H200_SMS, 4, 3) == (1, 1)
    for units in range(1, 200):
        grid, warps = persist.launch_shape(units, 8, 3, 3)
        assert 1 <= grid <= 24 and 1 <= warps <= persist.PERSIST_WARPS and grid * warps <= units
    with pytest.raises(ValueError, match="32-bit"):
        persist.launch_shape(1 << 22, H200_SMS, 4, 1)


def test_host_constants_mirror_the_kernel() -> None:
    text = SOURCE.read_text()
    assert re.search(rf"#define PERSIST_WARPS {persist.PERSIST_WARPS}\b", text)
    floats = int(re.search(r"#define PERSIST_TILE_FLOATS (\d+)", text).group(1))
    assert floats * 4 == persist.TILE_BYTES
    for qtype in instances.PERSIST_QTYPES:
        assert qtype in ops.STAGE_SHAPE
        for variant in ("persist", "persist_hl", "persist_x2"):
            assert f"mmvq_{instances.qtype_tag(qtype)}_{variant}" in instances.INSTANCES


@pytest.mark.parametrize("qtype", instances.PERSIST_QTYPES, ids=lambda q: q.name)
def test_four_blocks_fit_an_h100_and_one_block_an_rtx_card(qtype: Q) -> None:
    """16 warps per SM on sm_90 (228 KB, 1 KB reserved per block); a whole block within sm_86/89's 99 KB."""
    block = persist.PERSIST_WARPS * persist.warp_bytes(*ops.STAGE_SHAPE[qtype])
    assert 4 * (block + 1024) <= 228 * 1024
    assert block <= 99 * 1024
    assert persist.warp_bytes(*ops.STAGE_SHAPE[qtype]) % 16 == 0, "each warp's ring starts 16-byte aligned"


def test_the_switch_selects_the_persistent_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ops.MMVQ_ENV, "persist")
    assert ops._default_pipelined() == (frozenset(instances.PERSIST_QTYPES), True, "persist")
    saved = ops.pipeline_state()
    try:
        ops.set_pipelined(instances.PERSIST_QTYPES, everywhere=True, kernel="persist")
        assert ops.pipeline_kernel(Q.Q5_K, True, 8) == "persist" and ops.pipeline_kernel(Q.Q4_K, False, 1) == "persist"
        with pytest.raises(ValueError, match="no cp mmvq for Q5_K"):
            ops.set_pipelined({Q.Q5_K}, kernel="cp")
        with pytest.raises(ValueError, match="no pipelined mmvq 'stream'"):
            ops.set_pipelined({Q.Q4_K}, kernel="stream")
        with pytest.raises(ValueError, match="Q8_0"):
            ops.set_pipelined({Q.Q8_0}, kernel="persist")
    finally:
        ops.set_pipelined(*saved)
    assert ops.pipeline_state() == saved


def test_persistent_kernels_fit_sixteen_warps_without_spilling() -> None:
    """sm_90: no local memory, and at most 128 registers a thread, so 4 blocks of 128 threads are resident."""
    for name, use in ptxas.usage("mmvq_persist").items():
        assert use.spill_bytes == 0 and use.registers <= 128, \
            f"{name}: {use.registers} registers, {use.spill_bytes} bytes spilled"


def test_bench_times_persist_beside_cp_and_plain_unless_its_checks_failed() -> None:
    from bench.gpu_kernels import _matmul_variants

    labels = [label for label, _, _ in _matmul_variants(Q.Q4_K, with_persist=True)]
    kernels = ["persist", "cp", "cpa", "cpa2", "plain"]
    assert labels == kernels + [f"{k}.precise" for k in kernels]
    assert [label for label, _, _ in _matmul_variants(Q.Q5_K, with_persist=True)][:2] == ["persist", "plain"]
    assert [label for label, _, _ in _matmul_variants(Q.Q4_K, with_persist=False)][:4] == ["cp", "cpa", "cpa2", "plain"]
    assert [label for label, _, _ in _matmul_variants(Q.Q8_0, with_persist=True)] == ["plain"]
    for label, state, precise in _matmul_variants(Q.Q6_K, with_persist=True):
        ops.set_pipelined(*state)  # every variant is a choice set_pipelined accepts
        assert precise == label.endswith(".precise")
        kernel = label.split(".")[0]
        assert ops.pipeline_kernel(Q.Q6_K, precise, 8) == (None if kernel == "plain" else kernel)
        # staged activations run only up to 4 tokens: 8 goes through mmvq_cp (ops._mmvq_pipelined)
        assert kernel not in ops.STAGED_TILES or not ops.staged_act_fits(Q.Q6_K, 8, precise, 4)
    ops.set_pipelined(*ops._default_pipelined())


def test_a_failed_persist_part_keeps_the_new_kernel_out_of_the_timings(tmp_path) -> None:
    import json

    from bench.gpu_check import _persist_failed

    def part(*oks: bool) -> None:
        checks = [{"op": "matmul.persist", "ok": ok} for ok in oks]
        (tmp_path / "part_persist.json").write_text(json.dumps({"checks": checks}))

    assert not _persist_failed(tmp_path, {"kernels": 0})  # not run in this call: the caller decides
    assert _persist_failed(tmp_path, {"persist": 0})  # ran, wrote nothing
    part(True, True)
    assert not _persist_failed(tmp_path, {"persist": 0})
    assert _persist_failed(tmp_path, {"persist": 1})  # raised after its checks
    part(True, False)
    assert _persist_failed(tmp_path, {"persist": 0})
