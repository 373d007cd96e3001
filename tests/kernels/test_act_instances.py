"""Which instance of the activation producers (kernels/act.cu act_from) a launch takes: launches of 1-8 tokens
(decode and verify, ops.ACT_SPLIT_TOKENS) take act_<mode>_t1, a block per (superblock, token); other launches of
one token group (the bench variants) of the modes in ops.ACT_ONE_GROUP_MODES take act_<mode>_g1, compiled for one
block an SM so that RMSNorm's row loads all fly at once; every other launch the ACT_MIN_BLOCKS instance that
prefill's thousands of blocks need. The kernels themselves are checked on the GPU (bench/gpu_ops.py check_act)."""

from __future__ import annotations

import re

import pytest

from engine.cuda import instances, nvrtc, ops
from engine.cuda.memory import Buffer


class RecordingDevice:
    """Stands in for engine.cuda.device.Device where only the kernel names and grids launched matter."""

    def __init__(self) -> None:
        self.launches: list[tuple[str, tuple[int, int]]] = []

    def kernel(self, name: str) -> str:
        assert name in instances.INSTANCES, f"no instance {name}"
        return name

    def launch(self, kernel: str, grid, block, args) -> None:
        self.launches.append((kernel, grid))


def _launch(mode: str, tokens: int) -> tuple[str, tuple[int, int]]:
    dev = RecordingDevice()
    act = ops.Act(None, None, None, 5120, 5120, 64)
    ops._act_from(dev, mode, ops.ActSrc(), act, tokens)
    (launch,) = dev.launches
    return launch


@pytest.mark.parametrize("mode", instances.ACT_MODES)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_one_group_launches_put_each_token_on_blocks_of_its_own(mode: str, tokens: int) -> None:
    assert _launch(mode, tokens) == (f"act_{mode}_t1", (20, tokens))


@pytest.mark.parametrize("tokens", [1, 5])
def test_counts_left_out_of_the_split_take_the_wide_instance(tokens: int, monkeypatch) -> None:
    monkeypatch.setattr(ops, "ACT_SPLIT_TOKENS", frozenset({5}))
    want = ("act_swiglu_t1", (20, 5)) if tokens == 5 else ("act_swiglu_g1", (20, 1))
    assert _launch("swiglu", tokens) == want


@pytest.mark.parametrize("tokens", [9, 64])
def test_several_groups_take_the_occupancy_instance(tokens: int) -> None:
    assert _launch("rmsnorm", tokens) == ("act_rmsnorm", (20, -(-tokens // 8)))


@pytest.mark.parametrize("mode", [m for m in instances.ACT_MODES if m != "rmsnorm"])
def test_modes_left_out_of_the_switch_take_the_occupancy_instance(mode: str, monkeypatch) -> None:
    monkeypatch.setattr(ops, "ACT_SPLIT_TOKENS", frozenset(range(2, 9)))  # bench variant split2
    monkeypatch.setattr(ops, "ACT_ONE_GROUP_MODES", frozenset({"rmsnorm"}))  # the v15 default, bench variant g1rms
    assert _launch(mode, 1)[0] == f"act_{mode}"
    assert _launch("rmsnorm", 1)[0] == "act_rmsnorm_g1"
    assert _launch(mode, 9)[0] == f"act_{mode}"
    assert _launch(mode, 5)[0] == f"act_{mode}_t1"  # the split does not depend on the one-group switch


def test_instances_carry_their_launch_bound() -> None:
    for i, mode in enumerate(instances.ACT_MODES):
        assert instances.INSTANCES[f"act_{mode}"].expr == f"act_from<{i}, {instances.ACT_MIN_BLOCKS}, 8>"
        assert instances.INSTANCES[f"act_{mode}_g1"].expr == f"act_from<{i}, 1, 8>"
        assert instances.INSTANCES[f"act_{mode}_t1"].expr == f"act_from<{i}, 1, 1>"
    assert re.search(r"__launch_bounds__\(256, MIN_BLOCKS\)\s*act_from", (nvrtc.KERNEL_DIR / "act.cu").read_text())


def test_prefill_rmsnorm_reduces_each_row_once_ahead_of_the_producer() -> None:
    """Several groups: act_row_inv (a block a token) writes each token's 1 / rms, which act_rmsnorm's blocks read
    instead of reducing their 8 rows over the whole width each; one group reduces in the producer itself."""
    class Dev(RecordingDevice):
        def launch(self, kernel, grid, block, args) -> None:
            self.launches.append((kernel, grid, args))

    dev = Dev()
    act = ops.Act(None, None, None, 5120, 5120, 64)
    act.row_inv = Buffer(0x1000, 4 * 64)
    ops._act_from(dev, "rmsnorm", ops.ActSrc(), act, 20)
    (inv_kernel, inv_grid, inv_args), (name, grid, args) = dev.launches
    assert (inv_kernel, inv_grid, name, grid) == ("act_row_inv", (20,), "act_rmsnorm", (20, 3))
    # the producer reads what act_row_inv wrote, passed as a Buffer: Device.launch marshals a Python int as int32
    assert inv_args[1] is act.row_inv and args[6] is act.row_inv
    for mode, tokens in (("rmsnorm", 8), ("swiglu", 20)):
        dev.launches.clear()
        ops._act_from(dev, mode, ops.ActSrc(), act, tokens)
        (launch,) = dev.launches
        assert launch[2][6] is None  # a null pointer: reduced in the producer (or no norm)


def test_a_prefill_for_gemms_alone_writes_no_f16_residue() -> None:
    """Act.gemm_only (every matrix reading it has a prefill GEMM, which reads x16 alone): from gemm.MIN_TOKENS
    tokens its producers get a null act_lo; fewer tokens (mmvq's passes, which multiply hi + lo) or an act some
    matrix reads through mmvq keep it."""
    from engine.cuda import gemm

    class Dev(RecordingDevice):
        def launch(self, kernel, grid, block, args) -> None:
            self.launches.append((kernel, grid, args))

    lo = Buffer(0x2000, 4096)
    for gemm_only, tokens, kept in ((True, gemm.MIN_TOKENS, False), (True, 4096, False),
                                    (True, gemm.MIN_TOKENS - 1, True), (False, 4096, True)):
        dev = Dev()
        act = ops.Act(None, None, None, 5120, 5120, 4096, x16_lo=lo, gemm_only=gemm_only)
        ops._act_from(dev, "swiglu", ops.ActSrc(), act, tokens)
        (launch,) = dev.launches
        assert (launch[2][3] is lo) == kept, (gemm_only, tokens)
