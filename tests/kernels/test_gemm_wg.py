"""The prefill matmul on warpgroup MMA (kernels/gemm_wg.cu): built with sm_90a's feature set for sm_90 alone and a
trapping stub elsewhere, compiled into asynchronous warpgroup MMAs (A in registers; the warp-specialised form with
both operands in shared memory), launched by ops.matmul only where OPENJET_CUDA_GEMM_WG asks, with the kernel's own
tile and shared-memory sizes."""

from __future__ import annotations

import re

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import instances, nvrtc, ops

SOURCE = (nvrtc.KERNEL_DIR / "gemm_wg.cu").read_text()
EXPRS = tuple(i.expr for i in instances.files()["gemm_wg"])


def define(name: str) -> str:
    return re.search(rf"#define {name} (.+?)(?:\s+//|$)", SOURCE, re.M).group(1).strip()


def test_launch_constants_are_the_kernels() -> None:
    warps = int(define("WG_WARPS"))
    assert ops.GEMM_WG_THREADS == 32 * warps and ops.GEMM_WG_TOKENS == int(define("WG_TOKENS"))
    assert ops.GEMM_WG_ROWS == 16 * warps  # WG_ROWS: 16 rows a warp
    assert define("WG_SMEM_BYTES") == "(2 * (WG_WARPS * 4096 + WG_ACT_BYTES) + 128)"
    assert define("WG_ACT_BYTES") == "(SB_STEPS * WG_STEP_BYTES)" and define("WG_STEP_BYTES") == "(WG_TOKENS * 32)"
    assert ops.GEMM_WG_SMEM == 2 * (warps * 4096 + 16 * ops.GEMM_WG_TOKENS * 32) + 128
    assert {i.name for i in instances.files()["gemm_wg"]} == {
        f"gemm_wg_{t}{o}" for t in ("q4_K", "q6_K") for o in ("", "_o", "_ws")}
    # the warp-specialised form: two producer warpgroups and two consumers; two slots of raw weights (a row tile's
    # stage in 4 KB each) and two halves of a superblock, each A (8 steps x 128 rows x 32 bytes) then B
    assert ops.GEMM_WS_THREADS == int(define("WS_THREADS")) == 4 * 128
    assert define("WS_SMEM_BYTES") == "(2 * WS_RAW_BYTES + 2 * WS_HALF_BYTES + 1024)"  # 1,024-aligned atoms
    assert define("WS_HALF_BYTES") == "(WS_A_BYTES + WS_HALF_STEPS * WG_STEP_BYTES)"
    half = 8 * ops.GEMM_WG_ROWS * 32 + 8 * ops.GEMM_WG_TOKENS * 32
    assert ops.GEMM_WS_SMEM == 2 * warps * 4096 + 2 * half + 1024 <= 227 * 1024


def test_only_sm_90_builds_it_with_its_feature_set() -> None:
    assert nvrtc.file_options("gemm_wg", 90) == ("-arch=sm_90a",)
    assert nvrtc.file_options("gemm_wg", 90, ptx=True) == () and nvrtc.file_options("gemm_wg", 89) == ()
    assert all(instances.arch_options(f, 90) == () for f in instances.files() if f != "gemm_wg")


