"""How many tokens to draft each round (``k="auto"``): a small bandit over K.

A round that drafts K tokens emits E(K) = 1 + a_0 + a_0 a_1 + ... tokens, a_i
the chance the i-th draft token is accepted given the ones before it were
(Leviathan et al.), and takes S(K) seconds of wall time: the draft's forwards,
the target's batched forward, warp, verify and Python. K = 0 is plain
decoding. The policy drafts the K with the most tokens per second,
E(K) / S(K), judged by what rounds delivered, not by modelled parts:

* :class:`Arms` keeps, per K, discounted sums of this run's round wall
  times, relative to one speed every K shares (a busy spell or a slower
  process moves every K alike). A K not timed yet lies on the line fitted
  through the timed ones; before two are timed, it borrows the shape of a
  :class:`CostModel` prior (stored round times, or the built-in one:
  whichever is cheaper, so no record keeps a K from being measured).
* :class:`~specgguf.engine.acceptance.AcceptanceEstimate` pools every round's
  verdicts per draft position, so E(K) of a K rarely drafted is known from
  the others (a K's own tokens, tried as well, chased the text a K happened
  to meet); a round after a rejection has its own first position.
* Exploration: an upper-confidence bonus for K timed rarely or long ago
  (counts discounted every round, so drift is followed); one plain round in
  ``BASELINE_EVERY`` re-times plain decoding; from plain decoding, a probe
  only when the optimistic acceptance says the draft could pay and the
  tokens left would repay the draft's catch-up; while drafting, K = k_max
  once and K = 1 once, so that no K is priced for good off a line drawn
  through close K (:meth:`Arms.unspanned`); after a long plain stretch,
  drafting is priced again (:meth:`DraftPolicy.retry`).
* The guard: when the last few drafting rounds delivered under ``GUARD`` of
  plain decoding's rate, drafting stops and the acceptance counts are
  mostly forgotten.

Nothing here touches models, files or the clock: the caller reports each
round (:meth:`DraftPolicy.update`) and asks for the next K (:meth:`DraftPolicy.choose`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence

from .acceptance import AcceptanceEstimate, ConfidenceBins
from ..checks import check_p_min


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


class Delivered:
    """Tokens recent drafting rounds delivered against what they cost (seconds,
    or the tokens the estimate expected of them), each decayed per round."""

    MEMORY = 0.8  # per drafting round: about the last five

    def __init__(self) -> None:
        self.tokens = self.cost = self.rounds = 0.0

    def add(self, tokens: float, cost: float) -> None:
        m = self.MEMORY
        self.tokens, self.cost, self.rounds = self.tokens * m + tokens, self.cost * m + cost, self.rounds * m + 1

    def below(self, rate: float) -> bool:
        """Whether, over three rounds' worth at least, they delivered under ``rate`` tokens per unit of cost."""
        return self.rounds >= 3 and self.tokens / self.cost < rate


def expected_tokens(k_max: int, acc: Sequence[float]) -> List[float]:
    """E(k) for k = 0..k_max from per-position acceptances."""
    out, e, run = [1.0], 1.0, 1.0
    for a in acc[:k_max]:
        run *= a
        e += run
        out.append(e)
    return out


def why_line(rates: Sequence[float], totals: tuple, costs: str, qualifier: str = "") -> str:
    """A policy's one line for users: the K it would draft (or that drafting
    is off) and its predicted speed against plain decoding, every K's, the
    draft's acceptance ``totals`` (accepted, verified) and ``costs``, where
    the round times come from. ``rates``: tokens per second for K = 0..k_max."""
    r = rates
    best = max(range(1, len(r)), key=lambda k: (r[k], -k))
    head = (f"K={best} is predicted at {r[best] / r[0]:.2f}x plain decoding" if r[best] > r[0] else
            f"drafting off: the best draft length, K={best}, is predicted at {r[best] / r[0]:.2f}x plain decoding")
    acc, ver = totals
    known = f"draft acceptance {acc / ver:.2f} over {ver:.0f} positions" if ver else "no acceptance known yet"
    ks = " ".join(f"{k}:{r[k] / r[0]:.2f}" for k in range(1, len(r)))
    return f"{head}{qualifier} (K {ks}); {known}; {costs}"


