"""The wgmma prefill GEMM experiment (bench/gpu_gemm_wg.py): its launch constants are the kernel's, and it compiles
for sm_90a into warpgroup MMAs with A in registers, without spills."""

from __future__ import annotations

import re

from gguf import GGMLQuantizationType as Q

from bench import gpu_gemm_wg

SOURCE = gpu_gemm_wg.SOURCE.read_text()


def define(name: str) -> str:
    return re.search(rf"#define {name} (.+?)(?:\s+//|$)", SOURCE, re.M).group(1).strip()


def test_launch_constants_are_the_kernels() -> None:
    warps = int(define("WG_WARPS"))
    assert gpu_gemm_wg.THREADS == 32 * warps and gpu_gemm_wg.TOKENS == int(define("WG_TOKENS"))
    assert gpu_gemm_wg.ROWS == 16 * warps  # WG_ROWS: 16 rows a warp
    # WG_SMEM_BYTES = 2 * (WG_WARPS * 4096 + WG_ACT_BYTES) + 128, WG_ACT_BYTES = 16 steps x WG_TOKENS x 32 bytes
    assert gpu_gemm_wg.SMEM == 2 * (warps * 4096 + 16 * gpu_gemm_wg.TOKENS * 32) + 128
    assert define("WG_SMEM_BYTES") == "(2 * (WG_WARPS * 4096 + WG_ACT_BYTES) + 128)"
    assert gpu_gemm_wg.QTYPES == {Q.Q4_K: int(Q.Q4_K), Q.Q6_K: int(Q.Q6_K)}


def test_it_compiles_to_warpgroup_mmas_for_sm_90a() -> None:
    from engine.cuda import nvrtc

    instances = {f"gemm_wg<{t}, {o}>" for t in (12, 14) for o in ("false", "true")}
    assert set(gpu_gemm_wg.compile_gemm_wg(90).symbols) == instances  # as the part builds it
    cubin = nvrtc.compile_file(gpu_gemm_wg.SOURCE, 90, ("gemm_wg<12, true>",), ("-arch=sm_90a", "--ptxas-options=-v"))
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", cubin.log)
    assert len(spills) == 4 and all(s == ("0", "0") for s in spills), cubin.log
    assert "serialized" not in cubin.log  # ptxas keeps the wgmmas asynchronous (C7513 where it cannot)
    ptx = nvrtc.compile_file(gpu_gemm_wg.SOURCE, 90, ("gemm_wg<12, true>",), ("-arch=sm_90a",), ptx=True).image.decode()
    assert ".target sm_90a" in ptx
    # one m64n128k16 with A in registers a step: 16 a superblock in each of the four instances
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16 \{[^}]*\}, \{[^}]*\}"  # {d}, {a}: A in registers
    assert len(re.findall(mma, ptx)) == 4 * 16
    for op in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
               "fence.proxy.async.shared::cta"):
        assert op in ptx
