"""Host-side rules of the tensor-copy int8 Q6_K matmul of one token (kernels/mmvq_i8q6b.cu, engine/cuda/q6b.py):
when a Q6_K launch takes it, the shared memory and grid its launcher asks for against the kernel's layout, its
tensor maps, its instances. The kernel is checked on the GPU (bench/gpu_kernels.py Q6B_CHECKS against the float64
reference and mmvq_q6_i8, check_halves in both shapes) and in the 27B pass (bench variants q6b, q6bhalves,
q6bdown: their greedy tokens against v7's)."""

from __future__ import annotations

import re

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import i8b, instances, nvrtc, ops, q6b, tma
from tests.kernels import ptxas
from tests.kernels.test_close import FFN, H, _act, _buf, _Dev, _weight


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(q6b, "ON", True)
    monkeypatch.setattr(q6b, "SHAPE", q6b.DEFAULT_SHAPE)
    monkeypatch.setattr(q6b, "WARPS", 4)
    monkeypatch.setattr(q6b, "HALVES", False)
    monkeypatch.setattr(q6b, "MIN_COLS", 0)
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "Q6_I8", True)
    monkeypatch.setattr(ops, "DOWN_HALVES", False)
    monkeypatch.setattr(ops, "OUT_HALVES", False)
    monkeypatch.setattr(i8b, "FILL", False)
    maps = []

    def encode(ptr, dtype, dims, strides, box, swizzle):
        maps.append((ptr, dtype, dims, strides, box, swizzle))
        return tma.TensorMap()

    monkeypatch.setattr(tma, "encode", encode)  # (the driver encodes them on the GPU)
    return maps


def test_on_unless_the_environment_turns_it_off(monkeypatch) -> None:
    monkeypatch.delenv(q6b.ENV, raising=False)
    assert q6b._default() is True
    monkeypatch.setenv(q6b.ENV, "0")
    assert q6b._default() is False
    monkeypatch.setenv(q6b.ENV, "sure")
    with pytest.raises(ValueError, match=q6b.ENV):
        q6b._default()


def test_taken_for_one_q6k_token_on_sm90_only(on) -> None:
    down = _weight(Q.Q6_K, H, FFN)
    assert q6b.runs(_Dev(90), down, 1) and q6b.runs(_Dev(90), down, 1, halves=True)
    assert not q6b.runs(_Dev(89), down, 1)  # no tensor copies before Hopper
    assert not q6b.runs(_Dev(90), down, 2)  # the one-token form only
    assert not q6b.runs(_Dev(90), _weight(Q.Q4_K, H, FFN), 1)
    q6b.MIN_COLS = FFN
    assert not q6b.runs(_Dev(90), _weight(Q.Q6_K, 1024, H), 1) and q6b.runs(_Dev(90), down, 1)
    q6b.ON = False
    assert not q6b.runs(_Dev(90), down, 1)


def test_the_launcher_mirrors_the_kernels_layout() -> None:
    src = (nvrtc.KERNEL_DIR / "mmvq_i8q6b.cu").read_text()
    defines = dict(re.findall(r"#define (\w+) (\d+)", src))
    assert (int(defines["Q6B_QL_BYTES"]), int(defines["Q6B_QH_BYTES"]), int(defines["Q6B_WORD_BYTES"])) == (
        q6b.QL_BYTES, q6b.QH_BYTES, q6b.WORD_BYTES)
    assert q6b.QL_BYTES == 16 * 128 and q6b.QH_BYTES == 16 * 64 and q6b.WORD_BYTES == 16 * 16 + 16 * 4
    assert int(defines["Q6B_MAX_WARPS"]) == q6b.MAX_WARPS
    for nb in (1, 3, 20, 34, 68):  # hi level, lo level 64 bytes on, a 16-byte scale pair a superblock, in KB
        assert q6b.x_bytes(nb) % 1024 == 0 and q6b.x_bytes(nb) >= 528 * nb + 64 > q6b.x_bytes(nb) - 1024
    assert q6b.smem_bytes(68, 4, (2, 2)) == 1024 + q6b.x_bytes(68) + 4 * 2 * 2 * 3392
    assert q6b.smem_bytes(68, 4, (2, 2), halves=True) == 1024 + q6b.x_bytes(34) + 4 * 2 * 2 * 3392
    assert q6b.smem_bytes(3, 1, (3, 2), halves=True) == 1024 + q6b.x_bytes(2) + 2 * 3 * 3392  # the larger half


def test_every_shape_has_its_instances_and_each_fits_its_registers_and_static_memory() -> None:
    for s, n in instances.Q6B_SHAPES:
        assert instances.INSTANCES[f"mmvq_q6_K_i8b_s{s}n{n}"].expr == f"mmvq_q6_i8b<{s}, {n}, false>"
        assert instances.INSTANCES[f"mmvq_q6_K_i8b_s{s}n{n}_halves"].expr == f"mmvq_q6_i8b<{s}, {n}, true>"
    assert q6b.DEFAULT_SHAPE in instances.Q6B_SHAPES
    for name, use in ptxas.usage("mmvq_i8q6b").items():
        assert use.spill_bytes == 0, name
        assert use.registers * 32 * q6b.DEFAULT_WARPS * 2 <= 65536, name  # two blocks an SM by registers
        assert use.static_smem + 1024 <= q6b.STATIC_SMEM, name


