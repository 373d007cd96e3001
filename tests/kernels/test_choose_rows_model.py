"""kernels/sample.cu choose_rows' algorithm, through its numpy model (choose_rows_model.py), against the host's rules
(engine/sampling.py keep_or_resample for a draft, sample() for the row after the drafts) fed the same two uniform
numbers: the same (token, kept) for every row, with top_k and top_p too (ties at the cut, a draft outside the kept
set, top_k 1, a tiny top_p, both with min_p), and the rows whose set does not fit CHOOSE_CAP flagged for the host.
The kernel's own arithmetic is checked on the GPU (bench/gpu_ops.py check_choose_rows)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda import ops
from engine.sampling import SamplingParams, keep_or_resample, sample
from tests.engine.test_sampling import _peaked_logits, _Uniforms
from tests.kernels import choose_rows_model as model

CASES = (SamplingParams(temperature=0.6, top_k=20, top_p=0.95),  # Qwen's recommended setting
         SamplingParams(temperature=0.7, top_p=0.8), SamplingParams(top_k=1), SamplingParams(top_p=1e-9),
         SamplingParams(top_k=50, min_p=0.05), SamplingParams(temperature=0.5, top_k=200, top_p=0.9, min_p=0.01),
         SamplingParams(temperature=1.3, top_k=3000, top_p=0.97),  # a threshold narrowed to fit
         SamplingParams(temperature=0.9, top_p=0.6, min_p=0.2),
         SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, min_p=0.1))


def _host(row: np.ndarray, params: SamplingParams, x: int, u: np.ndarray) -> tuple[int, int]:
    """The host's (token, kept) for a row from the uniforms u [2]."""
    if x < 0:
        return sample(row, params, _Uniforms(u[0])), 0
    kept, token = keep_or_resample(row, params, x, _Uniforms(*u))
    return token, int(kept)


def _device(row: np.ndarray, params: SamplingParams, x: int, u: np.ndarray, cap: int = model.CHOOSE_CAP,
            spread: bool = False):
    """The model's (token, kept): one block's passes, or with spread, choose_rows after its chunks' parts."""
    return model.choose_row(row, x, u, params.temperature, params.min_p, params.top_k, params.top_p, False, cap,
                            spread)


def _drafts(row: np.ndarray, rng: np.random.Generator) -> list[int]:
    """The top token, its runner-up, the 30th, one at random (mostly outside any set), the least likely, none."""
    order = np.argsort(-row, kind="stable")
    return [int(order[0]), int(order[1]), int(order[29]), int(rng.integers(row.shape[0])), int(order[-1]), -1]


@pytest.mark.parametrize("spread", [False, True], ids=["block", "spread"])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("params", CASES, ids=str)
def test_the_kernels_choice_is_the_hosts_for_the_same_uniforms(seed, params, spread):
    row = _peaked_logits(seed)  # logits rounded to 0.1: ties everywhere
    rng = np.random.default_rng(seed)
    for x in _drafts(row, rng):
        for u in rng.random((8, 2)):
            assert _device(row, params, x, u, spread=spread) == _host(row, params, x, u), (x, u)


def test_the_parts_settle_a_peaked_row_and_leave_a_flat_one_to_the_block():
    """choose_kept_of_parts decides Qwen's setting on a peaked row from pass 0's parts (its kept set is the one
    find_last_kept cuts), and leaves a flat row, whose first holding threshold has too many candidates, to the
    block's narrowing passes: same choices as the host either way."""
    params = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
    row = _peaked_logits(0)
    w = np.exp(np.subtract(row, row.max(), dtype=np.float32) / np.float32(0.6))
    kept = model.kept_of_parts(w, 20, 0.95)
    last = model.last_kept(w, 20, 0.95)
    assert kept is not None and 1 <= len(kept) <= 20
    assert (w[kept[-1]], int(kept[-1])) == last
    flat = (np.random.default_rng(4).standard_normal(20_000) * 0.05).astype(np.float32)
    wf = np.exp(np.subtract(flat, flat.max(), dtype=np.float32) / np.float32(0.6))
    assert model.kept_of_parts(wf, 20, 0.95) is None
    rng = np.random.default_rng(5)
    for r in (row, flat):
        for x in _drafts(r, rng):
            for u in rng.random((4, 2)):
                assert _device(r, params, x, u, spread=True) == _host(r, params, x, u), (x, u)


def test_ties_at_the_cut_keep_the_lower_ids():
    """Four tokens tied at the top_k cut: top_k 3 keeps the two above and the lowest id of the tie; a draft with a
    higher id of the tie is outside the set (it is never kept, and its row draws with the second uniform)."""
    row = np.full(1000, -5.0, np.float32)
    row[[40, 7]] = [3.0, 2.0]
    row[[900, 300, 12, 555]] = 1.0
    w = np.exp((row - row.max()).astype(np.float32))
    assert model.last_kept(w, 3, 1.0) == (w[12], 12)
    # a top_p that cuts inside the tie too: past the mass of 40 and 7, within that of one tied token more
    masses = np.cumsum(np.sort(w)[::-1], dtype=np.float64)
    top_p = float(masses[1] + masses[2]) / 2 / float(w.sum(dtype=np.float64))
    assert model.last_kept(w, 0, top_p) == (w[12], 12)
    for params in (SamplingParams(top_k=3), SamplingParams(top_p=top_p), SamplingParams(top_k=6, top_p=0.75)):
        for x in (12, 300, 900, 40, -1):
            for u in np.linspace(0.01, 0.99, 23):
                uu = np.array([u, 1.0 - u])
                got = _device(row, params, x, uu)
                assert got == _host(row, params, x, uu), (params, x, u)
                assert got[0] in (40, 7, 12) and (got[1] == 0 or x == 12 or x == 40)


