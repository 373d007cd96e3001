"""Adaptive draft length: how many tokens to draft next cycle, from measured acceptance and measured cycle cost.

Model (the standard analysis of speculative decoding): if each draft token is accepted with probability a, given
that the ones before it were, a cycle with d drafts yields E(d) = 1 + a + ... + a^d = (1 - a^(d+1)) / (1 - a) tokens
and costs t(d) = t0 + t1 * d seconds (one verify pass over 1 + d rows plus d drafting steps). The controller picks
d in [min_draft, max_draft] maximising E(d) / t(d). Both a and (t0, t1) are exponentially decayed estimates, so
they follow a conversation that moves from copying a file (long n-gram runs accepted) to writing new code (few).
When the best d is 0, it still drafts one token every probe_every cycles so that a recovering acceptance is seen.
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
    probe_every: int = 8
    learns_row_cost: bool = True  # False: keep prior_row_cost (e.g. to measure acceptance on a different machine)
    _kept: float = field(default=0.0, init=False)  # decayed count of kept draft positions
    _tried: float = field(default=0.0, init=False)  # decayed count of positions a draft was checked at
    _cost_sums: list[float] = field(default_factory=lambda: [0.0] * 5, init=False)  # decayed w, wd, wdd, wt, wdt
    _cycles_without_draft: int = field(default=0, init=False)
    _last_choice: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.min_draft <= self.max_draft:
            raise ValueError(f"draft lengths must satisfy 0 <= min_draft <= max_draft, got {self.min_draft}, "
                             f"{self.max_draft}")
        if not 0 < self.decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {self.decay}")

    @property
    def acceptance(self) -> float:
        """Estimated probability that a draft token is accepted, given the drafts before it were."""
        return (self._kept + self.prior_acceptance * self.prior_weight) / (self._tried + self.prior_weight)

    @property
    def row_cost(self) -> float:
        """Estimated t1 / t0: the cost of one more drafted token relative to a cycle without drafts."""
        w, wd, wdd, wt, wdt = self._cost_sums
        if not self.learns_row_cost:
            return self.prior_row_cost
        spread = w * wdd - wd * wd  # weighted variance of d (times w^2): 0 until two different d were timed
        if w <= 0 or spread <= 1e-9 * max(w * wdd, 1e-30):
            return self.prior_row_cost
        t1 = (w * wdt - wd * wt) / spread
        t0 = (wt - t1 * wd) / w
        if t0 <= 0:
            return self.prior_row_cost
        return min(max(t1 / t0, 0.0), 10.0)

    @property
    def last_choice(self) -> int:
        """What choose() returned last (0 before the first call)."""
        return self._last_choice

    def expected_tokens(self, num_draft: int) -> float:
        """E(d): expected tokens a cycle with num_draft drafts emits."""
        a = self.acceptance
        return float(sum(a**k for k in range(num_draft + 1)))

    def choose(self) -> int:
        """The draft length for the next cycle."""
        cost = self.row_cost
        best = max(range(self.min_draft, self.max_draft + 1),
                   key=lambda d: (self.expected_tokens(d) / (1.0 + cost * d), -d))
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
            d = float(num_drafted)
            sums = self._cost_sums
            for i, value in enumerate((1.0, d, d * d, seconds, d * seconds)):
                sums[i] = self.decay * sums[i] + value
