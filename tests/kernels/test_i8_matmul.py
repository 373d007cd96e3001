"""Host-side rules of the int8-activation Q4_K matmul (kernels/mmvq_i8.cu): the launcher's copies of its
constants, the shared memory it asks for, and when a matmul takes it. The kernel and the producers' int8 copy
are checked on the GPU (bench/gpu_kernels.py I8_CHECKS, bench/gpu_models.py mode .i8)."""

from __future__ import annotations

import re

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import instances, nvrtc, ops

SM90, GEFORCE = 232448, 101376


def _act(i8_tokens: int, width: int = 6144) -> ops.Act:
    return ops.Act(None, None, None, width, width, 8, i8_tokens=i8_tokens)


def test_the_launcher_mirrors_the_kernels_constants() -> None:
    src = "".join((nvrtc.KERNEL_DIR / name).read_text() for name in ("mmvq_i8.cu", "i8q4k.cuh"))  # its unit's header
    defines = dict(re.findall(r"#define (\w+) (\d+)", src))
    assert int(defines["I8_SLOT_PITCH"]) + 16 == ops.I8_SLOT_BYTES  # a slot and its sums record
    assert int(defines["I8_ZERO_BYTES"]) == ops.I8_ZERO_BYTES
    pitch = int(re.search(r"using Q4KStage8 = Q4KStage<(\d+)>", src).group(1))
    assert 16 * pitch + 16 * 12 + 16 * 4 == ops.I8_STAGE_BASE  # quants, scales, dm of 16 rows
    # every stage starts 16-byte aligned (cp.async), at each token count
    assert all(ops.i8_stage_bytes(t) % 16 == 0 for t in range(1, instances.I8_MAX_TOKENS + 1))


def test_one_instance_per_token_count_and_tiles_a_block() -> None:
    names = {n for n in instances.INSTANCES if n.startswith("mmvq_q4_K_i8_")}
    single = {f"mmvq_q4_K_i8_t{t}" for t in range(1, instances.I8_MAX_TOKENS + 1)}
    several = {f"mmvq_q4_K_i8_t{t}_r{r}" for t in range(1, 5) for r in instances.I8_TILE_COUNTS if r > 1}
    halves = {f"mmvq_q4_K_i8_t{t}_halves" for t in instances.HALVES_TOKENS}  # tests/kernels/test_halves.py
    assert names == single | several | halves
    assert ops.I8_TOKENS <= instances.I8_MAX_TOKENS and ops.I8_TILES in instances.I8_TILE_COUNTS


def test_several_tiles_a_block_only_up_to_four_tokens(monkeypatch) -> None:
    """The 5-token form is built for one tile a block only (it would spill with more)."""
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "I8_TOKENS", 5)
    monkeypatch.setattr(ops, "I8_TILES", 4)
    assert ops.i8_runs(Q.Q4_K, 4, _act(5), SM90) and not ops.i8_runs(Q.Q4_K, 5, _act(5), SM90)


def test_only_q4k_launches_of_at_most_i8_tokens_whose_int8_copy_was_written(monkeypatch) -> None:
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "I8_TOKENS", 5)
    assert ops.i8_runs(Q.Q4_K, 1, _act(1), SM90)
    assert ops.i8_runs(Q.Q4_K, 3, _act(4), SM90)
    assert not ops.i8_runs(Q.Q4_K, 2, _act(1), SM90)  # the producer wrote one token's copy only
    assert not ops.i8_runs(Q.Q4_K, 1, _act(0), SM90)  # its last launch wrote none (more than 4 tokens)
    assert not ops.i8_runs(Q.Q6_K, 1, _act(1), SM90)
    assert ops.i8_runs(Q.Q4_K, 5, _act(5), SM90)  # the fifth token's lo level in a second mma
    assert not ops.i8_runs(Q.Q4_K, 6, _act(8), SM90)
    monkeypatch.setattr(ops, "I8_TOKENS", 4)  # the default: the 5-token pass measured slower with it
    assert not ops.i8_runs(Q.Q4_K, 5, _act(5), SM90) and ops.i8_runs(Q.Q4_K, 4, _act(5), SM90)
    monkeypatch.setattr(ops, "I8_MATMUL", False)
    assert not ops.i8_runs(Q.Q4_K, 1, _act(1), SM90)


