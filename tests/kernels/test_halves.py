"""Host-side rules of ffn_down in halves (ops.DOWN_HALVES): the instances, when a launch goes in two blocks a tile,
and the input norm that adds the halves (ops.rmsnorm_of add=). The kernels and the norm are checked on the GPU
(bench/gpu_kernels.py check_halves: the halves' sum against the whole launch, the norm against numpy's) and in
the 27B pass (bench/gpu_bench27b.py variant halves: its greedy tokens against v7's)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import i8b, instances, nvrtc, ops, q6b, tma
from engine.cuda.device import Buffer


def _dev():
    return SimpleNamespace(info=SimpleNamespace(name="NVIDIA H100 80GB HBM3",
                                                arch=90, max_smem_per_block=232448, multiprocessors=132))


def _weight(qtype: Q, cols: int = 17408) -> ops.DeviceWeight:
    return ops.DeviceWeight(None, qtype, 5120, cols)


def _act(cols: int = 17408, i8_tokens: int = 1) -> ops.Act:
    return ops.Act(None, None, None, cols, cols, 8, i8_tokens=i8_tokens)


def _buf(ptr: int) -> Buffer:
    return Buffer(ptr, 4 * 5120)


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(ops, "DOWN_HALVES", True)
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "I8_TOKENS", 4)
    monkeypatch.setattr(ops, "I8_TILES", 1)
    monkeypatch.setattr(ops, "Q6_I8", True)
    monkeypatch.setattr(ops, "Q6_I8_COUNTS", frozenset({1, 2, 3, 4}))
    monkeypatch.setattr(i8b, "ON", True)
    monkeypatch.setattr(i8b, "MAX_SUPERBLOCKS", 24)  # ffn_down's 68 stay on mmvq_i8
    monkeypatch.setattr(q6b, "ON", False)  # the Q6_K ones on mmvq_q6_i8 (q6b's halves: test_q6b.py)
    monkeypatch.setattr(ops, "VERIFY_HALVES_AT", frozenset())  # nor mmvq_i8v's (test_i8b.py)


def test_the_instances_are_the_int8_kernels_with_halves_on_at_every_count_of_mmvq_i8() -> None:
    stages = instances.ACT_STAGES
    assert instances.HALVES_TOKENS == tuple(range(1, instances.I8_MAX_TOKENS + 1))
    for t in instances.HALVES_TOKENS:
        assert instances.INSTANCES[f"mmvq_q4_K_i8_t{t}_halves"].expr == f"mmvq_i8<{t}, {stages}, 1, true>"
        assert instances.INSTANCES[f"mmvq_q6_K_i8_t{t}_halves"].expr == f"mmvq_q6_i8<{t}, {stages}, true>"
    assert ops.HALVES_AT == frozenset(instances.HALVES_TOKENS)


def test_both_kernels_take_the_second_output_last() -> None:
    """The launchers append y2 after ldy: every instance of both kernels takes it last."""
    for name in ("mmvq_i8.cu", "mmvq_i8q6.cu"):
        src = (nvrtc.KERNEL_DIR / name).read_text()
        signature = re.search(r"__global__ void __launch_bounds__\([^)]*\)\s*\n\w+\(([^)]*)\)", src).group(1)
        assert " ".join(signature.split()).endswith("int ldy, float* __restrict__ y2"), name


def test_off_unless_the_environment_turns_it_on(monkeypatch) -> None:
    monkeypatch.delenv(ops.DOWN_HALVES_ENV, raising=False)
    assert not ops._down_halves_default()
    monkeypatch.setenv(ops.DOWN_HALVES_ENV, "1")
    assert ops._down_halves_default()
    monkeypatch.setenv(ops.DOWN_HALVES_ENV, "yes")
    with pytest.raises(ValueError, match=ops.DOWN_HALVES_ENV):
        ops._down_halves_default()


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_ffn_down_at_one_token_goes_in_halves(on, qtype: Q) -> None:
    assert ops.splits_in_halves(_dev(), _weight(qtype), _act(), 1)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_so_do_the_launches_of_2_to_4_tokens_on_the_int8_kernels(on, qtype: Q) -> None:
    for t in (2, 3, 4):
        assert ops.splits_in_halves(_dev(), _weight(qtype), _act(i8_tokens=t), t)
    assert not ops.splits_in_halves(_dev(), _weight(qtype), _act(i8_tokens=5), 5)  # 5: on the f16 kernels


def test_five_tokens_where_both_int8_kernels_take_them(on, monkeypatch) -> None:
    monkeypatch.setattr(ops, "I8_TOKENS", 5)
    monkeypatch.setattr(ops, "Q6_I8_COUNTS", frozenset(range(1, 6)))
    for qtype in (Q.Q4_K, Q.Q6_K):
        assert ops.splits_in_halves(_dev(), _weight(qtype), _act(i8_tokens=5), 5)
    monkeypatch.setattr(ops, "HALVES_AT", frozenset({1}))
    assert not ops.splits_in_halves(_dev(), _weight(Q.Q4_K), _act(i8_tokens=5), 5)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_not_on_narrower_rows(on, qtype: Q) -> None:
    assert not ops.splits_in_halves(_dev(), _weight(qtype, cols=6144), _act(6144), 1)  # attn_output
    assert not ops.splits_in_halves(_dev(), _weight(qtype, cols=6144), _act(6144, i8_tokens=2), 2)


def test_not_off_the_int8_kernels(on, monkeypatch) -> None:
    monkeypatch.setattr(ops, "I8_TILES", 2)  # blocks of several tiles: no halves instance
    assert not ops.splits_in_halves(_dev(), _weight(Q.Q4_K), _act(), 1)
    monkeypatch.setattr(ops, "I8_TILES", 1)
    monkeypatch.setattr(i8b, "MAX_SUPERBLOCKS", None)  # ffn_down on mmvq_i8b
    assert not ops.splits_in_halves(_dev(), _weight(Q.Q4_K), _act(), 1)
    assert not ops.splits_in_halves(_dev(), _weight(Q.Q4_K), _act(i8_tokens=0), 1)  # no int8 copy: f16 kernels
    monkeypatch.setattr(ops, "DOWN_HALVES", False)
    assert not ops.splits_in_halves(_dev(), _weight(Q.Q6_K), _act(), 1)


def test_the_norm_of_two_halves_reads_both_and_stores_their_sum_apart() -> None:
    x, a, b, w = _buf(0x1000), _buf(0x2000), _buf(0x3000), _buf(0x4000)
    src = ops.rmsnorm_of(x, w, 5120, 1e-6, add=(a, b)).src
    assert (src.x, src.x2, src.x_sum, src.w, src.ldx, src.ldx2) == (a.ptr, b.ptr, x.ptr, w.ptr, 5120, 5120)
    plain = ops.rmsnorm_of(x, w, 5120, 1e-6).src
    assert (plain.x, plain.x2, plain.x_sum) == (x.ptr, 0, 0)
    with pytest.raises(AssertionError):  # each block reads the whole rows: the sum must not overwrite one
        ops.rmsnorm_of(a, w, 5120, 1e-6, add=(a, b))


def test_the_launch_keeps_the_sum_where_it_fills_in_the_rows_stride() -> None:
    """produce() sets out32's row stride to the act's where the caller gave none: the sum's row must survive it."""
    from tests.kernels.recording import RecordingDev as _Dev
    from tests.kernels.recording import act as _act

    dev, act, x, xn = _Dev(), _act(5120), _buf(0x1000), _buf(0x7000)
    ops.produce(dev, ops.rmsnorm_of(x, _buf(0x4000), 5120, 1e-6, out32=xn, add=(_buf(0x2000), _buf(0x3000))), act, 1)
    ((_, args),) = dev.launches
    assert (args[0].x_sum, args[0].out32, args[0].ld_out32) == (x.ptr, xn.ptr, act.ld)


