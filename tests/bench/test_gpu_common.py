"""bench/gpu_common.patched: a module's switches set for a block and restored after it, an exception included."""

from __future__ import annotations

import types

import pytest

from bench.gpu_common import patched


def test_patched_sets_and_restores_even_when_the_block_raises() -> None:
    switches = types.SimpleNamespace(GEMM_WG=0, GEMM_STAGED=True)
    with patched(switches, GEMM_WG=2, GEMM_STAGED=False):
        assert (switches.GEMM_WG, switches.GEMM_STAGED) == (2, False)
    assert (switches.GEMM_WG, switches.GEMM_STAGED) == (0, True)
    with pytest.raises(RuntimeError), patched(switches, GEMM_WG=1):
        assert switches.GEMM_WG == 1
        raise RuntimeError("a kernel failed")
    assert switches.GEMM_WG == 0