def test_on_by_default_and_the_switch_bounds_its_tokens(monkeypatch) -> None:
    monkeypatch.delenv(ops.I8_ENV, raising=False)
    assert ops._i8_default()
    monkeypatch.setenv(ops.I8_ENV, "0")
    assert not ops._i8_default()
    assert ops.I8_TOKENS == 4
    with pytest.raises(ValueError, match="built for 1 to 5"):
        ops.set_i8(True, 6)


def test_its_shared_memory_fits_two_blocks_of_an_h200_sm_and_a_geforce_block(monkeypatch) -> None:
    for t in range(1, instances.I8_MAX_TOKENS + 1):
        assert ops._i8_smem(t, ops.MMVQ_WARPS) <= ops.ACT_MAX_BLOCK_SMEM
        assert (ops._i8_smem(t, ops.MMVQ_WARPS) <= GEFORCE) == (t <= 4)  # 5 tokens: 256 bytes over
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "I8_TOKENS", 5)
    assert ops.i8_runs(Q.Q4_K, 4, _act(5), GEFORCE) and not ops.i8_runs(Q.Q4_K, 5, _act(5), GEFORCE)
    # 4 tokens: 8 warps x (2 stages x (2816 + 8 x 336 + 32) + 256)
    assert ops._i8_smem(4, 8) == 8 * (2 * (2816 + 8 * 336 + 32) + 256)


@pytest.mark.parametrize("value", ["2", "yes", "on"])
def test_a_bad_switch_value_is_a_clear_error(monkeypatch, value) -> None:
    monkeypatch.setenv(ops.I8_ENV, value)
    with pytest.raises(ValueError, match="OPENJET_CUDA_I8"):
        ops._i8_default()


def test_warps_per_block_follow_the_switches_in_order(monkeypatch) -> None:
    """I8_WARPS overrides all; I8_WARPS_AT sets a token count's own; else _pipelined_warps; never more warps than
    the row's superblocks."""
    sms, cols, tiles = 132, 5120, 2176
    default = ops._pipelined_warps(cols, tiles, sms)
    assert default == 5 and ops.DEFAULT_I8_WARPS_AT == {1: 4}  # one token: 4-warp blocks (bench/NOTES.md v19)
    assert ops.i8_warps(cols, tiles, 1, sms) == 4 and ops.i8_warps(cols, tiles, 2, sms) == default
    monkeypatch.setattr(ops, "I8_WARPS_AT", {})
    assert ops.i8_warps(cols, tiles, 1, sms) == default
    monkeypatch.setattr(ops, "I8_WARPS", 8)
    assert ops.i8_warps(cols, tiles, 1, sms) == 8
    assert ops.i8_warps(512, tiles, 1, sms) == 2  # two superblocks, two warps


def test_the_widest_rows_take_their_own_warps(monkeypatch) -> None:
    """I8_WIDE_WARPS_AT sets a token count's warps for rows of WIDE_COLS or more (ffn_down's 17,408) and no
    narrower ones; I8_WARPS still overrides it."""
    sms, tiles, wide = 132, 320, 17408
    assert ops.i8_warps(wide, tiles, 1, sms) == 4  # empty by default: I8_WARPS_AT's one-token 4
    monkeypatch.setattr(ops, "I8_WIDE_WARPS_AT", {1: 7, 3: 6})
    assert ops.i8_warps(wide, tiles, 1, sms) == 7 and ops.i8_warps(wide, tiles, 3, sms) == 6
    assert ops.i8_warps(wide, tiles, 2, sms) == ops._pipelined_warps(wide, tiles, sms)
    assert ops.i8_warps(ops.WIDE_COLS - 256, tiles, 1, sms) == 4 and ops.i8_warps(5120, tiles, 3, sms) == 5
    assert ops.i8_warps(wide, tiles, 1, sms, {1: 6}) == 6 and ops.i8_warps(wide, tiles, 1, sms, {}) == 4  # Q6_K's own
    monkeypatch.setattr(ops, "I8_WARPS", 8)
    assert ops.i8_warps(wide, tiles, 1, sms) == 8
