"""Host-side rules of the mixers' output projections in halves (ops.OUT_HALVES: mmvq_i8b walking half-tiles) and of
mmvq_i8b's filled grid (i8b.FILL): the instance, when a launch goes in halves, its grid, what the model hands the
FFN norm. The kernel is checked on the GPU (bench/gpu_kernels.py check_halves on ssm_out and attn_output: the
halves' sum against the whole launch, the norm against numpy's) and in the 27B pass (bench/gpu_bench27b.py variants
outhalves, fill, fillhalves, allhalves: their greedy tokens against v7's)."""

from __future__ import annotations

import re

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import i8b, instances, nvrtc, ops, tma
from tests.kernels.recording import FFN, H
from tests.kernels.recording import RecordingDev as _Dev
from tests.kernels.recording import act as _act
from tests.kernels.recording import buf as _buf
from tests.kernels.recording import ffn_model as _model
from tests.kernels.recording import weight as _weight


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(ops, "OUT_HALVES", True)
    monkeypatch.setattr(ops, "DOWN_HALVES", False)
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(i8b, "ON", True)
    monkeypatch.setattr(i8b, "SHAPE", (3, 2))
    monkeypatch.setattr(i8b, "WARPS", None)
    monkeypatch.setattr(i8b, "PERSIST", True)
    monkeypatch.setattr(i8b, "FILL", False)
    monkeypatch.setattr(i8b, "SPARE_PER_SM", 1)
    monkeypatch.setattr(i8b, "quant_map", lambda w: tma.TensorMap())  # (the driver encodes it on the GPU)


def test_the_instance_walks_half_tiles_in_the_default_shape() -> None:
    assert i8b.DEFAULT_SHAPE in instances.I8B_HALVES_SHAPES
    for s, n in instances.I8B_HALVES_SHAPES:
        assert instances.INSTANCES[f"mmvq_q4_K_i8b_s{s}n{n}_halves"].expr == f"mmvq_i8b<{s}, {n}, true>"
    src = (nvrtc.KERNEL_DIR / "mmvq_i8b.cu").read_text()
    signature = re.search(r"__global__ void __launch_bounds__\([^)]*\)\s*\nmmvq_i8b\(([^)]*)\)", src).group(1)
    assert " ".join(signature.split()).endswith("int rows, int K, float* __restrict__ y2")


def test_off_unless_the_environment_turns_it_on(monkeypatch) -> None:
    monkeypatch.delenv(ops.OUT_HALVES_ENV, raising=False)
    assert not ops._out_halves_default()
    monkeypatch.setenv(ops.OUT_HALVES_ENV, "1")
    assert ops._out_halves_default()
    assert i8b.FILL is False  # the grid's rule by default: every block the same tiles


def test_halves_pay_where_the_whole_grid_leaves_blocks_uneven_work(on) -> None:
    dev = _Dev()
    # 320 tiles: two 70 KB blocks an SM fit, one spared: 160 blocks of 2 tiles; in halves 214 of 3 half-tiles
    assert i8b.grid(dev, 320, 4, i8b.smem_bytes(24, 4, (3, 2))) == 160
    assert i8b.halves_grid(dev, 320, 4, i8b.smem_bytes(24, 4, (3, 2))) == 214
    assert i8b.halves_pay(dev, _weight(Q.Q4_K, H, 6144))  # ssm_out, attn_output
    assert not i8b.halves_pay(dev, _weight(Q.Q4_K, 2 * FFN, H))  # gate | up: 9 tiles a block, 8.5 in halves
    assert not i8b.halves_pay(dev, _weight(Q.Q4_K, 12288, H))  # attn_q: 768 tiles, 3 a block either way
    i8b.SHAPE = (2, 2)  # no instance in halves
    assert not i8b.halves_pay(dev, _weight(Q.Q4_K, H, 6144))


def test_the_halves_grid_is_even_and_within_the_resident_blocks(on) -> None:
    dev, smem = _Dev(), i8b.smem_bytes(24, 4, (3, 2))
    cap = i8b.resident(dev, 4, smem)
    for tiles in (1, 3, 63, 131, 132, 133, 320, 2176):
        blocks = i8b.halves_grid(dev, tiles, 4, smem)
        assert blocks % 2 == 0 and 0 < blocks <= min(cap, 2 * tiles), tiles


def test_the_filled_grid_takes_every_resident_block(on) -> None:
    dev, smem = _Dev(), i8b.smem_bytes(20, 4, (3, 2))
    assert i8b.resident(dev, 4, smem) == 264
    assert i8b.grid(dev, 2176, 4, smem) == 242  # 9 tiles each: 110 SMs stream 18
    i8b.FILL = True
    assert i8b.grid(dev, 2176, 4, smem) == 264  # 64 blocks of 9, 200 of 8
    assert i8b.grid(dev, 63, 4, smem) == 63  # never more blocks than tiles
    assert i8b.halves_grid(dev, 320, 4, i8b.smem_bytes(24, 4, (3, 2))) == 264


