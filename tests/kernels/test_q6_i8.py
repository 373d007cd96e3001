"""Host-side rules of the int8-activation Q6_K matmul (kernels/mmvq_i8q6.cu): when a matmul takes it, the shared
memory its launcher asks for against the kernel's layout, and its instances. The kernel itself is checked on the
GPU (bench/gpu_kernels.py Q6_I8_CHECKS: against the float64 reference and the f16 kernels it replaces)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import instances, nvrtc, ops


def _dev(smem: int = 232448):
    return SimpleNamespace(info=SimpleNamespace(name="NVIDIA H100 80GB HBM3",
                                                arch=90, max_smem_per_block=smem, multiprocessors=132))


def _weight(qtype: Q = Q.Q6_K, rows: int = 5120, cols: int = 17408) -> ops.DeviceWeight:
    return ops.DeviceWeight(None, qtype, rows, cols)


def _act(i8_tokens: int) -> ops.Act:
    return ops.Act(None, None, None, 17408, 17408, 8, i8_tokens=i8_tokens)


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "Q6_I8", True)
    monkeypatch.setattr(ops, "Q6_I8_COUNTS", frozenset(instances.Q6_I8_TOKENS))


def test_a_q6k_matmul_with_the_int8_copy_takes_it_at_every_count(on) -> None:
    for t in instances.Q6_I8_TOKENS:
        assert ops._group_kernel(_dev(), _weight(), _act(t), t, t) == "i8q6", t
        assert ops._group_kernel(_dev(), _weight(rows=248320, cols=5120), _act(t), t, t) == "i8q6", t


def test_not_taken_without_the_copy_for_other_types_or_when_off(on, monkeypatch) -> None:
    assert ops._group_kernel(_dev(), _weight(), _act(2), 3, 3) != "i8q6"  # the copy holds 2 tokens, not 3
    assert ops._group_kernel(_dev(), _weight(), _act(0), 1, 1) != "i8q6"
    assert ops._group_kernel(_dev(), _weight(Q.Q5_K), _act(1), 1, 1) != "i8q6"
    assert ops._group_kernel(_dev(smem=48 * 1024), _weight(), _act(8), 8, 8) != "i8q6"  # does not fit
    monkeypatch.setattr(ops, "Q6_I8_COUNTS", frozenset({1}))
    assert ops._group_kernel(_dev(), _weight(), _act(2), 2, 2) != "i8q6"
    assert ops._group_kernel(_dev(), _weight(), _act(2), 1, 1) == "i8q6"
    monkeypatch.setattr(ops, "Q6_I8", False)
    assert ops._group_kernel(_dev(), _weight(), _act(1), 1, 1) != "i8q6"
    monkeypatch.setattr(ops, "Q6_I8", True)
    monkeypatch.setattr(ops, "I8_MATMUL", False)  # OPENJET_CUDA_I8=0: every int8 form off
    assert ops._group_kernel(_dev(), _weight(), _act(1), 1, 1) != "i8q6"


def test_the_launcher_mirrors_the_kernels_layout() -> None:
    src = (nvrtc.KERNEL_DIR / "mmvq_i8q6.cu").read_text()
    pitch = int(re.search(r"#define Q6I8_SLOT_PITCH (\d+)", src).group(1))
    assert pitch == ops.Q6_I8_SLOT_BYTES
    # ql' 16 x 160, qh' 16 x 80, 16 scales and a d word a row
    assert ops.Q6_I8_STAGE_BASE == 16 * (160 + 80 + 16 + 4)
    header = (nvrtc.KERNEL_DIR / "i8q6k.cuh").read_text()  # its stage: the shared Q6_K stage at these pitches
    assert "using Q6I8Stage = Q6KStage8" in src and "using Q6KStage8 = Q6KStage<160, 80>" in header
    assert ops.q6_i8_stage_bytes(1) == 4160 + 2 * 320 + 16 and ops.q6_i8_stage_bytes(8) == 4160 + 16 * 320 + 64
    for t in instances.Q6_I8_TOKENS:
        assert instances.INSTANCES[f"mmvq_q6_K_i8_t{t}"].expr == f"mmvq_q6_i8<{t}, {instances.ACT_STAGES}>"
    # the 27B shapes fit at every count: ffn_down (68 superblocks), the output head and attn_v (20)
    for cols in (17408, 5120):
        for t in instances.Q6_I8_TOKENS:
            blocks, warps, smem = ops._q6_i8_shape(_dev(), _weight(cols=cols), t)
            assert smem == warps * instances.ACT_STAGES * ops.q6_i8_stage_bytes(t) <= ops.ACT_MAX_BLOCK_SMEM
            assert (cols // 256) % warps == 0, (cols, t, warps)


def test_by_default_it_runs_up_to_4_tokens() -> None:
    assert ops.DEFAULT_Q6_I8_COUNTS == frozenset(range(1, 5)) <= set(instances.Q6_I8_TOKENS)

