"""Host-side rules of the tensor-copy int8 Q4_K matmuls (kernels/mmvq_i8b.cu one token, mmvq_i8v.cu 2-8 tokens,
engine/cuda/i8b.py): when a matmul takes them, the shared memory their launchers ask for against the kernels'
layouts, and their instances. The kernels are checked on the GPU (bench/gpu_kernels.py I8B_CHECKS and I8V_CHECKS:
against the float64 reference and the kernels they replace)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import i8b, instances, nvrtc, ops
from tests.kernels import ptxas


def _dev(arch: int, smem: int = 232448):
    return SimpleNamespace(info=SimpleNamespace(name="NVIDIA H100 80GB HBM3",
                                                arch=arch, max_smem_per_block=smem, multiprocessors=132))


def _weight(qtype: Q = Q.Q4_K, cols: int = 5120) -> ops.DeviceWeight:
    return ops.DeviceWeight(None, qtype, 10240, cols)


def _act(i8_tokens: int) -> ops.Act:
    return ops.Act(None, None, None, 5120, 5120, 8, i8_tokens=i8_tokens)


def test_taken_only_when_on_for_one_q4k_token_on_sm90(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "ON", True)
    monkeypatch.setattr(i8b, "MAX_SUPERBLOCKS", None)
    assert i8b.runs(_dev(90), _weight(), 1, _act(1))
    assert not i8b.runs(_dev(89), _weight(), 1, _act(1))  # no tensor copies before Hopper
    assert not i8b.runs(_dev(90), _weight(), 2, _act(2))  # the one-token form only
    assert not i8b.runs(_dev(90), _weight(Q.Q6_K), 1, _act(1))
    assert not i8b.runs(_dev(90), _weight(), 1, _act(0))  # no int8 copy written
    assert not i8b.runs(_dev(90, smem=48 * 1024), _weight(cols=17408), 1, _act(1))  # does not fit
    monkeypatch.setattr(i8b, "ON", False)
    assert not i8b.runs(_dev(90), _weight(), 1, _act(1))


@pytest.mark.parametrize("env, default, on", [(i8b.ENV, i8b._default, True)])
def test_defaults_and_the_switch_is_checked(monkeypatch, env: str, default, on: bool) -> None:
    monkeypatch.delenv(env, raising=False)
    assert default() is on
    monkeypatch.setenv(env, "0")
    assert default() is False
    monkeypatch.setenv(env, "1")
    assert default() is True
    monkeypatch.setenv(env, "yes please")
    with pytest.raises(ValueError, match=env):
        default()


def test_the_launcher_mirrors_the_kernels_layout() -> None:
    src = (nvrtc.KERNEL_DIR / "mmvq_i8b.cu").read_text() + (nvrtc.KERNEL_DIR / "tma.cuh").read_text()
    defines = dict(re.findall(r"#define (\w+) (\d+)", src))
    assert int(defines["I8B_QUANT_BYTES"]) == i8b.QUANT_BYTES
    assert int(defines["I8B_MAX_WARPS"]) == i8b.MAX_WARPS >= ops.MMVQ_WARPS
    # hi level, lo level 64 bytes on, 16-byte scale pairs and two 16-byte sums records a superblock, in KB
    for nb in (1, 20, 24, 68):
        assert i8b.x_bytes(nb) % 1024 == 0 and i8b.x_bytes(nb) >= 560 * nb + 64 > i8b.x_bytes(nb) - 1024
    assert i8b.smem_bytes(20, 5, (2, 3)) == 1024 + i8b.x_bytes(20) + 5 * 3 * 2 * (2048 + 256)


def test_every_shape_has_an_instance() -> None:
    for s, n in instances.I8B_SHAPES:
        assert instances.INSTANCES[f"mmvq_q4_K_i8b_s{s}n{n}"].expr == f"mmvq_i8b<{s}, {n}>"
    assert i8b.SHAPE in instances.I8B_SHAPES


class _Buf:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def test_a_spare_block_an_sm_shrinks_the_walking_grid(monkeypatch) -> None:
    dev, smem = _dev(90), i8b.smem_bytes(20, 5, (2, 2))  # 3 blocks of 5 warps an SM
    monkeypatch.setattr(i8b, "PERSIST", True)
    monkeypatch.setattr(i8b, "SPARE_PER_SM", 1)
    assert i8b.grid(dev, 2176, 5, smem) == 242  # 2 an SM: 264 resident, 9 tiles each (the last block 7)


def test_grid_one_block_a_tile_or_equal_tiles_a_resident_block(monkeypatch) -> None:
    dev, smem = _dev(90), i8b.smem_bytes(20, 5, (2, 2))  # 59 KB: 3 blocks of 5 warps an SM
    monkeypatch.setattr(i8b, "SPARE_PER_SM", 0)
    monkeypatch.setattr(i8b, "PERSIST", False)
    assert i8b.grid(dev, 2176, 5, smem) == 2176
    monkeypatch.setattr(i8b, "PERSIST", True)
    assert i8b.grid(dev, 2176, 5, smem) == 363  # 6 tiles each (396 resident would leave some 5, some 6)
    assert i8b.grid(dev, 320, 5, smem) == 320  # fewer tiles than resident blocks: one each
    assert i8b.grid(dev, 641, 5, smem) == 321  # two each, the last block one


def test_rows_wider_than_the_limit_keep_mmvq_i8(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "ON", True)
    monkeypatch.setattr(i8b, "MAX_SUPERBLOCKS", 24)
    assert i8b.runs(_dev(90), _weight(cols=6144), 1, _act(1))
    assert not i8b.runs(_dev(90), _weight(cols=17408), 1, _act(1))


def test_the_verify_form_takes_2_to_8_q4k_tokens_of_an_int8_copy_on_sm90(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "VERIFY_ON", True)
    monkeypatch.setattr(i8b, "VERIFY_TOKENS", frozenset(instances.I8V_TOKENS))
    monkeypatch.setattr(i8b, "VERIFY_FAST_TOKENS", frozenset(instances.I8V_TOKENS))
    for t in instances.I8V_TOKENS:
        assert i8b.verify_runs(_dev(90), _weight(), t, _act(t))
    assert not i8b.verify_runs(_dev(90), _weight(), 1, _act(1))  # one token: mmvq_i8b
    assert not i8b.verify_runs(_dev(90), _weight(), 9, _act(9))
    assert not i8b.verify_runs(_dev(90), _weight(), 5, _act(4))  # the copy holds other tokens than the launch
    assert not i8b.verify_runs(_dev(89), _weight(), 5, _act(5))
    assert not i8b.verify_runs(_dev(90), _weight(Q.Q6_K), 5, _act(5))
    assert not i8b.verify_runs(_dev(90), _weight(cols=17408), 5, _act(5))  # wider than VERIFY_MAX_SUPERBLOCKS
    assert not i8b.verify_runs(_dev(90, smem=99 * 1024), _weight(cols=6144), 8, _act(8))  # a GeForce's 99 KB
    monkeypatch.setattr(i8b, "VERIFY_ON", False)
    assert not i8b.verify_runs(_dev(90), _weight(), 5, _act(5))


def test_the_verify_form_is_on_by_default_and_its_switch_is_checked(monkeypatch) -> None:
    monkeypatch.delenv(i8b.VERIFY_ENV, raising=False)
    assert i8b._verify_default() is True
    monkeypatch.setenv(i8b.VERIFY_ENV, "0")
    assert i8b._verify_default() is False
    monkeypatch.setenv(i8b.VERIFY_ENV, "2")
    with pytest.raises(ValueError, match=i8b.VERIFY_ENV):
        i8b._verify_default()


def test_the_producers_write_the_int8_copy_of_every_token_the_verify_form_takes(monkeypatch) -> None:
    """ops._act_from writes the int8 copy (act.i8_tokens) up to 4 tokens for mmvq_i8, up to 8 with mmvq_i8v."""
    dev = SimpleNamespace(info=_dev(90).info, kernel=lambda name: name, launch=lambda *a, **k: None)
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    for precise in (True, False):
        act = ops.Act(_Buf(1), _Buf(2), _Buf(3), 5120, 5120, 8, _Buf(4), _Buf(10) if precise else None,
                      q8=_Buf(5), scale8=_Buf(6), sums8=_Buf(7), sums8_lo=_Buf(8))
        for on, tokens, written in ((False, 4, 4), (False, 5, 0), (True, 4, 4), (True, 5, 5), (True, 8, 8)):
            monkeypatch.setattr(i8b, "VERIFY_ON", on)
            ops.act_f16(dev, _Buf(9), act, tokens, 5120)
            assert act.i8_tokens == written, (precise, on, tokens)
        monkeypatch.setattr(i8b, "VERIFY_FAST_TOKENS", frozenset({2, 4}))  # fast mode's counts before c077727
        ops.act_f16(dev, _Buf(9), act, 5, 5120)
        assert act.i8_tokens == (5 if precise else 0), precise
        monkeypatch.setattr(i8b, "VERIFY_FAST_TOKENS", i8b.DEFAULT_VERIFY_FAST_TOKENS)


def test_a_producer_wider_than_the_verify_form_writes_the_int8_copy_only_where_another_kernel_reads_it(
        monkeypatch) -> None:
    """SwiGLU's 17,408 values feed only ffn_down, which mmvq_i8v takes in halves only (68 superblocks): with the
    halves off, from 5 tokens its int8 copy would go unread, so the producer leaves it out (ops.I8_COPY_BY_WIDTH;
    variant copyall)."""
    dev = SimpleNamespace(info=_dev(90).info, kernel=lambda name: name, launch=lambda *a, **k: None)
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(i8b, "VERIFY_ON", True)
    monkeypatch.setattr(ops, "VERIFY_HALVES_AT", frozenset())  # ffn_down whole: no int8 kernel takes it from 5

    def written(width: int, tokens: int) -> int:
        act = ops.Act(_Buf(1), _Buf(2), _Buf(3), width, width, 8, _Buf(4), _Buf(10), q8=_Buf(5), scale8=_Buf(6),
                      sums8=_Buf(7), sums8_lo=_Buf(8))
        ops.act_f16(dev, _Buf(9), act, tokens, width)
        return act.i8_tokens

    assert [written(17408, t) for t in (1, 4, 5, 8)] == [1, 4, 0, 0]  # mmvq_i8 and mmvq_q6_i8 read up to 4
    assert [written(6144, t) for t in (5, 8)] == [5, 8]  # 24 superblocks: mmvq_i8v takes it
    monkeypatch.setattr(ops, "Q6_I8_COUNTS", frozenset(range(1, 6)))  # an int8 Q6_K ffn_down at 5 reads it
    assert written(17408, 5) == 5 and written(17408, 6) == 0
    monkeypatch.setattr(ops, "VERIFY_HALVES_AT", frozenset({5, 6}))  # the verify form in halves reads it
    assert [written(17408, t) for t in (6, 7)] == [6, 0]
    monkeypatch.setattr(ops, "VERIFY_HALVES_AT", frozenset())
    monkeypatch.setattr(ops, "I8_COPY_BY_WIDTH", False)
    assert written(17408, 8) == 8


def test_each_mode_takes_its_own_counts_every_one_by_default(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "VERIFY_ON", True)
    precise = ops.Act(None, None, None, 5120, 5120, 8, x16_lo=_Buf(1), i8_tokens=5)
    assert i8b.DEFAULT_VERIFY_FAST_TOKENS == i8b.DEFAULT_VERIFY_TOKENS == set(instances.I8V_TOKENS)
    assert i8b.verify_runs(_dev(90), _weight(), 5, precise) and i8b.verify_runs(_dev(90), _weight(), 5, _act(5))
    monkeypatch.setattr(i8b, "VERIFY_FAST_TOKENS", frozenset({2, 4}))
    assert i8b.verify_runs(_dev(90), _weight(), 5, precise)
    assert not i8b.verify_runs(_dev(90), _weight(), 5, _act(5))  # no residue: fast mode's counts
    assert i8b.verify_runs(_dev(90), _weight(), 2, _act(2))


def test_the_verify_layout_mirrors_the_kernel() -> None:
    # both levels of T tokens at a pitch of 256 nb + 64, 32 + 8 bytes of sums and scales a superblock and token
    for nb, t in ((1, 2), (20, 5), (24, 8), (3, 7)):
        need = 2 * t * (256 * nb + 64) + 40 * t * nb
        assert i8b.verify_x_bytes(nb, t) % 1024 == 0 and need <= i8b.verify_x_bytes(nb, t) < need + 1024
    assert i8b.verify_smem_bytes(20, 5, 5) == 1024 + i8b.verify_x_bytes(20, 5) + 5 * 2 * 2 * (2048 + 256)
    src = (nvrtc.KERNEL_DIR / "mmvq_i8v.cu").read_text()
    assert int(re.search(r"#define I8V_MAX_WARPS (\d+)", src).group(1)) == i8b.VERIFY_MAX_WARPS
    assert int(re.search(r"#define I8V_WIDE_WARPS (\d+)", src).group(1)) == instances.I8V_WIDE_WARPS
    # red[2][MAXW][T][16] floats and the barriers, past the driver's 1 KB
    assert "__shared__ float red[2][MAXW][T][16];" in src and "int MAXW = I8V_MAX_WARPS, bool HALVES = false>" in src
    assert instances.I8V_MAX_WARPS == i8b.VERIFY_MAX_WARPS
    assert i8b.verify_static_smem(5) >= 1024 + 2 * i8b.VERIFY_MAX_WARPS * 5 * 16 * 4 + 8 * i8b.VERIFY_MAX_WARPS * 2
    wide_warps, (ws, wn) = instances.I8V_WIDE_WARPS, instances.I8V_WIDE_SHAPE
    assert i8b.verify_static_smem(5, wide=True) >= 1024 + 2 * wide_warps * 5 * 16 * 4 + 8 * wide_warps * wn
    assert i8b.verify_smem_bytes(20, 5, 20, wide=True) == 1024 + i8b.verify_x_bytes(20, 5) + 20 * ws * wn * 2304
    for t in instances.I8V_TOKENS:
        s, n = instances.I8V_SHAPE
        assert instances.INSTANCES[f"mmvq_q4_K_i8v_t{t}"].expr == f"mmvq_i8v<{t}, {s}, {n}>"
    for t in instances.I8V_WIDE_TOKENS:
        assert instances.INSTANCES[f"mmvq_q4_K_i8v_t{t}_wide"].expr == f"mmvq_i8v<{t}, {ws}, {wn}, {wide_warps}>"


def test_the_verify_kernels_fit_what_the_launcher_counts_without_spills() -> None:
    """The grid's blocks an SM are counted with verify_static_smem: every instance's static shared memory (ptxas's
    figure for sm_90) must fit in it, beside the driver's 1 KB. Outside the wide form (768 threads: 80 registers at
    most) no instance spills: its launch bounds let 5-8 tokens take more registers than the 80 ptxas held them to
    without a minimum of blocks, and a 12-warp block still fits an SM's registers."""
    for name, use in ptxas.usage("mmvq_i8v").items():
        tokens, wide = int(re.search(r"_t(\d)", name).group(1)), name.endswith("_wide")
        assert use.static_smem + 1024 <= i8b.verify_static_smem(tokens, wide=wide), \
            f"{name}: {use.static_smem} bytes of static shared memory"
        if not wide:
            assert use.spill_bytes == 0, f"{name}: {use.spill_bytes} bytes spilt"
            assert use.registers * 32 * i8b.VERIFY_MAX_WARPS <= 65536, name


