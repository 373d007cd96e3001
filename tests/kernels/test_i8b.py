"""Host-side rules of the tensor-copy int8 Q4_K matmul (kernels/mmvq_i8b.cu, engine/cuda/i8b.py): when a matmul
takes it, the shared memory its launcher asks for against the kernel's layout, and its instances. The kernel is
checked on the GPU (bench/gpu_kernels.py I8B_CHECKS: against the float64 reference and mmvq_i8)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import i8b, instances, nvrtc, ops


def _dev(arch: int, smem: int = 232448):
    return SimpleNamespace(info=SimpleNamespace(arch=arch, max_smem_per_block=smem, multiprocessors=132))


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


def test_on_by_default_and_the_switch_is_checked(monkeypatch) -> None:
    monkeypatch.delenv(i8b.ENV, raising=False)
    assert i8b._default() is True
    monkeypatch.setenv(i8b.ENV, "0")
    assert i8b._default() is False
    monkeypatch.setenv(i8b.ENV, "yes")
    with pytest.raises(ValueError, match=i8b.ENV):
        i8b._default()


def test_the_launcher_mirrors_the_kernels_layout() -> None:
    src = (nvrtc.KERNEL_DIR / "mmvq_i8b.cu").read_text()
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


def test_grid_one_block_a_tile_or_equal_tiles_a_resident_block(monkeypatch) -> None:
    dev, smem = _dev(90), i8b.smem_bytes(20, 5, (2, 2))  # 59 KB: 3 blocks of 5 warps an SM
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