class Retries:
    """When a policy gone plain prices drafting again (:meth:`DraftPolicy.retry`):
    after WAIT plain rounds in a row; each try that finds drafting still
    losing doubles the wait, up to MAX, and drafting on its merits resets it."""

    WAIT = 64
    MAX = 1024
    AGE = 0.1  # what a retry keeps of the drafting K's earlier round times

    def __init__(self) -> None:
        self.plain_run = 0      # plain rounds in a row
        self.wait = self.WAIT   # the plain_run that makes a retry due
        self.pending = False    # a retry's probe ran: the next round with no catch-up times K = k_max

    def due(self) -> bool:
        return self.plain_run >= self.wait

    def start(self) -> None:
        self.wait, self.pending = min(2 * self.wait, self.MAX), True

    def take_timed_round(self) -> bool:
        """Whether a retry's probe ran and its timed round is still to come (then it is taken)."""
        pending, self.pending = self.pending, False
        return pending

    def on_merits(self) -> None:
        self.wait = self.WAIT

    def round(self, drafted: int) -> None:
        self.plain_run = self.plain_run + 1 if drafted == 0 else 0


class DraftPolicy:
    """The choice of K each round, and of the draft confidence cutoff ``p_min``.

    Args:
        k_max: largest draft length considered.
        costs: stored costs (a prior for untimed K); None: the built-in prior.
        online_costs: time rounds; False keeps to the priors (a seeded run
            with p/q verification must not read the clock).
        decay: per-round decay of the acceptance counts (None: DECAY).
        p_min: None (no cutoff), a float, or "auto" (learned from the draft's confidence).
        prior: the draft's per-token acceptance measured beforehand; None: none.
        retime: re-time plain decoding every BASELINE_EVERY rounds; False
            for a policy whose plain rounds another policy asks for (a lookup's
            in front of a draft model: see :mod:`specgguf.engine.lookup_first`).
    """

    DECAY = 0.95          # per round, on the acceptance counts: a memory of about 20 rounds
    BASELINE_EVERY = 32   # one plain round this often while drafting: the guard needs a fresh T(1)
    DRAFT_MARGIN = 1.10   # from plain decoding, draft when expected to win by this (it pays a catch-up)
    STAY_MARGIN = 1.0     # once drafting, stop when expected to lose at all
    EXPLORE = 0.03        # the upper-confidence bonus's scale, relative to a K's rate
    PROBE_K = 3           # drafts per probe: the catch-up dominates its cost, so learn several
    PROBE_MARGIN = 1.10   # probe only if the draft could beat plain decoding by this
    GUARD = 0.7           # stop when recent drafting rounds delivered below this times plain's rate
    FORGET = 0.2          # what is kept of the acceptance counts when the guard fires
    HORIZON = 100         # tokens left when the caller cannot say (DraftModel): without one, each
                          # probe at T=0.8 caught up on a whole previous answer, 0.85x plain
    PROBE_ODDS = 0.2      # the chance a probe finds the optimistic acceptance: its catch-up is weighed against it

    def __init__(self, k_max: int = 8, costs: Optional[CostModel] = None, *, online_costs: bool = False,
                 decay: Optional[float] = None, p_min=None, prior: Optional[float] = None,
                 retime: bool = True) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max, self.online, self.retime = k_max, online_costs, retime
        self.arms = Arms(k_max, priors(costs, online_costs))
        self.acceptance = AcceptanceEstimate(k_max, prior, self.DECAY if decay is None else decay)
        self.by_confidence = ConfidenceBins()
        self.p_min_setting = check_p_min(p_min)
        self.drafting = False  # the last choice, before re-timing, was to draft
        self.since_plain = 0   # rounds since the last plain one
        self.lag = 0           # the lag the last choice was made at
        self.after_miss = False  # the last round ended in a rejection (see acceptance.Counts)
        self.delivered = Delivered()  # what recent timed drafting rounds delivered: the guard reads it
        self.retries = Retries()

    def rates(self, acc: Optional[Sequence[float]] = None, time=None) -> List[float]:
        """Expected tokens per second (or per unit) for K = 0..k_max, at
        per-position acceptances ``acc`` (None: the estimate's) and round
        times ``time(k)`` (None: the measured ones, :meth:`Arms.time`)."""
        e = expected_tokens(self.k_max, self.acceptance.per_position(self.after_miss) if acc is None else acc)
        return [e[k] / (time or self.arms.time)(k) for k in range(self.k_max + 1)]

    def best_k(self) -> int:
        """The K with the best expected rate (0 unless drafting is expected to win at all)."""
        return self._best(self.rates())

    def _best(self, r: Sequence[float]) -> int:
        k = max(range(1, self.k_max + 1), key=lambda k: (r[k], -k))
        return k if r[k] > r[0] else 0

    def repays(self, k: int, remaining: Optional[int], lag: int, r: Sequence[float], odds: float = 1.0) -> bool:
        """Whether drafting k over the ``remaining`` tokens (None: HORIZON)
        saves more (times ``odds``) than the draft's catch-up on ``lag``
        tokens costs (a long prompt before a short answer may not be worth it)."""
        if lag <= 2:
            return True
        left = self.HORIZON if remaining is None else remaining
        return odds * left * (1.0 / r[0] - 1.0 / r[k]) > self.arms.catchup_cost(lag - 2)

    def choose(self, remaining: Optional[int] = None, lag: int = 0) -> int:
        """K for the next round; ``remaining``: tokens left to generate (None:
        unknown); ``lag``: tokens the draft has not evaluated."""
        self.lag = lag
        r = self.rates()
        explore = [x * (1.0 + self.EXPLORE * self.arms.bonus(k)) for k, x in enumerate(r)] if self.online else r
        k = max(range(1, self.k_max + 1), key=lambda k: (explore[k], -k))
        margin = self.STAY_MARGIN if self.drafting else self.DRAFT_MARGIN
        if (explore if self.drafting else r)[k] <= margin * r[0] or not self.repays(k, remaining, lag, explore):
            k = 0
        self.drafting = k > 0
        steady = lag <= 2 and (remaining is None or remaining > self.k_max)  # no catch-up, room for K = k_max
        if steady and self.retries.take_timed_round():
            self.drafting = True
            return self.k_max  # a retry's timed round: the price of long K as it is now
        if k > 0:
            self.retries.on_merits()
        if k == 0:
            self.acceptance.idle()
            k = self.probe(remaining, lag) or self.retry(remaining, lag)
        elif self.online and self.retime and self.since_plain >= (self.BASELINE_EVERY if self.arms.timed[0] else 2):
            k = 0  # re-time plain decoding; early if never timed (the first round also read the prompt)
        elif self._losing():
            # The estimate lags what happened (a llama-cpp-python Llama sampling
            # at 0.8 after greedy calls: 13 losing rounds): mostly forget it.
            self.acceptance.forget(self.FORGET)
            self.delivered = Delivered()
            self.drafting = False
            k = 0
        elif self.online and steady:
            k = self.arms.unspanned() or k
        return k

    def _losing(self) -> bool:
        """The guard: recent drafting rounds delivered fewer tokens per second
        than GUARD times plain decoding's rate."""
        return bool(self.arms.timed[0]) and self.delivered.below(self.GUARD / self.arms.time(0))

    def probe(self, remaining: Optional[int] = None, lag: int = 0) -> int:
        """K for a probe from plain decoding, or 0: PROBE_K if, at the
        optimistic acceptance, some K beats plain decoding by PROBE_MARGIN
        and the chance (PROBE_ODDS) of that saving outweighs the catch-up.
        With a poor draft, probes at even odds ran at every call's start,
        2-3% of the run for nothing."""
        optimistic = self.rates([self.acceptance.optimistic()] * self.k_max)
        if self._worth_trying(optimistic, remaining, lag, self.PROBE_ODDS):
            return min(self.PROBE_K, self.k_max)
        return 0

    def _worth_trying(self, r: Sequence[float], remaining: Optional[int], lag: int, odds: float = 1.0) -> bool:
        """Whether, at rates ``r``, some K beats plain decoding by PROBE_MARGIN
        and its saving (times ``odds``) repays the catch-up (:meth:`repays`)."""
        best = max(range(1, self.k_max + 1), key=lambda k: r[k])
        return r[best] > self.PROBE_MARGIN * r[0] and self.repays(best, remaining, lag, r, odds)

    def retry(self, remaining: Optional[int] = None, lag: int = 0) -> int:
        """PROBE_K once a retry is due (:class:`Retries`), if drafting would
        win by PROBE_MARGIN at the estimated acceptance and the prior's
        prices (anchored at plain decoding's time now), and the catch-up
        repays (the acceptance is known; the price is in doubt). The next
        round with no catch-up then times K = k_max, the earlier prices
        aged (:meth:`Arms.age`).

        Round times are relative to a speed all K share, but this machine
        has phases in which the draft's forwards slow and the target's do
        not: drafting priced in one stopped for good (simulator: 0.946 of
        the best K), as nothing drafted again to re-price it. Each try that
        finds drafting still losing doubles the wait, so the cost of a
        draft that stays poor is bounded."""
        if not (self.online and self.retries.due()):
            return 0
        if not self._worth_trying(self.rates(time=self.arms.prior_time), remaining, lag):
            return 0
        self.retries.start()
        self.arms.age(Retries.AGE)
        return min(self.PROBE_K, self.k_max)

    def explain(self) -> str:
        """One line on what the policy would draft now and what that rests
        on: each K's predicted speed against plain decoding, the draft's
        acceptance, and where the round times come from."""
        costs = self.arms.source() if self.online else "stored round times (a seeded run does not read the clock)"
        return why_line(self.rates(), self.acceptance.totals(), costs)

    def p_min(self) -> Optional[float]:
        """The confidence cutoff for the next round (None: no cutoff)."""
        if self.p_min_setting != "auto":
            return None if self.p_min_setting is None else float(self.p_min_setting)
        # One more draft token costs S(k+1) - S(k): at the best rate, worth `need` tokens.
        r = self.rates()
        k = max(1, min(self._best(r), self.k_max - 1))
        return self.by_confidence.cutoff((self.arms.time(k + 1) - self.arms.time(k)) * r[k])

    def update(self, drafted: int, accepted: int, confidences: Optional[Sequence[float]] = None,
               seconds: Optional[float] = None, first_seconds: Optional[float] = None,
               catchup: Optional[tuple] = None) -> None:
        """Record a round: ``drafted`` proposed, ``accepted`` kept; the draft's
        confidence per token; the round's whole wall time (None: untimed);
        ``first_seconds``: the draft's first forward, catch-up included, if
        timed; ``catchup``: ``(acceptances, positions)`` the draft's
        read-back of tokens it caught up on (:attr:`~specgguf.ops.drafter.Draft.catchup`)."""
        if catchup:
            self.acceptance.observe_skipped(float(catchup[0]), int(catchup[1]))
        verified = min(drafted, accepted + 1)  # positions the verifier decided on
        self.acceptance.observe(verified, accepted, self.after_miss)
        self.after_miss = accepted < drafted
        self.by_confidence.observe(verified, accepted, confidences, self.acceptance.decay)
        caught_up = drafted > 0 and self.lag > 2
        if self.online and seconds is not None and caught_up and first_seconds:
            self.arms.observe_catchup(first_seconds, self.lag)
        timed = None if (caught_up or not self.online) else seconds
        self.arms.observe(drafted, timed)
        if drafted and timed:
            self.delivered.add(accepted + 1, timed)
        self.since_plain = 0 if drafted == 0 else self.since_plain + 1
        self.retries.round(drafted)
