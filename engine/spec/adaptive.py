"""Adaptive draft length: how many tokens to draft next cycle, from measured acceptance and measured cycle cost.

Model (the standard analysis of speculative decoding): if each draft token is accepted with probability a, given
that the ones before it were, a cycle with d drafts yields E(d) = 1 + a + ... + a^d = (1 - a^(d+1)) / (1 - a) tokens
and costs t(d) seconds (one verify pass over 1 + d rows plus d drafting steps). The controller picks d in
[min_draft, max_draft] maximising E(d) / t(d).

t(d) is not a straight line on the GPU: a verify pass jumps in cost where its row count crosses a kernel's tile
(on the H100, 5 rows cost 1.4 ms more than 4), and a line through such costs picks a length past the jump. So t(d)
is the measured mean cycle time of each length timed enough recently; only for the other lengths is it modelled as
t0 + t1 * d, fitted over all timings, or, before two different lengths were timed, the prior t1 / t0 scaled from
the best-timed length (relative 1 + prior_row_cost * d when nothing was timed). With learns_row_cost=False it is
always 1 + prior_row_cost * d. a and every timing sum are exponentially decayed estimates, so they follow a
conversation that moves from copying a file (long n-gram runs accepted) to writing new code (few), and a length
not chosen for a while falls back to the model. When the best d is 0, it still drafts one token every probe_every
cycles so that a recovering acceptance is seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class DraftLengthController:
    """Chooses the number of draft tokens per cycle; feed it every cycle's outcome through update()."""

    max_draft: int
    min_draft: int = 0
    decay: float = 0.9  # weight of the past per cycle: about the last 10 cycles matter
    prior_acceptance: float = 0.5  # belief before any evidence, worth prior_weight draft positions
    prior_weight: float = 2.0
    prior_row_cost: float = 0.1  # t1 / t0 before any timing: one more verify row costs 10 % of a one-token pass
    # decayed timings a length needs before its own mean replaces the model: one fresh cycle, so a length the
    # controller keeps choosing is costed by what it measures, and one it left about 20 cycles ago by the line
    min_timed_weight: float = 1.0
    probe_every: int = 8
    learns_row_cost: bool = True  # False: keep prior_row_cost (e.g. to measure acceptance on a different machine)
    _kept: float = field(default=0.0, init=False)  # decayed count of kept draft positions
    _tried: float = field(default=0.0, init=False)  # decayed count of positions a draft was checked at
    _cost_sums: list[float] = field(default_factory=lambda: [0.0] * 5, init=False)  # decayed w, wd, wdd, wt, wdt
    _timed_weight: list[float] = field(default_factory=list, init=False)  # per d = 0..max_draft: decayed cycles
    _timed_seconds: list[float] = field(default_factory=list, init=False)  # per d: decayed sum of their seconds
    _cycles_without_draft: int = field(default=0, init=False)
    _last_choice: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.min_draft <= self.max_draft:
            raise ValueError(f"draft lengths must satisfy 0 <= min_draft <= max_draft, got {self.min_draft}, "
                             f"{self.max_draft}")
        if not 0 < self.decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {self.decay}")
        if not self.min_timed_weight > 0:
            raise ValueError(f"min_timed_weight must be > 0, got {self.min_timed_weight}")
        self._timed_weight = [0.0] * (self.max_draft + 1)
        self._timed_seconds = [0.0] * (self.max_draft + 1)

    @property
    def acceptance(self) -> float:
        """Estimated probability that a draft token is accepted, given the drafts before it were."""
        return (self._kept + self.prior_acceptance * self.prior_weight) / (self._tried + self.prior_weight)

    @property
    def row_cost(self) -> float:
        """Estimated t1 / t0 of the fitted line: one more drafted token's cost relative to a cycle without drafts."""
        fit = self._fit() if self.learns_row_cost else None
        return self.prior_row_cost if fit is None else fit[1] / fit[0]

    @property
    def last_choice(self) -> int:
        """What choose() returned last (0 before the first call)."""
        return self._last_choice

    def expected_tokens(self, num_draft: int) -> float:
        """E(d): expected tokens a cycle with num_draft drafts emits."""
        a = self.acceptance
        return float(sum(a**k for k in range(num_draft + 1)))

    def cycle_costs(self) -> list[float]:
        """t(d) for d = 0..max_draft, all in one unit: seconds once a cycle was timed, else relative to t(0) = 1."""
        prior = [1.0 + self.prior_row_cost * d for d in range(self.max_draft + 1)]
        if not self.learns_row_cost:
            return prior
        model = self._model_costs(prior)
        return [seconds / weight if weight >= self.min_timed_weight else model[d]
                for d, (weight, seconds) in enumerate(zip(self._timed_weight, self._timed_seconds))]

    def choose(self) -> int:
        """The draft length for the next cycle."""
        costs = self.cycle_costs()
        best = max(range(self.min_draft, self.max_draft + 1),
                   key=lambda d: (self.expected_tokens(d) / costs[d], -d))
        if best == 0 and self.max_draft > 0:
            self._cycles_without_draft += 1
            if self._cycles_without_draft >= self.probe_every:
                self._cycles_without_draft = 0
                best = 1  # probe: acceptance can only be re-measured by drafting
        else:
            self._cycles_without_draft = 0
        self._last_choice = best
        return best

    def update(self, num_drafted: int, num_accepted: int, seconds: float | None = None) -> None:
        """Record a cycle: num_drafted proposed, num_accepted kept, and its wall time when measured."""
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"accepted {num_accepted} of {num_drafted} drafts")
        if num_drafted:
            # positions checked: every kept one, plus the one rejected (unless all were kept)
            tried = num_accepted + (1 if num_accepted < num_drafted else 0)
            self._kept = self.decay * self._kept + num_accepted
            self._tried = self.decay * self._tried + tried
        if seconds is not None and seconds > 0:
            self._record_time(num_drafted, seconds)

    def _record_time(self, num_drafted: int, seconds: float) -> None:
        """Add a timed cycle to the line's sums and to its length's; every length decays, timed or not."""
        d = float(num_drafted)
        sums = self._cost_sums
        for i, value in enumerate((1.0, d, d * d, seconds, d * seconds)):
            sums[i] = self.decay * sums[i] + value
        for k in range(self.max_draft + 1):
            self._timed_weight[k] *= self.decay
            self._timed_seconds[k] *= self.decay
        if num_drafted <= self.max_draft:  # a longer draft than choose() offers only informs the line
            self._timed_weight[num_drafted] += 1.0
            self._timed_seconds[num_drafted] += seconds

    def _fit(self) -> tuple[float, float] | None:
        """(t0, t1) of the weighted least-squares line through the timings, t1 / t0 kept in [0, 10]; None if unfit."""
        w, wd, wdd, wt, wdt = self._cost_sums
        spread = w * wdd - wd * wd  # weighted variance of d (times w^2): 0 until two different d were timed
        if w <= 0 or spread <= 1e-9 * max(w * wdd, 1e-30):
            return None
        t1 = (w * wdt - wd * wt) / spread
        t0 = (wt - t1 * wd) / w
        if t0 <= 0:
            return None
        return t0, t0 * min(max(t1 / t0, 0.0), 10.0)

    def _model_costs(self, prior: list[float]) -> list[float]:
        """t(d) from a line: the fit in seconds, else the prior scaled to the best-timed length, else prior itself."""
        fit = self._fit()
        if fit is not None:
            t0, t1 = fit
            return [t0 + t1 * d for d in range(self.max_draft + 1)]
        weights = self._timed_weight
        anchor = max(range(self.max_draft + 1), key=lambda d: weights[d])
        if weights[anchor] <= 0:
            return prior  # nothing timed: relative costs, and no length has a mean of its own to mix them with
        scale = self._timed_seconds[anchor] / weights[anchor] / prior[anchor]
        return [scale * cost for cost in prior]