def test_a_one_token_q6k_launch_takes_it_whole_on_the_walking_grid(on) -> None:
    dev, down, x = _Dev(), _weight(Q.Q6_K, H, FFN), _act(FFN, i8_tokens=1)
    y, res = _buf(4 * H), _buf(4 * H)
    ops.matmul(dev, down, x, y, 1, H, residual=res)
    ((name, args),), ((_, grid, block),) = dev.launches, dev.grids
    smem = q6b.smem_bytes(68, 4, (2, 2))
    assert name == "mmvq_q6_K_i8b_s2n2" and block == 32 * 4
    # two blocks an SM fit, none spared: 264 resident, and 2 tiles a block on 160 of them
    assert grid == i8b.grid(dev, 320, 4, smem, q6b.STATIC_SMEM, 0) == 160
    assert [a.ptr for a in args[2:6]] == [down.buf.ptr, x.q8.ptr, x.scale8.ptr, y.ptr]
    assert args[6] is None and args[7].ptr == res.ptr and args[8:10] == [H, FFN] and args[10] is None


def test_the_tensor_maps_cover_the_ql_and_qh_planes(on) -> None:
    down = _weight(Q.Q6_K, H, FFN)
    q6b.plane_maps(down)
    (ql_ptr, _, ql_dims, ql_strides, ql_box, ql_swz), (qh_ptr, _, qh_dims, qh_strides, qh_box, qh_swz) = on
    assert (ql_ptr, ql_dims, ql_strides, ql_box, ql_swz) == (down.buf.ptr, (68 * 128, H), (68 * 128,), (128, 16), 128)
    # qh' after ql' (repack.PLANES: 128 bytes a block first), a box as wide as its 64-byte swizzle
    assert (qh_ptr, qh_dims, qh_strides, qh_box, qh_swz) == (down.buf.ptr + 68 * 128 * H, (68 * 64, H), (68 * 64,),
                                                             (64, 16), 64)
    assert all(s % 16 == 0 for s in ql_strides + qh_strides) and qh_ptr % 16 == 0


def test_in_halves_it_walks_half_tiles_with_the_second_halfs_sums_in_y2(on) -> None:
    ops.DOWN_HALVES = True
    dev, down, x = _Dev(), _weight(Q.Q6_K, H, FFN), _act(FFN, i8_tokens=1)
    assert ops.splits_in_halves(dev, down, x, 1)
    y, y2 = _buf(4 * H), _buf(4 * H)
    ops.matmul(dev, down, x, y, 1, H, residual=_buf(4 * H), y2=y2)
    ((name, args),), ((_, grid, _),) = dev.launches, dev.grids
    assert name == "mmvq_q6_K_i8b_s2n2_halves" and args[-1].ptr == y2.ptr
    assert grid % 2 == 0 and grid == i8b.halves_grid(dev, 320, 4, q6b.smem_bytes(68, 4, (2, 2), True),
                                                     q6b.STATIC_SMEM, 0)


def test_more_tokens_a_closer_or_the_switch_off_keep_mmvq_q6_i8(on) -> None:
    dev, down = _Dev(), _weight(Q.Q6_K, H, FFN)
    ops.matmul(dev, down, _act(FFN, i8_tokens=2), _buf(8 * H), 2, H)
    q6b.ON = False
    ops.matmul(dev, down, _act(FFN, i8_tokens=1), _buf(4 * H), 1, H)
    assert [name for name, _ in dev.launches] == ["mmvq_q6_K_i8_t2", "mmvq_q6_K_i8_t1"]


def test_by_default_ffn_downs_q6k_launch_alone_goes_in_halves_on_a_block_an_sm(on) -> None:
    assert q6b.DEFAULT_MIN_COLS == ops.WIDE_COLS  # (q6b cannot import ops: ops imports it)
    q6b.WARPS, q6b.HALVES, q6b.MIN_COLS = q6b.DEFAULT_WARPS, q6b.DEFAULT_HALVES, q6b.DEFAULT_MIN_COLS
    dev, x1 = _Dev(), _act(FFN, i8_tokens=1)
    down = _weight(Q.Q6_K, H, FFN)
    assert ops.splits_in_halves(dev, down, x1, 1)  # with ops.DOWN_HALVES off
    assert not ops.splits_in_halves(dev, _weight(Q.Q4_K, H, FFN), x1, 1)  # the Q4_K ffn_downs stay whole
    assert not ops.splits_in_halves(dev, down, _act(FFN, i8_tokens=2), 2)  # one token only
    ops.matmul(dev, down, x1, _buf(4 * H), 1, H, residual=_buf(4 * H), y2=_buf(4 * H))
    ops.matmul(dev, _weight(Q.Q6_K, 1024, H), _act(H, i8_tokens=1), _buf(4 * 1024), 1, 1024)  # attn_v
    assert [name for name, _ in dev.launches] == ["mmvq_q6_K_i8b_s2n2_halves", "mmvq_q6_K_i8_t1"]
    (_, grid, block) = dev.grids[0]
    assert (grid, block) == (128, 32 * 8)  # 640 half-tiles, 5 a block: no SM more than 5
