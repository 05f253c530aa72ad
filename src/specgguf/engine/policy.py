"""How many tokens to draft each round (``k="auto"``): a small bandit over K.

A round that drafts K tokens emits E(K) = 1 + a_0 + a_0 a_1 + ... tokens, a_i
the chance the i-th draft token is accepted given the ones before it were
(Leviathan et al.), and takes S(K) seconds of wall time: the draft's forwards,
the target's batched forward, warp, verify and Python. K = 0 is plain
decoding. The policy drafts the K with the most tokens per second,
E(K) / S(K), judged by what rounds delivered, not by modelled parts:

* :class:`~specgguf.engine.arms.Arms` keeps, per K, discounted sums of this run's round wall
  times, relative to one speed every K shares (a busy spell or a slower
  process moves every K alike). A K not timed yet lies on the line fitted
  through the timed ones; before two are timed, it borrows the shape of a
  :class:`~specgguf.engine.arms.CostModel` prior (stored round times, or the built-in one:
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
  drafting is priced again. :class:`Trials` holds the rules for trying
  drafting from plain decoding (probe, retry).
* The guard: when the last few drafting rounds delivered under ``GUARD`` of
  plain decoding's rate, drafting stops and the acceptance counts are
  mostly forgotten.

Nothing here touches models, files or the clock: the caller reports each
round (:meth:`DraftPolicy.update`) and asks for the next K (:meth:`DraftPolicy.choose`).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from .acceptance import AcceptanceEstimate, ConfidenceBins
from .arms import Arms, CostModel, priors
from ..checks import check_p_min


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


class Trials:
    """When a policy in plain decoding tries drafting: a probe (PROBE_K
    drafts) when the draft might pay, and a retry of the round prices after
    a long plain stretch. Both weigh the saving over the tokens left against
    the draft's catch-up on the text it has not read (:meth:`repays`).

    Args:
        k_max: largest draft length considered.
        arms: the policy's round times (catch-up prices; a retry ages them).
    """

    PROBE_K = 3           # drafts per probe: the catch-up dominates its cost, so learn several
    PROBE_MARGIN = 1.10   # try only if the draft could beat plain decoding by this
    PROBE_ODDS = 0.2      # the chance a probe finds the optimistic acceptance: its catch-up is weighed against it
    HORIZON = 100         # tokens left when the caller cannot say (DraftModel): without one, each
                          # probe at T=0.8 caught up on a whole previous answer, 0.85x plain

    def __init__(self, k_max: int, arms: Arms) -> None:
        self.k_max, self.arms = k_max, arms
        self.retries = Retries()

    def repays(self, k: int, remaining: Optional[int], lag: int, r: Sequence[float], odds: float = 1.0) -> bool:
        """Whether drafting k over the ``remaining`` tokens (None: HORIZON)
        at rates ``r`` (tokens per second, K = 0..k_max) saves more (times
        ``odds``) than the draft's catch-up on ``lag`` tokens costs (a long
        prompt before a short answer may not be worth it)."""
        if lag <= 2:
            return True
        left = self.HORIZON if remaining is None else remaining
        return odds * left * (1.0 / r[0] - 1.0 / r[k]) > self.arms.catchup_cost(lag - 2)

    def worth_trying(self, r: Sequence[float], remaining: Optional[int], lag: int, odds: float = 1.0) -> bool:
        """Whether, at rates ``r``, some K beats plain decoding by PROBE_MARGIN
        and its saving (times ``odds``) repays the catch-up (:meth:`repays`)."""
        best = max(range(1, self.k_max + 1), key=lambda k: r[k])
        return r[best] > self.PROBE_MARGIN * r[0] and self.repays(best, remaining, lag, r, odds)

    def probe(self, optimistic: Sequence[float], remaining: Optional[int], lag: int) -> int:
        """PROBE_K, or 0: whether, at the rates of the optimistic acceptance,
        the chance (PROBE_ODDS) of drafting's saving outweighs the catch-up.
        With a poor draft, probes at even odds ran at every call's start,
        2-3% of the run for nothing."""
        return min(self.PROBE_K, self.k_max) if self.worth_trying(optimistic, remaining, lag, self.PROBE_ODDS) else 0

    def retry(self, at_prior: Callable[[], Sequence[float]], remaining: Optional[int], lag: int) -> int:
        """PROBE_K once a retry is due (:class:`Retries`), if drafting would
        win by PROBE_MARGIN at rates ``at_prior()`` (the estimated acceptance,
        the prior's prices anchored at plain decoding's time now) and the
        catch-up repays (the acceptance is known; the price is in doubt).
        The next round with no catch-up then times K = k_max, the earlier
        prices aged (:meth:`Arms.age`).

        Round times are relative to a speed all K share, but this machine
        has phases in which the draft's forwards slow and the target's do
        not: drafting priced in one stopped for good (simulator: 0.946 of
        the best K), as nothing drafted again to re-price it. Each try that
        finds drafting still losing doubles the wait, so the cost of a
        draft that stays poor is bounded."""
        if not (self.retries.due() and self.worth_trying(at_prior(), remaining, lag)):
            return 0
        self.retries.start()
        self.arms.age(Retries.AGE)
        return min(self.PROBE_K, self.k_max)


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
    GUARD = 0.7           # stop when recent drafting rounds delivered below this times plain's rate
    FORGET = 0.2          # what is kept of the acceptance counts when the guard fires

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
        self.trials = Trials(k_max, self.arms)
        self.drafting = False  # the last choice, before re-timing, was to draft
        self.since_plain = 0   # rounds since the last plain one
        self.lag = 0           # the lag the last choice was made at
        self.after_miss = False  # the last round ended in a rejection (see acceptance.Counts)
        self.delivered = Delivered()  # what recent timed drafting rounds delivered: the guard reads it

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

    def choose(self, remaining: Optional[int] = None, lag: int = 0) -> int:
        """K for the next round; ``remaining``: tokens left to generate (None:
        unknown); ``lag``: tokens the draft has not evaluated."""
        self.lag = lag
        r = self.rates()
        explore = [x * (1.0 + self.EXPLORE * self.arms.bonus(k)) for k, x in enumerate(r)] if self.online else r
        k = max(range(1, self.k_max + 1), key=lambda k: (explore[k], -k))
        margin = self.STAY_MARGIN if self.drafting else self.DRAFT_MARGIN
        if (explore if self.drafting else r)[k] <= margin * r[0] or not self.trials.repays(k, remaining, lag, explore):
            k = 0
        self.drafting = k > 0
        steady = lag <= 2 and (remaining is None or remaining > self.k_max)  # no catch-up, room for K = k_max
        if steady and self.trials.retries.take_timed_round():
            self.drafting = True
            return self.k_max  # a retry's timed round: the price of long K as it is now
        if k > 0:
            self.trials.retries.on_merits()
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
            k = self._unspanned(r[0]) or k
        return k

    def _unspanned(self, plain: float) -> int:
        """:meth:`Arms.unspanned`'s K, if at the optimistic acceptance and the
        prior's price (anchored at plain decoding's time) it would beat
        ``plain`` decoding's rate. A K that loses even so is not worth timing:
        with the Q2_K draft (0.7) the K=8 round cost a first call 3-4% for nothing."""
        u = self.arms.unspanned()
        if not u:
            return 0
        return u if self.rates([self.acceptance.optimistic()] * self.k_max, self.arms.prior_time)[u] > plain else 0

    def _losing(self) -> bool:
        """The guard: recent drafting rounds delivered fewer tokens per second
        than GUARD times plain decoding's rate."""
        return bool(self.arms.timed[0]) and self.delivered.below(self.GUARD / self.arms.time(0))

    def probe(self, remaining: Optional[int] = None, lag: int = 0) -> int:
        """K for a probe from plain decoding, or 0 (:meth:`Trials.probe`)."""
        return self.trials.probe(self.rates([self.acceptance.optimistic()] * self.k_max), remaining, lag)

    def retry(self, remaining: Optional[int] = None, lag: int = 0) -> int:
        """K for a retry of drafting's prices, or 0 (:meth:`Trials.retry`; never without a clock)."""
        return self.trials.retry(lambda: self.rates(time=self.arms.prior_time), remaining, lag) if self.online else 0

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
        self.trials.retries.round(drafted)
