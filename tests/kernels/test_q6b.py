"""Host-side rules of the tensor-copy int8 Q6_K matmul of one token and of its verify form of 2-8 tokens
(kernels/mmvq_i8q6b.cu, engine/cuda/q6b.py): when a Q6_K launch takes them, the shared memory and grid their
launchers ask for against the kernel's layout, the tensor maps, the instances. The kernels are checked on the GPU
(bench/gpu_kernels.py Q6B_CHECKS against the float64 reference and mmvq_q6_i8, check_halves in both shapes;
Q6V_CHECK_TOKENS' halves against mmvq_q6_i8 and the f16 kernels) and in the 27B pass (bench variants q6b,
q6bhalves, q6bdown, q6v, q6v5: their greedy tokens against v7's)."""

from __future__ import annotations

import re

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import i8b, instances, nvrtc, ops, q6b, tma
from tests.kernels import ptxas
from tests.kernels.recording import FFN, H
from tests.kernels.recording import RecordingDev as _Dev
from tests.kernels.recording import act as _act
from tests.kernels.recording import buf as _buf
from tests.kernels.recording import weight as _weight


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(q6b, "ON", True)
    monkeypatch.setattr(q6b, "FORCED", False)
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


def test_off_on_the_h200_where_it_measured_slower_unless_forced(on, monkeypatch) -> None:
    monkeypatch.delenv(q6b.ENV, raising=False)
    assert q6b._forced() is False
    monkeypatch.setenv(q6b.ENV, "1")
    assert q6b._forced() is True
    h200, h100, down = _Dev(90), _Dev(90), _weight(Q.Q6_K, H, FFN)
    h200.info.name = "NVIDIA H200"
    assert q6b.runs(h100, down, 1) and not q6b.runs(h200, down, 1)
    x = _act(FFN, i8_tokens=1)
    ops.matmul(h200, down, x, _buf(4 * H), 1, H)  # the cp.async int8 kernel instead
    assert [name for name, _ in h200.launches] == ["mmvq_q6_K_i8_t1"]
    q6b.FORCED = True
    assert q6b.runs(h200, down, 1)
    q6b.ON = False  # OPENJET_CUDA_Q6B=0 (or the bench's noq6b): off everywhere
    assert not q6b.runs(h200, down, 1) and not q6b.runs(h100, down, 1)


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
        if "_i8v_" in name:  # (the verify form's: test_the_verify_instances_fit_...)
            continue
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


def test_more_tokens_or_the_switch_off_keep_mmvq_q6_i8(on) -> None:
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


# ---- the verify rows: 2-8 tokens (mmvq_q6_i8v) ----


def test_the_verify_form_is_off_unless_the_environment_turns_it_on(monkeypatch) -> None:
    monkeypatch.delenv(q6b.VERIFY_ENV, raising=False)
    assert q6b._verify_default() == frozenset()
    monkeypatch.setenv(q6b.VERIFY_ENV, "1")
    assert q6b._verify_default() == frozenset(range(2, 9)) == frozenset(instances.Q6V_TOKENS)


@pytest.fixture
def verify_on(on, monkeypatch):
    monkeypatch.setattr(q6b, "VERIFY_AT", frozenset(instances.Q6V_TOKENS))
    monkeypatch.setattr(q6b, "WARPS", q6b.DEFAULT_WARPS)
    monkeypatch.setattr(q6b, "MIN_COLS", q6b.DEFAULT_MIN_COLS)
    monkeypatch.setattr(ops, "VERIFY_HALVES_AT", frozenset())
    return on


def test_the_verify_form_takes_ffn_downs_q6k_rows_of_its_counts_with_their_int8_copy(verify_on) -> None:
    dev, down = _Dev(90), _weight(Q.Q6_K, H, FFN)
    for t in range(2, 9):
        assert q6b.verify_runs(dev, down, t, _act(FFN, i8_tokens=t))
    x5 = _act(FFN, i8_tokens=5)
    assert not q6b.verify_runs(dev, down, 1, x5)  # the one-token form's count
    assert not q6b.verify_runs(dev, down, 5, _act(FFN, i8_tokens=4))  # no int8 copy of 5 tokens
    assert not q6b.verify_runs(_Dev(89), down, 5, x5)  # no tensor copies before Hopper
    assert not q6b.verify_runs(dev, _weight(Q.Q4_K, H, FFN), 5, x5)  # (Q4_K's: mmvq_i8v)
    assert not q6b.verify_runs(dev, _weight(Q.Q6_K, 1024, H), 5, _act(H, i8_tokens=5))  # attn_v
    q6b.VERIFY_AT = frozenset({5})
    assert q6b.verify_runs(dev, down, 5, x5) and not q6b.verify_runs(dev, down, 4, _act(FFN, i8_tokens=4))