def test_a_verify_launch_of_q4k_takes_the_verify_form_before_mmvq_i8(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "VERIFY_ON", True)
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    dev = _dev(90)
    assert ops._group_kernel(dev, _weight(), _act(4), 4, 4) == "i8v"
    monkeypatch.setattr(i8b, "VERIFY_FAST_TOKENS", frozenset({2, 4}))
    assert ops._group_kernel(dev, _weight(), _act(3), 3, 3) == "i8"  # not a count it takes (fast mode's)
    assert ops._group_kernel(dev, _weight(cols=17408), _act(4), 4, 4) == "i8"  # too wide: mmvq_i8
    monkeypatch.setattr(ops, "I8_MATMUL", False)  # OPENJET_CUDA_I8=0: every int8 form off
    assert ops._group_kernel(dev, _weight(), _act(4), 4, 4) != "i8v"


def test_the_verify_forms_token_counts_and_warps_by_default(monkeypatch) -> None:
    assert i8b.DEFAULT_VERIFY_TOKENS == set(instances.I8V_TOKENS)  # every count, 3 since Z5
    monkeypatch.setattr(i8b, "VERIFY_ON", True)
    assert i8b.verify_tokens(_dev(90)) == 8 and i8b.verify_tokens(_dev(89)) == 0
    monkeypatch.setattr(i8b, "VERIFY_WARPS", None)
    monkeypatch.setattr(i8b, "WARPS", None)
    monkeypatch.setattr(i8b, "VERIFY_WARPS_AT", i8b.DEFAULT_VERIFY_WARPS_AT)
    # the kernel's most (12) from 3 tokens, less the warps their shares leave idle: 20 superblocks in shares of 2
    assert i8b.verify_warps(_dev(90), _weight(), 5) == i8b.verify_warps(_dev(90), _weight(), 3) == 10
    # 2 tokens: mmvq_i8's choice (5 warps, two blocks an SM; Z19: the H200's 2-token pass 0.66 ms faster)
    assert i8b.verify_warps(_dev(90), _weight(), 2) == ops.i8_warps(5120, 640, 2, 132) == 5
    assert i8b.verify_warps(_dev(90), _weight(cols=6144), 5) == 12
    # ... and less what would not fit: 8 tokens at K = 6,144 leave room for 11 warps, 8 busy in shares of 3
    assert i8b.verify_warps(_dev(90), _weight(cols=6144), 8) == 8
    assert i8b.verify_smem_bytes(24, 8, 12) + i8b.verify_static_smem(8) > _dev(90).info.max_smem_per_block
    # where the table names none, mmvq_i8's choice for that many tokens, not the one-token form's 4
    monkeypatch.setattr(i8b, "VERIFY_WARPS_AT", {})
    assert i8b.warps(_dev(90), _weight()) == 4
    assert i8b.verify_warps(_dev(90), _weight(), 2) == ops.i8_warps(5120, 640, 2, 132) == 5
    assert i8b.verify_warps(_dev(90), _weight(cols=768), 8) == 3  # never more warps than superblocks


