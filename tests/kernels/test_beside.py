"""Which matmuls of a projection run on the side stream (weights.Projection.run, Device.beside): the small parts
beside the largest, never one that launches the persistent mmvq (its scratch is one per device). The streams
themselves are exercised on the GPU (tests/kernels/test_cuda_gpu.py, bench/gpu_models.py)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import gemm, ops
from engine.cuda.memory import Buffer
from engine.cuda.weights import Part, Projection

SM90 = 232448


class _Streams:
    """What Projection.run asks of a device: beside() and, for runs_persist, its shared memory limit."""

    def __init__(self) -> None:
        self.side_active = False
        self.info = SimpleNamespace(name="NVIDIA H100 80GB HBM3", max_smem_per_block=SM90, arch=90, multiprocessors=132)

    @contextmanager
    def beside(self):
        assert not self.side_active
        self.side_active = True
        try:
            yield
        finally:
            self.side_active = False


def _weight(name: str, qtype: Q, rows: int, cols: int = 5120) -> ops.DeviceWeight:
    return ops.DeviceWeight(Buffer(0x1000, rows * cols // 2, name), qtype, rows, cols, name)


def _act(precise: bool, i8_tokens: int = 0, width: int = 5120) -> ops.Act:
    lo = Buffer(0x2000, 1, "lo") if precise else None
    return ops.Act(None, None, None, width, width, 8, x16_lo=lo, i8_tokens=i8_tokens)


def _deltanet_in() -> Projection:
    """qkv | gate (Q4_K, fused) and alpha | beta (Q8_0), as weights._layer builds them."""
    return Projection([Part(_weight("qkv|gate", Q.Q4_K, 16384), None, 0),
                       Part(_weight("alpha|beta", Q.Q8_0, 96), None, 16384)], 16480)


def _launches(monkeypatch, proj: Projection, act: ops.Act, tokens: int, beside: bool) -> list[tuple[str, bool]]:
    dev, seen = _Streams(), []
    monkeypatch.setattr(ops, "matmul", lambda d, w, *a, **k: seen.append((w.name, d.side_active)))
    proj.run(dev, act, Buffer(0x3000, 1 << 20, "y"), tokens, proj.width, beside=beside)
    return seen


def test_the_small_part_runs_beside_the_large_one(monkeypatch) -> None:
    seen = _launches(monkeypatch, _deltanet_in(), _act(True, i8_tokens=1), 1, beside=True)
    assert sorted(seen) == [("alpha|beta", True), ("qkv|gate", False)]
    assert seen[0] == ("alpha|beta", True)  # forked first, so it starts with the large one


def test_without_beside_every_part_stays_on_the_main_stream(monkeypatch) -> None:
    seen = _launches(monkeypatch, _deltanet_in(), _act(True, i8_tokens=1), 1, beside=False)
    assert seen == [("qkv|gate", False), ("alpha|beta", False)]


def test_the_largest_part_stays_on_the_main_stream_wherever_it_is(monkeypatch) -> None:
    proj = Projection([Part(_weight("v", Q.Q6_K, 1024), None, 0), Part(_weight("q|k", Q.Q4_K, 13312), None, 1024)],
                      14336)
    assert sorted(_launches(monkeypatch, proj, _act(False), 2, beside=True)) == [("q|k", False), ("v", True)]


@pytest.mark.parametrize("tokens", [5, 8])
def test_a_persistent_launch_never_goes_beside(monkeypatch, tokens: int) -> None:
    """Precise Q4_K launches of 5-8 tokens run mmvq_persist (ops.PIPELINE_TABLE): such a small part stays."""
    monkeypatch.setattr(ops, "PIPELINED", ops.TABLE_QTYPES)
    monkeypatch.setattr(ops, "PIPELINE_EVERYWHERE", False)
    proj = Projection([Part(_weight("big", Q.Q6_K, 16384), None, 0), Part(_weight("small", Q.Q4_K, 512), None, 16384)],
                      16896)
    act = _act(True)
    assert ops.runs_persist(_Streams(), proj.parts[1].weight, act, tokens)
    assert _launches(monkeypatch, proj, act, tokens, beside=True) == [("big", False), ("small", False)]


def test_runs_persist_follows_the_kernel_choice(monkeypatch) -> None:
    monkeypatch.setattr(ops, "PIPELINED", ops.TABLE_QTYPES)
    monkeypatch.setattr(ops, "PIPELINE_EVERYWHERE", False)
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    dev, q4 = _Streams(), _weight("w", Q.Q4_K, 512)
    assert not ops.runs_persist(dev, q4, _act(True, i8_tokens=4), 4)  # the int8 kernel
    assert not ops.runs_persist(dev, q4, _act(False), 5)  # fast mode: plain above 2 tokens
    assert not ops.runs_persist(dev, _weight("ab", Q.Q8_0, 96), _act(True), 5)
    assert not ops.runs_persist(dev, q4, _act(True), gemm.MIN_TOKENS)  # prefill: the GEMM
    assert ops.runs_persist(dev, q4, _act(True), 5)  # precise, no int8 copy written: the two-pass persist
    assert not ops.runs_persist(dev, q4, _act(True), 4)  # precise up to 4 tokens: mmvq_cp
