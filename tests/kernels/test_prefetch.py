"""Host side of the L2 prefetch (engine/cuda/prefetch.py, kernels/prefetch.cu): which bytes it asks for. The
kernel only issues requests; on the GPU the 27B bench's variants l2p16/32/48 run passes with it and compare their
greedy tokens with the default's (bench/gpu_bench27b.py)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import prefetch, repack

KERNEL = Path(prefetch.__file__).parent / "kernels" / "prefetch.cu"


def _weight(qtype: Q, rows: int, cols: int, ptr: int = 1 << 20) -> SimpleNamespace:
    nbytes = repack.device_nbytes(qtype, (rows, cols))
    return SimpleNamespace(qtype=qtype, rows=rows, cols=cols, buf=SimpleNamespace(ptr=ptr, nbytes=nbytes))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q4_0, Q.F16])
def test_plane_spans_are_the_planes_repack_writes(qtype: Q) -> None:
    rows, cols = 40, 512  # rows not a whole number of tiles: the tiled plane is padded
    block, size = repack.block_layout(qtype)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=rows * (cols // block) * size, dtype=np.uint8)
    if qtype == Q.F16:
        data = rng.standard_normal(rows * cols).astype(np.float16).view(np.uint8)
    planes = repack.planes(data, qtype, (rows, cols))
    spans = repack.plane_spans(qtype, (rows, cols))
    assert [s for _, s in spans] == [p.size for p in planes]
    assert [o for o, _ in spans] == list(np.cumsum([0] + [p.size for p in planes[:-1]]))
    assert sum(s for _, s in spans) == repack.device_nbytes(qtype, (rows, cols))


def test_a_budget_past_the_weight_takes_every_plane_whole() -> None:
    w = _weight(Q.Q4_K, 64, 1024)
    got = prefetch.ranges([w], 1 << 30)
    assert got == [(w.buf.ptr + o, s) for o, s in repack.plane_spans(Q.Q4_K, (64, 1024))]


def test_a_partial_budget_takes_the_same_first_fraction_of_every_plane() -> None:
    w = _weight(Q.Q6_K, 256, 4096)
    spans = repack.plane_spans(Q.Q6_K, (256, 4096))
    budget = w.buf.nbytes // 4
    got = prefetch.ranges([w], budget)
    assert [start for start, _ in got] == [w.buf.ptr + o for o, _ in spans]  # each plane from its first byte
    for (_, size), (_, plane) in zip(got, spans, strict=True):
        assert size % 16 == 0 and plane // 4 - 16 < size <= plane // 4
    assert budget - 16 * len(spans) <= sum(size for _, size in got) <= budget


def test_the_budget_runs_through_the_weights_in_order() -> None:
    first = _weight(Q.Q4_K, 32, 1024, ptr=1 << 20)
    second = _weight(Q.Q4_K, 1024, 1024, ptr=1 << 24)
    got = prefetch.ranges([first, second], first.buf.nbytes + 4096)
    assert got[0] == (first.buf.ptr, repack.plane_spans(Q.Q4_K, (32, 1024))[0][1])
    rest = [r for r in got if r[0] >= second.buf.ptr]
    assert rest and sum(size for _, size in rest) <= 4096
    assert all(second.buf.ptr <= start and start + size <= second.buf.ptr + second.buf.nbytes
               for start, size in rest)
    assert prefetch.ranges([first, second], 0) == []


def test_never_more_ranges_than_the_kernel_takes() -> None:
    weights = [_weight(Q.Q6_K, 64, 1024, ptr=(i + 1) << 24) for i in range(4)]  # 4 planes each
    got = prefetch.ranges(weights, 1 << 30)
    assert len(got) == prefetch.MAX_RANGES
    assert got == [(w.buf.ptr + o, s) for w in weights[:2] for o, s in repack.plane_spans(Q.Q6_K, (64, 1024))]


def test_the_switch_takes_whole_mib_and_names_itself_when_wrong(monkeypatch) -> None:
    monkeypatch.setenv(prefetch.ENV, "24")
    assert prefetch._default_bytes() == 24 << 20
    monkeypatch.delenv(prefetch.ENV)
    assert prefetch._default_bytes() == 0
    for bad in ("lots", "-1", "1.5"):
        monkeypatch.setenv(prefetch.ENV, bad)
        with pytest.raises(ValueError, match=prefetch.ENV):
            prefetch._default_bytes()


def test_the_mirrors_match_the_kernel() -> None:
    src = KERNEL.read_text()
    assert int(re.search(r"#define L2P_MAX_RANGES (\d+)", src).group(1)) == prefetch.MAX_RANGES
    assert int(re.search(r"#define L2P_CHUNK (\d+)", src).group(1)) == prefetch.CHUNK
    assert prefetch.L2Ranges.n.offset == 16 * prefetch.MAX_RANGES