def test_verify_warps_keep_every_warp_busy_up_to_the_kernels_most(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "VERIFY_WARPS", None)
    monkeypatch.setattr(i8b, "VERIFY_WARPS_AT", {5: 12})
    assert i8b.verify_warps(_dev(90), _weight(), 5) == 10  # 20 superblocks in shares of 2
    assert i8b.verify_warps(_dev(90), _weight(cols=6144), 5) == 12
    monkeypatch.setattr(i8b, "VERIFY_WARPS_AT", {5: 16})
    assert i8b.verify_warps(_dev(90), _weight(cols=6144), 5) == 12  # the kernel's I8V_MAX_WARPS
    monkeypatch.setattr(i8b, "VERIFY_WARPS_AT", {5: 10})
    assert i8b.verify_warps(_dev(90), _weight(cols=6144), 5) == 8  # 24 in shares of 3



def test_the_wide_form_runs_a_superblock_a_warp_where_one_block_fills_an_sm(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "VERIFY_WARPS", None)
    monkeypatch.setattr(i8b, "VERIFY_TRIM", True)
    assert i8b.DEFAULT_VERIFY_WIDE_TOKENS == frozenset()  # off until a GPU has timed it
    monkeypatch.setattr(i8b, "VERIFY_WIDE_TOKENS", frozenset(instances.I8V_WIDE_TOKENS))
    assert not i8b.verify_wide(2) and i8b.verify_wide(5)  # 2 tokens have no wide instance
    # K = 5,120: 20 warps of one superblock each (12 in shares of 2 without, 10 busy)
    assert i8b.verify_warps(_dev(90), _weight(), 5, wide=True) == 20
    assert i8b.verify_warps(_dev(90), _weight(), 5) == 10
    # K = 6,144 at 5 tokens: 24 rings of 3 stages and the staged rows pass the SM's shared memory; the next count
    # that keeps every warp busy is 12, in shares of 2
    assert (i8b.verify_smem_bytes(24, 5, 24, wide=True) + i8b.verify_static_smem(5, wide=True)
            > _dev(90).info.max_smem_per_block)
    assert i8b.verify_warps(_dev(90), _weight(cols=6144), 5, wide=True) == 12
    assert i8b.verify_warps(_dev(90), _weight(cols=768), 5, wide=True) == 3  # never more warps than superblocks
    # the walking grid: one block an SM
    smem = i8b.verify_smem_bytes(20, 5, 20, wide=True)
    assert i8b.grid(_dev(90), 2176, 20, smem, i8b.verify_static_smem(5, wide=True), 0) == 128


