"""Rows split in K over several blocks a tile (engine/cuda/ksplit.py, kernels/mmvq.cuh KSplit): which launches
split, the instances they take, the kernel's view of the scratch. The split's results are checked on the GPU
(bench/gpu_kernels.py run_ksplit_checks: against the float64 reference, twice on one scratch)."""

from __future__ import annotations

import ctypes

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import i8b, instances, ksplit, ops
from tests.kernels.test_close import FFN, H, _act, _buf, _Dev, _weight


def test_only_wide_rows_at_the_split_counts_take_parts(monkeypatch) -> None:
    monkeypatch.setattr(ksplit, "PARTS_AT", {1: 2, 3: 4, 5: 2})
    assert ksplit.parts(17408, 1) == 2 and ksplit.parts(17408, 3) == 4
    assert ksplit.parts(17408, 2) == 1  # no entry: a block a tile
    assert ksplit.parts(17408, 5) == 1  # no split instance past 4 tokens
    assert ksplit.parts(ksplit.MIN_COLS - 256, 1) == 1  # narrower rows keep a block a tile
    monkeypatch.setattr(ksplit, "PARTS_AT", {1: 64})
    assert ksplit.parts(17408, 1) == ksplit.MAX_PARTS
    assert ksplit.suffix(1) == "" and ksplit.suffix(2) == "_ks"


def test_the_split_instances_exist_for_both_types() -> None:
    for t in instances.KSPLIT_TOKENS:
        assert instances.INSTANCES[f"mmvq_q4_K_i8_t{t}_ks"].expr == f"mmvq_i8<{t}, {instances.ACT_STAGES}, 1, -1, true>"
        assert instances.INSTANCES[f"mmvq_q6_K_i8_t{t}_ks"].expr == f"mmvq_q6_i8<{t}, {instances.ACT_STAGES}, -1, true>"


def test_the_argument_mirrors_the_kernels_struct() -> None:
    """struct KSplit { float* part; u32* count; int parts; } is 24 bytes with its padding, parts at 16."""
    assert ctypes.sizeof(ksplit.KSplitArg) == 24 and ksplit.KSplitArg.parts.offset == 16
    assert ksplit.NO_SPLIT.parts == 1 and ksplit.NCOLS == 8  # kernels/mmvq.cuh MMVQ_NCOLS


def test_the_environment_sets_every_count(monkeypatch) -> None:
    monkeypatch.setenv(ksplit.KSPLIT_ENV, "2")
    assert ksplit._default_parts_at()[1] == 2
    monkeypatch.setenv(ksplit.KSPLIT_ENV, "9")
    with pytest.raises(ValueError, match="OPENJET_CUDA_KSPLIT"):
        ksplit._default_parts_at()
    monkeypatch.delenv(ksplit.KSPLIT_ENV)
    assert ksplit._default_parts_at() == {}



@pytest.mark.parametrize("qtype, name", [(Q.Q4_K, "mmvq_q4_K_i8_t1_ks"), (Q.Q6_K, "mmvq_q6_K_i8_t1_ks")])
def test_ffn_down_launches_parts_blocks_a_tile_on_one_scratch(monkeypatch, qtype: Q, name: str) -> None:
    """With PARTS_AT {1: 2}, ffn_down's one-token launch takes the split instance on twice the tiles, its KSplit
    pointing at the device's scratch (counts zeroed once); a narrower matrix keeps the plain instance."""
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "Q6_I8", True)
    monkeypatch.setattr(i8b, "ON", False)  # the narrow Q4_K on mmvq_i8 too (mmvq_i8b's tensor maps need a driver)
    monkeypatch.setattr(ksplit, "PARTS_AT", {1: 2})
    monkeypatch.setattr(ksplit, "is_capturing", lambda dev: False)
    dev = _Dev()
    x, y = _act(FFN, i8_tokens=1), _buf(4 * H)
    for _ in range(2):
        ops.matmul(dev, _weight(qtype, H, FFN), x, y, 1, H, residual=y)
    (launched, args), again = dev.launches
    (_, grid, _), _ = dev.grids
    assert launched == name and grid == 2 * H // 16
    split = args[-1]
    assert split.parts == 2 and split.part != 0 and split.count != 0 and again[1][-1].count == split.count
    assert [value for _, value in dev.filled] == [0]  # zeroed on allocation only: each launch leaves them zero
    dev.launches.clear()
    ops.matmul(dev, _weight(qtype, H, H), _act(H, i8_tokens=1), y, 1, H)
    ((launched, args),) = dev.launches
    assert not launched.endswith("_ks") and args[-1].parts == 1


def test_a_split_launch_keeps_off_the_side_stream(monkeypatch) -> None:
    """Its scratch is one per device, as the persistent kernel's: ops.uses_device_scratch (which keeps a projection's
    part on the main stream) says so for a split launch and not for the same launch unsplit."""
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "Q6_I8", True)
    dev, act = _Dev(), _act(FFN, i8_tokens=1)
    for qtype in (Q.Q4_K, Q.Q6_K):
        down = _weight(qtype, H, FFN)
        monkeypatch.setattr(ksplit, "PARTS_AT", {})
        assert not ops.uses_device_scratch(dev, down, act, 1)
        monkeypatch.setattr(ksplit, "PARTS_AT", {1: 2})
        assert ops.uses_device_scratch(dev, down, act, 1)