def test_the_verify_forms_shared_memory_mirrors_the_kernel_and_sheds_warps_to_fit(verify_on) -> None:
    for nb, t in ((1, 2), (3, 5), (34, 5), (34, 8)):  # 2T levels at a 64-byte-skewed pitch, 8 bytes a (sb, token)
        need = 2 * t * (256 * nb + 64) + 8 * t * nb
        assert q6b.verify_x_bytes(nb, t) % 1024 == 0 and need <= q6b.verify_x_bytes(nb, t) < need + 1024
    ring = 2 * 2 * 3392  # a warp's (2, 2) ring of ql', qh' and words
    assert q6b.verify_smem_bytes(68, 5, 8) == 1024 + q6b.verify_x_bytes(34, 5) + 8 * ring
    assert q6b.verify_smem_bytes(67, 5, 8) == 1024 + q6b.verify_x_bytes(34, 5) + 8 * ring  # the larger half
    dev, down = _Dev(90), _weight(Q.Q6_K, H, FFN)
    assert q6b.verify_warps(dev, down, 5) == 8  # 194 KB + 12 KB static of 227 KB
    eight = q6b.verify_warps(dev, down, 8)  # 140 KB of staged rows: fewer rings fit
    assert eight == 5 and q6b.verify_smem_bytes(68, 8, eight) + q6b.verify_static_smem(8) <= 232448 < \
        q6b.verify_smem_bytes(68, 8, eight + 1) + q6b.verify_static_smem(8)
    dev.info.max_smem_per_block = 101376  # sm_86's: not even one warp's
    assert q6b.verify_warps(dev, down, 8) == 0 and not q6b.verify_runs(dev, down, 8, _act(FFN, i8_tokens=8))


def test_a_verify_ffn_down_of_q6k_goes_in_halves_on_the_verify_form(verify_on) -> None:
    dev, down, x = _Dev(90), _weight(Q.Q6_K, H, FFN), _act(FFN, i8_tokens=5)
    assert ops.splits_in_halves(dev, down, x, 5)
    y, y2, res = _buf(4 * 5 * H), _buf(4 * 5 * H), _buf(4 * 5 * H)
    ops.matmul(dev, down, x, y, 5, H, residual=res, y2=y2)
    ((name, args),), ((_, grid, block),) = dev.launches, dev.grids
    assert name == "mmvq_q6_K_i8v_t5_halves" and block == 32 * 8
    assert [a.ptr for a in args[2:6]] == [down.buf.ptr, x.q8.ptr, x.scale8.ptr, y.ptr]
    assert args[6] is None and args[7].ptr == res.ptr and args[8:11] == [H, FFN, H] and args[11].ptr == y2.ptr
    smem = q6b.verify_smem_bytes(68, 5, 8)
    assert grid % 2 == 0 and grid == i8b.halves_grid(dev, 320, 8, smem, q6b.verify_static_smem(5), 0)
    q6b.VERIFY_AT = frozenset()  # off: not in halves (the f16 kernels take 5 tokens whole)
    assert not ops.splits_in_halves(dev, down, x, 5)


def test_the_int8_copy_of_ffn_downs_input_is_written_at_the_verify_forms_counts(verify_on) -> None:
    dev, x = _Dev(90), _act(FFN, i8_tokens=0)
    q6b.VERIFY_AT = frozenset({7})
    assert ops._i8_copy_tokens(dev, x) >= 7
    q6b.VERIFY_AT = frozenset()
    assert ops._i8_copy_tokens(dev, x) < 7  # (wider than mmvq_i8v takes whole, and no halves asked for)


def test_the_verify_instances_fit_their_registers_and_static_memory() -> None:
    assert instances.Q6V_SHAPE in instances.Q6B_SHAPES
    for t in instances.Q6V_TOKENS:
        s, n = instances.Q6V_SHAPE
        assert instances.INSTANCES[f"mmvq_q6_K_i8v_t{t}_halves"].expr == f"mmvq_q6_i8v<{t}, {s}, {n}, true>"
    for name, use in ptxas.usage("mmvq_i8q6b").items():
        if "_i8v_" in name:
            t = int(re.search(r"_t(\d)_", name).group(1))
            assert use.spill_bytes == 0, name
            assert use.registers * 32 * q6b.MAX_WARPS <= 65536, name  # a block of 8 warps an SM by registers
            assert use.static_smem + 1024 <= q6b.verify_static_smem(t), name