def test_a_wide_launch_names_its_instance_and_block(monkeypatch) -> None:
    launched = []
    dev = SimpleNamespace(info=_dev(90).info, kernel=lambda name: name,
                          set_max_dynamic_smem=lambda kernel, smem: None,
                          launch=lambda kernel, blocks, threads, args, smem: launched.append(
                              (kernel, blocks, threads, smem)))
    monkeypatch.setattr(i8b, "quant_map", lambda w: None)
    monkeypatch.setattr(i8b, "VERIFY_WARPS", None)
    monkeypatch.setattr(i8b, "VERIFY_WIDE_TOKENS", frozenset({5}))
    w, group8 = _weight(), (None, None, None, None)
    i8b.launch_verify(dev, w, group8, None, None, None, 5, 10240)
    i8b.launch_verify(dev, w, group8, None, None, None, 4, 10240)
    assert launched[0][:3] == ("mmvq_q4_K_i8v_t5_wide", 128, 640)
    assert launched[0][3] == i8b.verify_smem_bytes(20, 5, 20, wide=True)
    assert launched[1][0] == "mmvq_q4_K_i8v_t4" and launched[1][2] == 32 * 10


def test_ffn_down_takes_it_by_default_in_blocks_of_eight_warps_one_an_sm(monkeypatch) -> None:
    monkeypatch.setattr(i8b, "ON", True)
    monkeypatch.setattr(i8b, "WARPS", None)
    monkeypatch.setattr(i8b, "SHAPE", i8b.DEFAULT_SHAPE)
    monkeypatch.setattr(i8b, "MAX_SUPERBLOCKS", i8b.DEFAULT_MAX_SUPERBLOCKS)
    monkeypatch.setattr(i8b, "WIDE_WARPS", i8b.DEFAULT_WIDE_WARPS)
    monkeypatch.setattr(i8b, "SPARE_PER_SM", i8b.DEFAULT_SPARE_PER_SM)
    monkeypatch.setattr(i8b, "FILL", False)
    dev, down = _dev(90), ops.DeviceWeight(None, Q.Q4_K, 5120, 17408)
    assert i8b.runs(dev, down, 1, _act(1)) and i8b.warps(dev, down) == 8
    smem = i8b.smem_bytes(68, 8, i8b.SHAPE)
    assert i8b.resident(dev, 8, smem) == 132 and i8b.grid(dev, 320, 8, smem) == 107  # 3 tiles a block
    assert i8b.warps(dev, _weight()) == ops.i8_warps(5120, 640, 1, 132)  # narrower rows: mmvq_i8's choice
    monkeypatch.setattr(i8b, "WIDE_WARPS", None)
    assert i8b.warps(dev, down) == ops.i8_warps(17408, 320, 1, 132)