def test_the_act_kernel_stores_the_sum_only_for_rmsnorm() -> None:
    """act_from adds x2 to an RMSNorm's rows (SwiGLU and the gated norm read x2 as their second input)."""
    src = (nvrtc.KERNEL_DIR / "act.cu").read_text()
    assert "if (MODE == ACT_RMSNORM && a.x2 && ok)" in src and "a.x_sum[(i64)t * a.ldx + k] = x;" in src


def _ffn_in_halves(monkeypatch, qtype: Q, num_tokens: int, may_halve: bool):
    """The recording model of tests/kernels/recording.py: (what _ffn returns, the ffn_down launch)."""
    from tests.kernels.recording import ffn_model as _model

    monkeypatch.setattr(i8b, "PERSIST", False)  # gate | up a block a tile: no occupancy to ask a driver for
    monkeypatch.setattr(i8b, "quant_map", lambda w: tma.TensorMap())  # (the driver encodes it on the GPU)
    model, lw = _model(qtype)
    model.ws.x_halves = (_buf(0x5000), _buf(0x6000))
    got = model._ffn(lw, num_tokens, may_halve=may_halve)
    (name, args), (_, grid, _) = model.dev.launches[-1], model.dev.grids[-1]
    return model, got, name, args, grid


@pytest.mark.parametrize("qtype, name", [(Q.Q4_K, "mmvq_q4_K_i8_t1_halves"), (Q.Q6_K, "mmvq_q6_K_i8_t1_halves")])
def test_the_ffn_launches_ffn_down_in_halves_and_hands_them_on(on, monkeypatch, qtype: Q, name: str) -> None:
    model, got, launched, args, grid = _ffn_in_halves(monkeypatch, qtype, 1, may_halve=True)
    half0, half1 = model.ws.x_halves
    assert got == model.ws.x_halves and launched == name and grid == 2 * 5120 // 16
    y_at, residual_at = (5, 7) if qtype == Q.Q4_K else (3, 5)  # (q8, scale8, sums, sums_lo for Q4_K)
    assert [args[y_at].ptr, args[residual_at].ptr, args[-1].ptr] == [half0.ptr, model.ws.x.ptr, half1.ptr]


def test_two_tokens_go_in_halves_too(on, monkeypatch) -> None:
    model, got, launched, args, grid = _ffn_in_halves(monkeypatch, Q.Q4_K, 2, may_halve=True)
    assert got == model.ws.x_halves and launched == "mmvq_q4_K_i8_t2_halves" and grid == 2 * 5120 // 16


@pytest.mark.parametrize("num_tokens, may_halve, i8_tokens", [(1, False, 4), (2, True, 1)])
def test_otherwise_ffn_down_adds_into_x_whole(on, monkeypatch, num_tokens: int, may_halve: bool,
                                              i8_tokens: int) -> None:
    monkeypatch.setattr(ops, "I8_TOKENS", i8_tokens)  # 1: the 2-token launch on the f16 kernels
    model, got, launched, args, grid = _ffn_in_halves(monkeypatch, Q.Q4_K, num_tokens, may_halve)
    assert got is None and not launched.endswith("_halves") and model.ws.x.ptr in [getattr(a, "ptr", None) for a in args]
