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