def _down_act(i8_tokens: int) -> ops.Act:
    return ops.Act(None, None, None, 17408, 17408, 8, i8_tokens=i8_tokens)


@pytest.fixture
def verify_on(monkeypatch):
    monkeypatch.setattr(i8b, "VERIFY_ON", True)
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(i8b, "VERIFY_WARPS", None)
    monkeypatch.setattr(i8b, "VERIFY_TRIM", True)
    monkeypatch.setattr(i8b, "VERIFY_WIDE_TOKENS", frozenset())
    monkeypatch.setattr(i8b, "VERIFY_TOKENS", i8b.DEFAULT_VERIFY_TOKENS)
    monkeypatch.setattr(i8b, "VERIFY_FAST_TOKENS", i8b.DEFAULT_VERIFY_FAST_TOKENS)


def test_ffn_down_fits_the_verify_form_in_halves_only(verify_on) -> None:
    """ffn_down's 68 superblocks do not fit the verify form whole; in halves a block stages its 34."""
    dev, down = _dev(90), ops.DeviceWeight(None, Q.Q4_K, 5120, 17408)
    assert not i8b.verify_runs(dev, down, 5, _down_act(5))
    assert i8b.verify_runs(dev, down, 5, _down_act(5), halves=True)
    assert not i8b.verify_runs(dev, down, 5, _down_act(4), halves=True)  # the int8 copy is of other tokens
    assert (i8b.verify_staged(68, True), i8b.verify_staged(69, True), i8b.verify_staged(68, False)) == (34, 35, 68)
    # 34 staged superblocks: 12 warps in shares of 3 at 5 tokens; at 8 the staged rows leave room for 7 (shares of 5)
    assert i8b.verify_warps(dev, down, 5, halves=True) == 12
    assert i8b.verify_warps(dev, down, 8, halves=True) == 7
    for t, warps in ((5, 12), (8, 7)):
        assert (i8b.verify_smem_bytes(34, t, warps) + i8b.verify_static_smem(t)
                <= dev.info.max_smem_per_block)


