"""The stream probe's two builds compile without a GPU, and the loads-only build really drops the arithmetic."""

from __future__ import annotations

import re

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
