"""K per slot when several sequences share each round (the engine's policy).

A round's wall time is the target's forward over every slot's tokens, the
draft's forwards (its catch-up, then one forward per draft position across
the slots still drafting) and the work around them (warping and verifying
each row, picking each draft token: 5 ms a row when sampling without
truncation here). Each piece is a line in the tokens or rows it processes, fitted by discounted least squares to what the
engine's own forwards took (:class:`LineFit`): no cost is guessed once the
engine has run a prompt and a round. Acceptance comes from every slot's
verdicts, pooled per sampling regime (:class:`~specgguf.acceptance.AcceptanceEstimate`).

The choice maximises the batch's expected tokens per second. K = 0 for all
is batched plain decoding, always a candidate: speculation drafts only where
the measured lines say it delivers more. Under load the target's line is
steeper in total tokens than the draft's savings, so K shrinks by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from .acceptance import AcceptanceEstimate
from .policy import expected_tokens


class LineFit:
    """``seconds = a + b * tokens``, by least squares over recent forwards,
    each weight decaying by DECAY per new one. With too little spread in
    the token counts to see the slope, the slope is SLOPE_PRIOR times the
    intercept (a forward of 9 tokens about 1.5x one of 1 on a CPU)."""

    DECAY = 0.97
    SLOPE_PRIOR = 0.06

    def __init__(self) -> None:
        self.w = self.n = self.y = self.nn = self.ny = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        d = self.DECAY
        self.w, self.n, self.y = self.w * d + 1, self.n * d + tokens, self.y * d + seconds
        self.nn, self.ny = self.nn * d + tokens * tokens, self.ny * d + tokens * seconds

    @property
    def known(self) -> bool:
        return self.w > 0

    def line(self) -> tuple:
        """(a, b), or (0, 0) before any forward."""
        if not self.w:
            return 0.0, 0.0
        mn, my = self.n / self.w, self.y / self.w
        var = self.nn / self.w - mn * mn
        if var * self.w < 2.0:  # the counts barely differ: the prior slope
            a = my / (1.0 + self.SLOPE_PRIOR * mn)
            return a, self.SLOPE_PRIOR * a
        b = max(0.0, (self.ny / self.w - mn * my) / var)
        a = my - b * mn
        if a < 0:
            return 0.0, my / mn
        return a, b

    def __call__(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        a, b = self.line()
        return a + b * tokens


@dataclass
class SlotView:
    """What the policy needs of one slot this round.

    Attributes:
        regime: the slot's sampling regime (acceptance is pooled by it).
        cap: the largest K it may draft (its budget, a fixed k, no draft model: 0).
        fixed: the caller fixed K (``cap`` is then that K, and it is kept).
        target_lag: tokens its target cache lacks besides the drafts (1 usually).
        draft_lag: tokens its draft cache lacks (catch-up before its first draft).
        remaining: tokens it may still emit.
        after_miss: its last round ended in a rejection.
    """

    regime: str
    cap: int
    fixed: bool
    target_lag: int
    draft_lag: int
    remaining: int
    after_miss: bool = False


class BatchPolicy:
    """Per-slot K for the engine's rounds, from measured forward costs."""

    PROBE_K = 3           # while a regime's acceptance is unknown, its slots draft this many
    PROBE_EVIDENCE = 16   # draft positions verified before the estimate is trusted
    EXPLORE_EVERY = 48    # rounds without drafting in a regime before it tries again
    HORIZON = 32          # rounds a catch-up's cost is spread over

    def __init__(self, k_max: int = 8) -> None:
        self.k_max = k_max
        self.target, self.draft = LineFit(), LineFit()
        self.rows = LineFit()  # the rest of a round, by the rows verified (each slot's K + 1)
        self.acceptance: Dict[str, AcceptanceEstimate] = {}
        self.idle: Dict[str, int] = {}

    def estimate(self, regime: str, prior: Optional[float] = None,
                 evidence: Optional[dict] = None) -> AcceptanceEstimate:
        """The pooled acceptance of ``regime``, made on first use from a
        measured ``prior`` and stored ``evidence``."""
        if regime not in self.acceptance:
            est = AcceptanceEstimate(self.k_max, prior)
            est.add_before(evidence)
            self.acceptance[regime], self.idle[regime] = est, 0
        return self.acceptance[regime]

    def _gains(self, s: SlotView) -> List[float]:
        """Expected tokens the slot emits at K = 0..cap."""
        return expected_tokens(s.cap, self._acc(s))

    def _acc(self, s: SlotView) -> List[float]:
        est = self.acceptance[s.regime]
        if est.totals()[1] < self.PROBE_EVIDENCE or self.idle[s.regime] >= self.EXPLORE_EVERY:
            return [est.optimistic()] * self.PROBE_K + [0.0] * self.k_max
        return est.per_position(s.after_miss)

    def seconds(self, slots: Sequence[SlotView], ks: Sequence[int]) -> float:
        """Predicted wall time of a round drafting ``ks`` for ``slots``."""
        t = self.target(sum(s.target_lag + k for s, k in zip(slots, ks))) + self.rows(sum(ks) + len(slots))
        drafting = [(s, k) for s, k in zip(slots, ks) if k > 0]
        if drafting:
            lags = [s.draft_lag for s, _ in drafting]
            # A catch-up beyond the usual one or two tokens is paid once, for the rounds that follow.
            extra = self.draft(sum(lags)) - self.draft(sum(min(l, 2) for l in lags))
            t += self.draft(sum(min(l, 2) for l in lags)) + extra / self.HORIZON
            t += sum(self.draft(sum(1 for _, k in drafting if k > j)) for j in range(1, max(k for _, k in drafting)))
        return t

    def choose(self, slots: Sequence[SlotView]) -> List[int]:
        """K for each slot: the best common K, then each slot's own in turn."""
        for s in slots:
            self.estimate(s.regime)
        if not self.target.known:
            return [s.cap if s.fixed else 0 for s in slots]
        gains = [self._gains(s) for s in slots]
        rate = lambda ks: sum(g[k] for g, k in zip(gains, ks)) / max(self.seconds(slots, ks), 1e-9)  # noqa: E731
        best = max((([s.cap if s.fixed else min(k, s.cap) for s in slots]) for k in range(self.k_max + 1)),
                   key=rate)
        for i, s in enumerate(slots):
            if not s.fixed and s.cap > 0:
                best[i] = max(range(s.cap + 1), key=lambda k: rate(best[:i] + [k] + best[i + 1:]))
        return best

    def observe_round(self, target_tokens: int, target_seconds: float, draft_forwards: Sequence[tuple],
                      rows: int, other_seconds: float) -> None:
        """One round's measured pieces: the target's forward over
        ``target_tokens``, each draft forward ``(tokens, seconds)``, and the
        rest of the round, which verified ``rows`` rows."""
        self.target.observe(target_tokens, target_seconds)
        for n, sec in draft_forwards:
            self.draft.observe(n, sec)
        self.rows.observe(rows, other_seconds)

    def observe(self, regime: str, drafted: int, accepted: int, after_miss: bool) -> None:
        """One slot's verdict: ``accepted`` of ``drafted`` tokens."""
        est = self.acceptance[regime]
        if drafted:
            est.observe(drafted if accepted == drafted else accepted + 1, accepted, after_miss)

    def round_done(self, drafted_regimes: set) -> None:
        """Count rounds without drafting per regime (for exploration)."""
        for regime in self.idle:
            self.idle[regime] = 0 if regime in drafted_regimes else self.idle[regime] + 1
            if regime not in drafted_regimes:
                self.acceptance[regime].idle()