def test_sm_90a_build_is_asynchronous_warpgroup_mma_without_spills() -> None:
    path = nvrtc.KERNEL_DIR / "gemm_wg.cu"
    cubin = nvrtc.compile_file(path, 90, EXPRS, nvrtc.file_options("gemm_wg", 90) + ("--ptxas-options=-v",))
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", cubin.log)
    assert len(spills) == len(EXPRS) and all(s == ("0", "0") for s in spills), cubin.log
    assert "serialized" not in cubin.log  # ptxas keeps the wgmmas asynchronous (its C7513 warning where it cannot)
    ptx = nvrtc.compile_file(path, 90, EXPRS, nvrtc.file_options("gemm_wg", 90), ptx=True).image.decode()
    assert ".target sm_90a" in ptx
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16 \{[^}]*\}, \{[^}]*\}"  # {d}, {a}: A in registers
    assert len(re.findall(mma, ptx)) == 4 * 16  # a step's, 16 a superblock, in each of the four instances
    # the warp-specialised instances: {d}, A's descriptor, B's: 8 a half superblock in each of the two
    both_shared = r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16 \{[^}]*\}, %rd\d+, %rd\d+"
    assert len(re.findall(both_shared, ptx)) == 2 * 8
    assert len(re.findall(r"bar\.arrive", ptx)) >= 2 * 2 and "bar.sync" in ptx  # FULL and EMPTY
    for op in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
               "fence.proxy.async.shared::cta"):
        assert op in ptx
    # anywhere else the kernels trap rather than leave y unwritten
    other = nvrtc.compile_file(path, 80, EXPRS, nvrtc.file_options("gemm_wg", 80), ptx=True).image.decode()
    assert "wgmma" not in other and other.count("trap;") >= len(EXPRS)


def test_matmul_takes_it_only_where_asked(monkeypatch) -> None:
    monkeypatch.setattr(ops, "GEMM_WG", 0)
    assert ops.gemm_wg_instance(90, Q.Q4_K, 512, 5120, False) is None  # off by default
    monkeypatch.setattr(ops, "GEMM_WG", 1)
    assert ops.gemm_wg_instance(90, Q.Q4_K, 512, 5120, False) == "gemm_wg_q4_K"
    assert ops.gemm_wg_instance(90, Q.Q6_K, ops.GEMM_WG_MIN_TOKENS, 17408, False) == "gemm_wg_q6_K"
    for args in ((89, Q.Q4_K, 512, 5120, False), (120, Q.Q4_K, 512, 5120, False), (90, Q.Q5_K, 512, 5120, False),
                 (90, Q.Q4_K, ops.GEMM_WG_MIN_TOKENS - 1, 5120, False), (90, Q.Q4_K, 512, 5000, False),
                 (90, Q.Q4_K, 512, 5120, True)):
        assert ops.gemm_wg_instance(*args) is None, args
    monkeypatch.setattr(ops, "GEMM_WG", 2)
    assert ops.gemm_wg_instance(90, Q.Q4_K, 8192, 5120, False) == "gemm_wg_q4_K_o"
    monkeypatch.setattr(ops, "GEMM_WG", 3)
    assert ops.gemm_wg_instance(90, Q.Q6_K, 8192, 17408, False) == "gemm_wg_q6_K_ws"
    assert all(name in instances.INSTANCES for name in ("gemm_wg_q4_K", "gemm_wg_q4_K_o", "gemm_wg_q6_K_o",
                                                         "gemm_wg_q4_K_ws"))


def test_the_switch_refuses_a_bad_value(monkeypatch) -> None:
    monkeypatch.setenv(ops.GEMM_WG_ENV, "on")
    with pytest.raises(ValueError, match="OPENJET_CUDA_GEMM_WG='on'"):
        ops._gemm_wg_mode()
    monkeypatch.setenv(ops.GEMM_WG_ENV, "3")
    assert ops._gemm_wg_mode() == 3


def test_the_swizzled_warp_specialised_layout_builds() -> None:
    """WS_SWIZZLE=1 (bench/NOTES.md Z15: built, not yet run on a GPU) compiles to the same wgmmas on 128-byte swizzled
    descriptors (layout bits 62-63 = 1, set by wg_desc_sw128)."""
    path = nvrtc.KERNEL_DIR / "gemm_wg.cu"
    options = nvrtc.file_options("gemm_wg", 90) + ("-DWS_SWIZZLE=1",)
    ptx = nvrtc.compile_file(path, 90, EXPRS, options, ptx=True).image.decode()
    both_shared = r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16 \{[^}]*\}, %rd\d+, %rd\d+"
    assert len(re.findall(both_shared, ptx)) == 2 * 8
    # the descriptors' constant part: SWIZZLE_128B (1 << 62), the 1,024-byte atoms (SBO 64 << 32), LBO 1 << 16
    assert str((1 << 62) | (64 << 32) | (1 << 16)) in ptx
