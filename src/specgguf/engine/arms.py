"""What a round at each draft length K costs: measured round times, and the prior for a K not timed yet.

:class:`Arms` keeps, per K = 0..k_max, discounted sums of this run's round
wall times (the "arms" of the bandit in :mod:`specgguf.engine.policy`),
relative to one speed every K shares. :class:`CostModel` is the prior a K
not timed yet borrows its shape from: stored round times of an earlier run,
or the built-in one. Nothing here touches models, files or the clock.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence

@dataclass
class CostModel:
    """A prior for a round's cost, in one unit (seconds, or relative to T(1)).

    ``draft``: a draft forward within a round (``draft_first``: a round's
    first, None: the same); ``target[b - 1]``: a target forward over b
    tokens (longer batches extrapolate linearly); ``draft_prefill``: per
    token the draft catches up on after plain rounds; ``rounds[k]``: a whole
    round at K = k as an earlier run measured it (replaces draft + target);
    ``seconds``: the unit is seconds. The default is conservative: a draft
    token at 0.4 of a target token, a batch of b at 1 + 0.2 (b - 1).
    """

    draft: float = 0.4
    target: List[float] = field(default_factory=lambda: [1.0 + 0.2 * b for b in range(9)])
    seconds: bool = False
    draft_prefill: float = 0.1
    draft_first: Optional[float] = None
    rounds: Optional[List[float]] = None

    def draft_cost(self, k: int) -> float:
        first = self.draft if self.draft_first is None else self.draft_first
        return 0.0 if k <= 0 else first + (k - 1) * self.draft

    def target_cost(self, b: int) -> float:
        t = self.target
        return t[b - 1] if b <= len(t) else t[-1] + ((t[-1] - t[-2]) if len(t) > 1 else t[-1]) * (b - len(t))

    def round_cost(self, k: int) -> float:
        if self.rounds and k < len(self.rounds):
            return self.rounds[k]
        return self.draft_cost(k) + self.target_cost(k + 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        rounds = d.get("rounds")
        if rounds is not None and (not rounds or any(not float(x) > 0 for x in rounds)):
            raise ValueError(f"round times must be positive, got {rounds!r}")
        return cls(draft=float(d["draft"]), target=[float(x) for x in d["target"]],
                   seconds=bool(d.get("seconds", False)),
                   draft_prefill=float(d.get("draft_prefill", 0.5 * float(d["draft"]))),
                   draft_first=None if d.get("draft_first") is None else float(d["draft_first"]),
                   rounds=None if rounds is None else [float(x) for x in rounds])


class Arms:
    """What rounds at each K = 0..k_max delivered in this run.

    Args:
        priors: cost models an untimed K borrows its shape from (the cheapest wins).
    """

    MEMORY = 0.9    # per round at that K: a mean over about its last ten rounds
    RECENCY = 0.98  # per round, on the counts exploration reads: a K untried for ~50 rounds is retried
    FOLLOW = 0.5    # how far one timed round moves the speed every K shares

    def __init__(self, k_max: int, priors: Sequence[CostModel]) -> None:
        self.priors = list(priors)
        n = k_max + 1
        self.seconds, self.timed = [0.0] * n, [0.0] * n   # discounted sums of timed rounds
        self.recent = [0.0] * n                            # rounds at K, discounted every round
        self.catchup: Optional[float] = None               # seconds per token caught up (EMA)
        self.catchup_lag = 0.0                             # the lags it was measured at (EMA)
        # Each K's times are kept relative to a speed all K share: a busy
        # spell or a slower process moves every K alike. Kept raw, the K
        # drafted through a spell looked slow against a stale plain time, and
        # the policy stopped drafting for the spell (simulator: 0.89 of the best K).
        self.speed = 1.0
        self.repricing: set = set()  # K aged by age(): their next timing moves their price, not the speed
        self._fit: Optional[tuple] = None  # (_fit_line(),), kept until a round is timed

    def observe(self, k: int, seconds: Optional[float]) -> None:
        """A round at K = k that took ``seconds`` (None: not timed)."""
        self.recent = [r * self.RECENCY for r in self.recent]
        self.recent[k] += 1.0
        if seconds is not None and seconds > 0:
            if self.timed[k] and k not in self.repricing:
                self.speed *= (seconds / self.time(k)) ** self.FOLLOW
            self.repricing.discard(k)
            self.seconds[k] = self.seconds[k] * self.MEMORY + seconds / self.speed
            self.timed[k] = self.timed[k] * self.MEMORY + 1.0
            self._fit = None

    def observe_catchup(self, seconds: float, tokens: int) -> None:
        per = seconds / tokens
        if self.catchup is None:
            self.catchup, self.catchup_lag = per, float(tokens)
        else:
            self.catchup += 0.3 * (per - self.catchup)
            self.catchup_lag += 0.3 * (tokens - self.catchup_lag)

    def time(self, k: int) -> float:
        """S(k) in seconds (or the priors' unit before any round is timed)."""
        if k == 0 and self.timed[0]:
            return self.speed * self.seconds[0] / self.timed[0]
        line = self._line()
        if line is not None and k > 0:
            # A drafting round costs at least a plain one: a line steep between two
            # close K (one timed in a busy spell) crossed zero below them.
            return max(self.speed * (line[0] + line[1] * k), self.time(0))
        ref = max((j for j, n in enumerate(self.timed) if n), key=lambda j: (self.timed[j], -abs(j - k)), default=None)
        if ref is None:
            return self._prior(k, 0) * self.priors[0].round_cost(0)
        return self.speed * self.seconds[ref] / self.timed[ref] * self._prior(k, ref)

    def _line(self) -> Optional[tuple]:
        if self._fit is None:
            self._fit = (self._fit_line(),)
        return self._fit[0]

    def _fit_line(self) -> Optional[tuple]:
        """(a, b): S(k) = a + b k for k >= 1 (relative to the shared speed),
        fitted to the K timed, weighted by their rounds; None below two K.
        Measured here and on a board, S is close to a line past K = 0 (the
        draft's first forward is the jump from 0); fitted, a K timed once in
        a busy spell cannot look 30% slower than its neighbours for good."""
        pts = [(j, self.seconds[j] / n, n) for j, n in enumerate(self.timed) if j and n]
        if len(pts) == 1 and self.timed[0]:  # one drafting K timed: the line through plain decoding
            pts.append((0, self.seconds[0] / self.timed[0], self.timed[0]))
        if len(pts) < 2:
            return None
        w = sum(n for _, _, n in pts)
        mk, mv = sum(j * n for j, _, n in pts) / w, sum(v * n for _, v, n in pts) / w
        var = sum(n * (j - mk) ** 2 for j, _, n in pts)
        b = max(0.0, sum(n * (j - mk) * (v - mv) for j, v, n in pts) / var)
        return mv - b * mk, b

    def _prior(self, k: int, ref: int) -> float:
        """The cheapest prior's S(k) / S(ref): a guess must not keep a K from being tried."""
        return min(p.round_cost(k) / p.round_cost(ref) for p in self.priors)

    def catchup_cost(self, lag: int) -> float:
        """Seconds for the draft to catch up on ``lag`` tokens (beyond a round's usual two).

        A forward's cost per token falls as its batch grows (its fixed part
        is shared): a rate measured at a lag of 3 (35 ms, 12 ms a token
        here) priced a chat prompt's 40 at 0.44 s where it costs about 0.15,
        and a chat never drafted. So past the lags it was measured at, each
        further token costs the prior's per-token rate, if lower."""
        prior = min(p.draft_prefill / p.round_cost(0) for p in self.priors) * self.time(0)
        if self.catchup is None:
            return lag * prior
        seen = max(1.0, self.catchup_lag)
        return min(lag, seen) * self.catchup + max(0.0, lag - seen) * min(self.catchup, prior)

    def unspanned(self) -> int:
        """K = k_max while no K of the upper half has been timed, else K = 1
        while none of the lower half has, else 0. Until both halves are
        timed, the K of the other half are priced off a line through close K,
        or through plain decoding with the step to K = 1 (the draft's first
        forward) in its slope. Two K=2 rounds at 38 ms against a plain 15 priced
        K=8 at 127 (it takes about 80), and since nothing ever drafted a long K
        again, drafting stayed at K=0-1 for good (simulator, a Zen 5 trace:
        0.70 of the best K). So a drafting policy times both ends once:
        measured, not guessed."""
        k_max = len(self.timed) - 1
        half = k_max // 2
        if not any(self.timed[half + 1:]):
            return k_max
        return 1 if not any(self.timed[1:half + 1]) else 0

    def age(self, f: float) -> None:
        """Scale the drafting K's timed rounds by ``f``: prices measured before
        a long plain stretch count for less than the next ones, and the next
        timing of each moves its own price, not the speed every K shares (a
        K=8 round faster than its old price was read as the whole machine
        speeding up, and the price stayed)."""
        for k in range(1, len(self.timed)):
            self.seconds[k] *= f
            self.timed[k] *= f
        self.repricing = set(range(1, len(self.timed)))
        self._fit = None

    def prior_time(self, k: int) -> float:
        """S(k) at the cheapest prior's shape, anchored at plain decoding's time."""
        return self.time(0) * self._prior(k, 0)

    def bonus(self, k: int) -> float:
        """The upper-confidence term for K = k, relative to its rate."""
        return math.sqrt(math.log(1.0 + sum(self.recent)) / (1.0 + self.recent[k]))

    def source(self) -> str:
        """Where the round times come from, for users."""
        timed = sum(1 for n in self.timed if n)
        if timed:
            return f"round times of {timed} draft lengths measured in this process"
        return "stored round times" if self.priors[0].seconds else "the built-in cost prior"

    def record(self) -> CostModel:
        """What to store for later runs: this run's round times (a prior there)."""
        return CostModel(seconds=True, rounds=[self.time(k) for k in range(len(self.timed))],
                         draft_prefill=self.catchup_cost(1))


def priors(costs: Optional[CostModel], online: bool) -> List[CostModel]:
    """The cost models untimed K borrow from: stored ``costs`` and the
    built-in prior, the cheaper winning; a clock-blind policy (not
    ``online``) can never measure, so it keeps to a record of seconds."""
    if costs is None:
        return [CostModel()]
    return [costs] if costs.seconds and not online else [costs, CostModel()]