def test_top_k_1_keeps_the_lowest_id_of_a_tie_at_the_top():
    row = np.linspace(-3, 0, 5000, dtype=np.float32)
    row[[4000, 17]] = 9.0
    for x in (17, 4000, 4999, -1):
        got = _device(row, SamplingParams(top_k=1), x, np.array([0.999, 0.5]))
        assert got == ((17, 1) if x == 17 else (17, 0))


def test_a_set_past_the_capacity_is_the_hosts_and_a_flat_row_narrows_to_fit():
    """top_p 0.95 of a flat row holds most of its 20,000 tokens: the row is flagged -2 (the host chooses it). top_k
    20 of the same row has every token within 16x of the top: the threshold is narrowed until 20+ candidates and at
    most CHOOSE_CAP remain, and the choice is the host's; with a capacity of 64 as well."""
    rng = np.random.default_rng(4)
    row = (rng.standard_normal(20_000) * 0.05).astype(np.float32)
    u = np.array([0.3, 0.6])
    assert _device(row, SamplingParams(top_p=0.95), 5, u) == (-2, 0)
    assert _device(row, SamplingParams(top_p=0.95), -1, u) == (-2, 0)
    w = np.exp(np.subtract(row, row.max(), dtype=np.float32) / np.float32(0.6))
    assert (w >= 1 / 16).sum() > model.CHOOSE_CAP  # the first threshold that holds 20 has too many
    params = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
    for cap in (model.CHOOSE_CAP, 64):
        thr, num, _ = model.find_threshold(w, 20, 0.95, cap)
        assert 20 <= num <= cap and thr > w.min()
        for x in _drafts(row, rng):
            for uu in rng.random((6, 2)):
                assert _device(row, params, x, uu, cap) == _host(row, params, x, uu), (cap, x, uu)
    # top_p 0.95 of the top, 100 tokens of weight 1/2 and 1,000 of 1/100: short of the set with 101 candidates
    # already, so past a capacity of 64 (though top_p of the mass, 58, would fit in it)
    steps = np.log(np.array([1.0] + [0.5] * 100 + [0.01] * 1000, np.float32))
    for x in (0, 1, 500, -1):
        assert _device(steps, SamplingParams(top_p=0.95), x, u, cap=64) == (-2, 0)
        assert _device(steps, SamplingParams(top_p=0.95), x, u) == _host(steps, SamplingParams(top_p=0.95), x, u)
    # a tie of 100 at the top cannot be split to fit 64 candidates
    row[rng.choice(20_000, 100, replace=False)] = 1.0
    assert _device(row, SamplingParams(top_k=20), 3, u, cap=64) == (-2, 0)
    assert _device(row, SamplingParams(top_k=20), 3, u)[0] >= 0


def test_a_top_k_past_the_tokens_with_weight_keeps_them_all():
    """top_k 5000 of 1,000 tokens (some at -inf, some whose weight is 0 in float32): every token with a weight."""
    row = np.linspace(-200, 0, 1000).astype(np.float32)
    row[:10] = -np.inf
    rng = np.random.default_rng(1)
    for params in (SamplingParams(top_k=5000), SamplingParams(temperature=2.0, top_k=5000, top_p=0.999_999)):
        for x in (999, 998, 500, 5, -1):
            for u in rng.random((6, 2)):
                assert _device(row, params, x, u) == _host(row, params, x, u), (params, x, u)


def test_the_rows_the_kernel_refuses():
    row = np.zeros(300, np.float32)
    u = np.array([0.5, 0.5])
    for bad in (np.nan, -np.inf):
        r = row.copy()
        r[7] = bad
        if bad == -np.inf:
            r[:] = -np.inf
        assert _device(r, SamplingParams(top_k=5), 1, u) == (-1, 0)
    r = row.copy()
    r[9] = np.inf
    assert _device(r, SamplingParams(top_p=0.5), 1, u) == (-2, 0)  # the host's float64 path
    assert model.choose_row(r, 9, u, 0.0, 0.0, 5, 0.5, True) == (9, 1)  # greedy: the argmax, whatever it is


def test_the_capacity_is_the_same_number_in_the_kernel_and_in_python():
    assert ops.CHOOSE_CAP == model.CHOOSE_CAP == 4096


def test_the_parts_layout_is_the_same_in_the_kernel_and_in_python():
    """ops.CHOOSE_PARTS_BYTES and CHOOSE_CHUNKS are sample.cu's (the kernel asserts its struct's size against the
    same number, so a field added there fails its compile until both move)."""
    import re

    source = (model.nvrtc.KERNEL_DIR / "sample.cu").read_text()
    assert int(re.search(r"#define CHOOSE_PARTS_BYTES (\d+)", source).group(1)) == ops.CHOOSE_PARTS_BYTES
    assert int(re.search(r"#define CHOOSE_CHUNKS (\d+)", source).group(1)) == ops.CHOOSE_CHUNKS