def test_a_producer_in_front_counts_as_written(on) -> None:
    """The model asks before the launch's producer runs: its int8 copy is what the launch will read."""
    dev, w, x = _Dev(), _weight(Q.Q4_K, H, 6144), _act(6144, i8_tokens=0)
    gated = ops.gatednorm_of(_buf(), _buf(), _buf(), 128, 6144, 6144, 1e-6)
    assert not ops.splits_in_halves(dev, w, x, 1)  # as is: no int8 copy, the f16 kernels
    assert ops.splits_in_halves(dev, w, x, 1, gated)
    assert x.i8_tokens == 0  # (asked of a copy)
    assert not ops.splits_in_halves(dev, w, _act(6144, i8_tokens=2), 2, gated)  # one token only
    ops.OUT_HALVES = False
    assert not ops.splits_in_halves(dev, w, x, 1, gated)


def test_the_launch_in_halves_names_its_instance_and_both_outputs(on) -> None:
    dev, w, x = _Dev(), _weight(Q.Q4_K, H, 6144), _act(6144, i8_tokens=1)
    y, y2, res = _buf(4 * H), _buf(4 * H), _buf(4 * H)
    ops.matmul(dev, w, x, y, 1, H, residual=res, y2=y2)
    ((name, args),), ((_, grid, block),) = dev.launches, dev.grids
    assert name == "mmvq_q4_K_i8b_s3n2_halves" and grid == 214 and block == 32 * 4
    assert (args[6].ptr, args[8].ptr, args[-1].ptr) == (y.ptr, res.ptr, y2.ptr)


def test_a_launch_in_halves_launches_its_producer_first(on) -> None:
    dev, w, x = _Dev(), _weight(Q.Q4_K, H, 6144), _act(6144, i8_tokens=0)
    gated = ops.gatednorm_of(_buf(), _buf(), _buf(), 128, 6144, 6144, 1e-6)
    ops.matmul(dev, w, x, _buf(4 * H), 1, H, residual=_buf(4 * H), producer=gated, y2=_buf(4 * H))
    assert [name for name, _ in dev.launches] == ["act_gatednorm_t1" if 1 in ops.ACT_SPLIT_TOKENS
                                                  else "act_gatednorm", "mmvq_q4_K_i8b_s3n2_halves"]


def test_the_mixer_hands_its_halves_to_the_ffn_norm(on) -> None:
    model, lw = _model()
    model.ws.x_halves = (_buf(4 * H), _buf(4 * H))
    half0, half1 = model.ws.x_halves
    gated = ops.gatednorm_of(_buf(), _buf(), _buf(), 128, 6144, 6144, 1e-6)
    got = model._out(lw, model.ws.act_inner, 1, gated, may_halve=True)
    name, args = model.dev.launches[-1]
    assert got == model.ws.x_halves and name == "mmvq_q4_K_i8b_s3n2_halves"
    assert (args[6].ptr, args[8].ptr, args[-1].ptr) == (half0.ptr, model.ws.x.ptr, half1.ptr)
    model.dev.launches.clear()
    model._ffn(lw, 1, add=got)  # the FFN norm: the sum of both halves, stored into x
    norm = [args for name, args in model.dev.launches if name.startswith("act_rmsnorm")]
    assert norm and (norm[0][0].x, norm[0][0].x2, norm[0][0].x_sum) == (half0.ptr, half1.ptr, model.ws.x.ptr)


@pytest.mark.parametrize("num_tokens, may_halve", [(1, False), (2, True)])
def test_otherwise_the_mixer_adds_into_x_whole(on, num_tokens: int, may_halve: bool) -> None:
    model, lw = _model()
    model.ws.x_halves = (_buf(4 * H), _buf(4 * H))
    model.ws.act_inner.i8_tokens = num_tokens
    assert model._out(lw, model.ws.act_inner, num_tokens, None, may_halve) is None
    name, args = model.dev.launches[-1]
    assert not name.endswith("_halves") and model.ws.x.ptr in [getattr(a, "ptr", None) for a in args]


def test_a_narrow_matrix_off_mmvq_i8b_stays_whole_with_both_kinds_on(on) -> None:
    """ffn_down's halves are for rows of WIDE_COLS or more: with both switches on, ssm_out on mmvq_i8 (i8b off)
    is not split."""
    ops.DOWN_HALVES, i8b.ON = True, False
    assert not ops.splits_in_halves(_Dev(), _weight(Q.Q4_K, H, 6144), _act(6144, i8_tokens=1), 1)
    assert ops.splits_in_halves(_Dev(), _weight(Q.Q4_K, H, FFN), _act(FFN, i8_tokens=1), 1)  # ffn_down is
