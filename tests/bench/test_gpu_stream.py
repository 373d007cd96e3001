"""The stream probe's builds compile without a GPU, and each really drops what its name says."""

from __future__ import annotations

import re

import pytest

from bench import gpu_stream
from engine.cuda import instances, nvrtc


def test_stream_probe_kernel_compiles() -> None:
    compiled = nvrtc.compile_file(gpu_stream.PROBE_SOURCE, 90, ("stream_read",))
    assert compiled.symbols["stream_read"] == "stream_read"


def test_loads_only_build_keeps_the_copies_and_drops_the_mma() -> None:
    expr = instances.INSTANCES["mmvq_q4_K_cp"].expr
    full = nvrtc.compile_file(nvrtc.KERNEL_DIR / "mmvq.cu", 90, (expr,), ptx=True).image.decode()
    loads = nvrtc.compile_file(nvrtc.KERNEL_DIR / "mmvq.cu", 90, (expr,), ptx=True,
                               options=("-DOPENJET_PROBE_LOADS_ONLY",)).image.decode()
    assert "mma.sync" in full and "mma.sync" not in loads
    # the copies stay (static counts differ: the lighter loop body is unrolled differently)
    for ptx in (full, loads):
        assert re.search(r"cp\.async\.cg\.shared\.global", ptx) and "cp.async.wait_group" in ptx


@pytest.mark.parametrize("tag", ["q4_K", "q6_K"])
def test_every_probe_build_compiles_and_drops_what_it_says(tag: str) -> None:
    expr = instances.INSTANCES[f"mmvq_{tag}_cp"].expr
    ptx = {label: nvrtc.compile_file(nvrtc.KERNEL_DIR / "mmvq.cu", 90, (expr,), ptx=True,
                                     options=(f"-D{define}",)).image.decode()
           for label, define in gpu_stream.PROBES.items()}
    assert "mma.sync" not in ptx["loads"] and "mma.sync" not in ptx["decode"] and "mma.sync" in ptx["mma"]
    # the activation-load builds keep the loads and drop the mma; the chain builds keep the mma, and the one on
    # constant activations loads none from global memory beyond the copies
    assert not any("mma.sync" in ptx[k] for k in ("act", "act.hot"))
    assert all("mma.sync" in ptx[k] for k in ("mma.noact", "mma.split"))
    assert "ld.global.nc.v2" in ptx["act"] and "ld.global.nc.v2" not in ptx["mma.noact"]  # 8-byte fragments
    # decoding is f16x2 arithmetic (fma for Q4_K, sub and mul for Q6_K); the mma-only build has none of it
    f16x2 = re.compile(r"\b(?:fma|mul|sub|add)\.rn\.f16x2")
    assert f16x2.search(ptx["decode"]) and not f16x2.search(ptx["mma"])