def test_ffn_down_goes_in_halves_at_the_counts_asked(verify_on, monkeypatch) -> None:
    dev, down = _dev(90), ops.DeviceWeight(None, Q.Q4_K, 5120, 17408)
    monkeypatch.setattr(ops, "DOWN_HALVES", False)
    monkeypatch.setattr(ops, "OUT_HALVES", False)
    assert ops.DEFAULT_VERIFY_HALVES_AT == frozenset(range(2, 9))  # every verify count (H100, bench/NOTES.md Z26)
    monkeypatch.setattr(ops, "VERIFY_HALVES_AT", frozenset())
    assert not ops.splits_in_halves(dev, down, _down_act(5), 5)
    monkeypatch.setattr(ops, "VERIFY_HALVES_AT", frozenset({5}))
    assert ops.splits_in_halves(dev, down, _down_act(5), 5)
    assert not ops.splits_in_halves(dev, down, _down_act(4), 4)  # not a count asked
    assert not ops.verify_halves(dev, _weight(), _act(5), 5)  # rows narrower than ops.WIDE_COLS stay whole
    monkeypatch.setattr(i8b, "VERIFY_ON", False)
    assert not ops.splits_in_halves(dev, down, _down_act(5), 5)


def test_a_launch_in_halves_names_its_instance_grid_and_second_output(verify_on, monkeypatch) -> None:
    launched = []
    dev = SimpleNamespace(info=_dev(90).info, kernel=lambda name: name,
                          set_max_dynamic_smem=lambda kernel, smem: None,
                          launch=lambda kernel, blocks, threads, args, smem: launched.append(
                              (kernel, blocks, threads, args, smem)))
    monkeypatch.setattr(i8b, "quant_map", lambda w: None)
    down, y2 = ops.DeviceWeight(None, Q.Q4_K, 5120, 17408), SimpleNamespace(ptr=7)
    i8b.launch_verify(dev, down, (None, None, None, None), None, None, None, 5, 5120, y2=y2)
    ((name, blocks, threads, args, smem),) = launched
    assert name == "mmvq_q4_K_i8v_t5_halves" and threads == 32 * 12 and args[-1] is y2
    assert smem == i8b.verify_smem_bytes(34, 5, 12)
    # 640 half-tiles on one block an SM, an even grid (each block keeps its index's half)
    assert blocks % 2 == 0 and blocks <= 132 and -(-640 // blocks) == -(-640 // 132)
    assert instances.INSTANCES[name].expr == f"mmvq_i8v<5, 2, 2, {i8b.VERIFY_MAX_WARPS}, true>"
