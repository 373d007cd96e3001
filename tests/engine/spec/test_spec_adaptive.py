"""Adaptive draft length: follows measured acceptance and measured cycle cost."""

from __future__ import annotations

import pytest

from engine.spec.adaptive import DraftLengthController


def feed(controller: DraftLengthController, cycles: int, acceptance: float, cost0: float = 1.0,
         cost1: float = 0.1) -> None:
    """Cycles at the controller's own choices whose drafts are kept at the given per-token rate (deterministically:
    the expected number kept, rounded) and whose time is cost0 + cost1 * d."""
    for _ in range(cycles):
        d = max(controller.choose(), 1)
        kept = 0
        while kept < d and (kept + 1) <= acceptance * d + 1e-9:
            kept += 1
        controller.update(d, kept, cost0 + cost1 * d)


def test_high_acceptance_drafts_the_most() -> None:
    controller = DraftLengthController(max_draft=6)
    feed(controller, 40, acceptance=1.0)
    assert controller.acceptance > 0.95
    assert controller.choose() == 6


def test_no_acceptance_stops_drafting_but_probes() -> None:
    controller = DraftLengthController(max_draft=6, probe_every=5)
    for _ in range(40):
        d = controller.choose() or 1
        controller.update(d, 0, 1.0 + 0.1 * d)
    choices = [controller.choose() for _ in range(10)]
    assert choices.count(0) == 8 and choices.count(1) == 2  # one probe every 5 cycles
    assert controller.acceptance < 0.1


def test_expensive_rows_shorten_the_draft() -> None:
    cheap, dear = DraftLengthController(max_draft=8), DraftLengthController(max_draft=8)
    for controller, cost1 in ((cheap, 0.05), (dear, 0.4)):
        for d in [1, 2, 4, 8] * 10:  # time cycles at several lengths so the cost line is measurable
            controller.update(d, int(0.7 * d), 1.0 + cost1 * d)
    assert cheap.row_cost == pytest.approx(0.05, rel=0.05)
    assert dear.row_cost == pytest.approx(0.4, rel=0.05)
    assert cheap.acceptance == pytest.approx(dear.acceptance)
    assert cheap.choose() > dear.choose() >= 1


def test_prior_cost_when_not_learning() -> None:
    controller = DraftLengthController(max_draft=4, prior_row_cost=0.1, learns_row_cost=False)
    for d in [1, 4] * 10:
        controller.update(d, 0, 1.0 + 5.0 * d)
    assert controller.row_cost == 0.1


def test_expected_tokens_formula() -> None:
    controller = DraftLengthController(max_draft=4, prior_acceptance=0.5, prior_weight=1.0)
    assert controller.acceptance == 0.5
    assert controller.expected_tokens(0) == 1.0
    assert controller.expected_tokens(3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="min_draft"):
        DraftLengthController(max_draft=2, min_draft=3)
    with pytest.raises(ValueError, match="decay"):
        DraftLengthController(max_draft=2, decay=1.0)
    with pytest.raises(ValueError, match="accepted 3 of 2"):
        DraftLengthController(max_draft=2).update(2, 3)


# ms per cycle on an H100 (verify over d + 1 rows, commit, d MTP drafts): the 5-row verify jumps by 1.4 ms
H100_CYCLE_MS = [7.9, 8.71, 9.39, 9.82, 11.79]


def pinned(acceptance: float, **kwargs: object) -> DraftLengthController:
    """A controller whose acceptance stays at the given value: the prior outweighs any cycle fed to it."""
    return DraftLengthController(max_draft=4, prior_acceptance=acceptance, prior_weight=1e9, **kwargs)


def time_lengths(controller: DraftLengthController, cycle_ms: dict[int, float], rounds: int) -> None:
    """Rounds of one cycle at each listed length, none of its drafts kept, taking cycle_ms[d] milliseconds."""
    for _ in range(rounds):
        for d, ms in cycle_ms.items():
            controller.update(d, 0, ms / 1000)


def test_measured_costs_beat_the_line_through_them() -> None:
    controller = pinned(0.86)
    time_lengths(controller, dict(enumerate(H100_CYCLE_MS)), rounds=10)
    assert controller.acceptance == pytest.approx(0.86, abs=1e-6)
    tokens = [controller.expected_tokens(d) for d in range(5)]  # 1, 1.86, 2.60, 3.24, 3.78
    assert controller.cycle_costs() == pytest.approx([ms / 1000 for ms in H100_CYCLE_MS])
    # tokens per ms: d=3 329.5 > d=4 320.8 on the measured costs ...
    assert controller.choose() == 3
    # ... but the line fitted through the same timings (t0 7.7 ms, t1 0.89 ms) puts d=4 first, 335 vs 311
    line = controller.row_cost
    assert max(range(5), key=lambda d: tokens[d] / (1 + line * d)) == 4


def test_a_length_left_untimed_falls_back_to_the_line() -> None:
    controller = pinned(0.86)
    line_ms = {d: 8.0 + 0.5 * d for d in range(4)}
    time_lengths(controller, {**line_ms, 4: 20.0}, rounds=4)  # d=4 measured slow (say, while something else ran)
    time_lengths(controller, line_ms, rounds=1)
    assert controller.cycle_costs()[4] == pytest.approx(0.020)  # still its own mean: weight 2.15 * 0.9^4 = 1.41
    assert controller.choose() == 3
    time_lengths(controller, line_ms, rounds=10)  # 40 more cycles without d=4: weight 1.41 * 0.9^40 = 0.02
    # the line, t0 + 4 t1, with the old 20 ms timings all but decayed out of it
    assert controller.cycle_costs()[4] == pytest.approx(0.010, rel=0.02)
    assert controller.choose() == 4  # 3.78 tokens / 10 ms beats 3.24 / 9.5 ms: worth measuring d=4 again


def test_prior_scaled_to_the_one_timed_length() -> None:
    controller = pinned(0.5, prior_row_cost=0.1)
    assert controller.cycle_costs() == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])  # nothing timed: relative
    time_lengths(controller, {2: 12.0}, rounds=3)
    assert controller.row_cost == 0.1  # one length gives no line
    assert controller.cycle_costs() == pytest.approx([0.010, 0.011, 0.012, 0.013, 0.014])  # all in seconds


def test_fixed_row_cost_ignores_timings() -> None:
    fixed, learning = pinned(0.86, learns_row_cost=False), pinned(0.86)
    for controller in (fixed, learning):
        time_lengths(controller, {0: 7.9, 1: 8.7, 2: 9.4, 3: 9.8, 4: 100.0}, rounds=10)
    assert fixed.cycle_costs() == [1.0 + 0.1 * d for d in range(5)]
    assert fixed.choose() == 4  # 3.78 / 1.4 beats 3.24 / 1.3, whatever d=4 took
    assert learning.choose() == 3
