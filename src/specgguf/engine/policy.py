"""``k="auto"``: how many tokens each sequence drafts next round, on every path.

Each round drafts, per sequence, the K with the most expected tokens (:mod:`~specgguf.engine.acceptance`) per second
the round costs here (:mod:`~specgguf.engine.costs`; the draft as an earlier process timed it against a target token
until timed here); plain decoding is always a candidate. A regime nothing is known of is probed by one sequence (or
measured on its prompt: :meth:`Policy.worth_measuring`). Where the draft does not pay, the choice is made every
``recheck`` rounds (a lone sequence's once ``recheck`` in a row drafted nothing), and a lone sequence retries after
``retry`` plain rounds (longer after a retry that did not hold) if the draft would pay at its optimistic acceptance
or at a doubted price, asking every ``recheck`` rounds; it reads plain decoding again after ``reread`` rounds drafted
on a thin margin, ``reread_any`` at any. A draft's catch-up (a new prompt, or text it skipped) is paid once for the
tokens a sequence is expected to emit yet, as long as recent answers ran (:meth:`Policy.left`); a long one is priced
only once draft batches were timed (:meth:`Policy.batches_to_time`). Numbers: :class:`~specgguf.engine.tuning.Tuning`;
no models, files or clock here."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

from ..config import AUTO_K_MAX
from .acceptance import Regime, expected_tokens
from .costs import Costs, Measured, SlotView  # SlotView: what callers show the policy
from .tuning import Tuning

__all__ = ["Policy", "Regime", "SlotView", "Tuning", "expected_tokens"]


class Policy:
    """K per sequence each round, up to ``k_max``; ``passes``, ``free_draft`` as in :class:`.costs.Costs`;
    ``costs``: its stored record; ``clock`` False (a seeded p/q run) prices rounds at the guesses and times nothing."""

    fixed = False  # what a view of its sequence tells a policy (a fixed K: :class:`.draft_length.FixedK`)

    def __init__(self, k_max: int = AUTO_K_MAX, passes: Optional[Callable] = None, free_draft: bool = False,
                 clock: bool = True, tuning: Tuning = Tuning(), costs: Optional[dict] = None) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max, self.clock, self.t = k_max, clock, tuning
        self.costs = Costs(passes, free_draft, tuning, costs if clock else None)
        self.regimes: Dict[str, Regime] = {}
        self.answers: Deque[Tuple[int, bool]] = deque(maxlen=16)  # recent answers' lengths, and whether cut
        self.can_time = False  # its rounds time draft batches when asked (batches_to_time)
        self.resting, self.drafting, self.rereading = 0, 0, False  # rounds in a row not drafting, drafting; a re-read

    def regime(self, name: str) -> Regime:
        return self.regimes[name] if name in self.regimes else self.regimes.setdefault(name, Regime(self.k_max, self.t))

    def blind(self) -> "Policy":
        """A policy like this one, blind to the clock, knowing nothing yet (for a seeded p/q run)."""
        return Policy(self.k_max, self.costs.count_passes, self.costs.free, clock=False, tuning=self.t)

    def begin(self, regime: str, prior: Optional[float] = None, record: Optional[dict] = None) -> None:
        """On ``regime``'s first use, what was known before (a measured ``prior``, a stored ``record``)."""
        if regime not in self.regimes:
            self.regime(regime).add_prior(prior)
            self.regime(regime).add_record(record)

    def record(self, regime: str) -> Optional[dict]:
        """What this process learned of ``regime`` to store for later ones (None: nothing, or blind)."""
        r = self.regimes.get(regime)
        return r.record() if self.clock and r is not None and r.total[1] > 0 else None

    def cost_record(self) -> Optional[dict]:
        """What this process timed of the draft against the target, for later ones (None: too little)."""
        return self.costs.record() if self.clock else None

    cold = property(lambda self: not self.clock, doc="Its runs start cold when blind to the clock (seeded p/q).")

    def draft_lag(self, lag: Callable[[], int]) -> int:
        """The draft's catch-up, ``lag()``: weighed in the round's price."""
        return lag()

    def forget(self) -> None:
        """Every regime starts again (from what :meth:`begin` is given next)."""
        self.regimes.clear()

    def read_back(self, regime: str, accepted: float, positions: int) -> None:
        self.regime(regime).read_back(accepted, positions)

    def measured(self, regime: str, acceptance: float, positions: int) -> None:
        self.regime(regime).measured(acceptance, positions)

    def observe(self, regime: str, drafted: int, accepted: int, after_miss: bool = False) -> None:
        """One sequence's verdict: the first ``accepted`` of ``drafted`` tokens."""
        if drafted:
            self.regime(regime).observe(drafted, accepted, after_miss)

    def ended(self, emitted: int, at_budget: bool) -> None:
        """A sequence ended after ``emitted`` tokens (``at_budget``: its budget cut it)."""
        self.answers.append((emitted, at_budget))

    def left(self, v: SlotView) -> int:
        """The tokens ``v``'s sequence is expected to emit yet: within what it may (``remaining``), as long as the
        recent answers that ran past its ``emitted`` went on (all of it while none is known). Answers end before their
        budget (code edits here at 80 of 128): a catch-up priced over the budget paid for tokens that never came."""
        n = v.remaining or self.t.unknown_left
        longer = [n if cut else min(n, e - v.emitted) for e, cut in self.answers if e > v.emitted]
        return max(1, round(sum(longer) / len(longer))) if longer else n

    def round_done(self, views: Sequence[SlotView], ks: Sequence[int], m: Optional[Measured]) -> None:
        """After a round that drafted ``ks`` for ``views``: its costs (``m``; None: untimed)."""
        if m is not None and self.clock:
            self.costs.observe(m, any(v.target_lag > 1 for v in views), self.costs.passes(views, ks), self.rereading)
        self.rereading = False
        drafted = {v.regime for v, k in zip(views, ks) if k}
        plain = self.costs.target(1)  # the round's seconds in plain rounds, past one
        spent = (m.target_seconds + m.rest_seconds + sum(x[1] for x in m.draft_forwards)) / plain - 1 if m else 0.0
        for name, r in self.regimes.items():
            r.round_done(name in drafted, spent)

    def choose(self, views: Sequence[SlotView]) -> List[int]:
        """K for each sequence (see the module docstring)."""
        r = [self.regime(v.regime) for v in views][0]  # every regime seen from its first round
        due = len(views) == 1 and not views[0].fixed and views[0].cap > 0 and r.idle >= r.wait  # a retry
        retry = due and (self.costs.free or (r.idle - r.wait) % self.t.recheck == 0) and self.clock
        # The model's choice costs 0.1-0.8 ms a round: idle, it is made every `recheck` rounds (a lone sequence's
        # once `recheck` in a row drafted nothing: a plain round after a miss is often one) once the draft is known.
        rest = (not self.costs.free and self.resting % self.t.recheck and all(self.regime(v.regime).total[1] > 0
                for v in views) and (len(views) > 1 or (self.resting > self.t.recheck and not retry)))
        if retry and self.costs.target.s:
            for hope in (True, False):  # the draft may accept more now, or cost less than when timed
                best, gain = self._best(views, optimistic=hope, doubt=not hope)
                if best[0] and gain >= self.t.retry_gain:
                    r.retried, r.bet = 2, gain
                    if not hope:  # its timings were doubted: this round's replace them
                        self.costs.draft.forget()
                    return best
            rest = not self.costs.free  # neither bet pays, nor would the usual choice (a lookup's, every round, may)
        if (self.clock and not self.costs.target.s) or rest:
            self.resting += bool(rest)
            return [v.cap if v.fixed else 0 for v in views]
        best, gain = self._best(views)
        stale = self.costs.unread >= self.t.reread_any or (gain < self.t.reread_gain and self.drafting >= self.t.reread)
        self.rereading = len(views) == 1 and self.clock and not self.costs.free and stale  # drafting long (on a thin
        best = [0] if self.rereading else best  # margin) weighs plain decoding at its last price: read it again
        self.resting = 0 if any(best) else self.resting + any(v.cap > 0 for v in views)  # chosen, not forced
        self.drafting = self.drafting + 1 if any(best) else 0
        return best

    def _best(self, views: Sequence[SlotView], hope=False, optimistic=False, doubt=False) -> tuple:
        """The best common K, then each sequence's own, scored as expected tokens minus ``rate`` x seconds
        (``rate``: the best tokens/s of a steady round); and that rate over plain decoding's (a bet, ``optimistic``
        or ``doubt``, over at most its recent median). ``hope``: every position accepted at 0.99. One sequence
        of a regime not known probes; the others of its regime wait for its verdict."""
        first, capped, explore = set(), [], []
        for v in views:
            probe = not v.fixed and not self.regime(v.regime).known
            guessed = not (v.fixed or doubt) and self._guessed_catchup(v)  # a retry doubts every timing
            cap = 0 if guessed else v.cap
            if probe:
                cap = 0 if v.regime in first else min(cap, self.t.probe_k)
                first.add(v.regime)
            if probe or optimistic:  # what may find nothing pays its catch-up back over fewer tokens (what
                # it learns serves later sequences too: over the budget, not this one's expected length)
                left = max(1, round((v.remaining or self.t.unknown_left) * self.t.odds))
            else:
                left = self.left(v)
            capped.append(replace(v, cap=cap, remaining=left))
            explore.append(probe or optimistic)
        gains = [expected_tokens(v.cap, [0.99] * v.cap) if hope else self.regimes[v.regime].gains(v, optimistic)
                 for v in capped]
        steady = [v.steady() for v in capped]
        longest = max([v.cap for v in capped if not v.fixed], default=0)  # past it, every common K is the same
        grid = sorted({*range(min(longest, AUTO_K_MAX) + 1), *(k for k in (12, 16, 24) if k < longest), longest})
        commons = [[v.cap if v.fixed else min(k, v.cap) for v in capped] for k in grid]  # a lookup's 32: refined below
        total = lambda ks: sum(g[k] for g, k in zip(gains, ks))  # noqa: E731
        # A retry bets on acceptance, not also on untimed batches' flat prices (a lookup's K = 27).
        steady_price = self.costs.pricer(steady, doubt, hope=not optimistic)
        price = self.costs.pricer(capped, doubt, explore, hope=not optimistic)
        # A catch-up of C seconds is paid once for the n tokens a sequence is expected to emit yet:
        # drafting then runs at E / (s + C E / n) (C / n per token, not per round: a 345-token
        # prompt's catch-up looked 8x cheaper so), and each drafted token is worth 1 - rate C / n of
        # one. A probe's or a retry's stays per round (at its odds): what it learns serves later
        # requests too (weighed per token, a draft slowed for a while was never tried again).
        per_token = [0.0 if e else c / n for c, n, e in zip(price.caught, price.left, explore)]
        horizon = lambda ks: (steady_price(ks) +  # noqa: E731
                              sum(c * g[k] for c, g, k in zip(per_token, gains, ks) if k))
        rate = max(total(ks) / max(horizon(ks), 1e-9) for ks in commons)
        for g, c in zip(gains, per_token):
            g[1:] = [x * max(0.0, 1.0 - rate * c) for x in g[1:]]
        score = lambda ks: total(ks) - rate * price(ks)  # noqa: E731
        best = max(commons, key=score)
        for i, v in enumerate(capped):
            if not v.fixed and v.cap > 0:
                held, seconds = total(best) - gains[i][best[i]], price.scan(best, i, v.cap)
                best[i] = max(range(v.cap + 1), key=lambda k: held + gains[i][k] - rate * seconds[k])
        plain = min(self.costs.seconds(steady, commons[0]), self.costs.plain_median() if optimistic or doubt else 1e9)
        return best, rate * plain / max(1e-9, total(commons[0]))

    def _guessed_catchup(self, v: SlotView) -> bool:
        """``v``'s catch-up is long (over 4x the ``batch_timing`` tokens: a chat prompt's is not, and is priced on the
        guess as ever) and no draft forward near as long was timed yet, where the rounds can time some (a draft of
        another tokenizer cannot: it times its first catch-up, priced on the guess)."""
        longest, head = self.costs.longest_draft(), sum(self.t.batch_timing)
        return (self.can_time and self.clock and not self.costs.free and longest < max(self.t.batch_timing)
                and 4 * head < v.draft_lag)

    def batches_to_time(self, v: SlotView) -> tuple:
        """Draft forwards to time (their tokens, ``batch_timing``) before ``v``'s catch-up is priced
        (:meth:`timed_draft`), once the target's rounds are timed (prices are relative); else (). Guessed, a 345-token
        catch-up was priced at 54 ms where it took a second (a quantized draft's batches have no fast kernel on some
        machines), and a first code edit paid it."""
        self.can_time = True
        wanted = self.costs.target.s and self._guessed_catchup(v) and self.left(v) > sum(self.t.batch_timing)
        return self.t.batch_timing if wanted else ()  # fewer tokens left than it reads: not worth a look

    def timed_draft(self, forwards: Sequence[tuple]) -> None:
        """Draft forwards run outside a round, ``[(tokens, seconds)]``."""
        for n, seconds in forwards if self.clock else ():
            self.costs.timed_draft(n, seconds)

    def worth_measuring(self, v: SlotView, others: Sequence[SlotView] = ()) -> bool:
        """Whether to measure the draft on the prompt ``v`` reads beside ``others``: while its regime is not known, if
        drafting would pay in that batch were the draft good (given a record and a price, by ``retry_gain`` at its
        optimistic rate, as a retry: a CLI call paid 4-5% to re-learn a poor draft); beside others once rounds were
        timed (guessed, 4-8 slots paid 0.25 s for a draft that cannot pay)."""
        caps = [min(self.k_max, (w.remaining or self.t.unknown_left) - 1) for w in [v, *others]]
        if (self.regime(v.regime).known or caps[0] <= 0 or self._guessed_catchup(v)  # a long catch-up at a
                or (others and not self.costs.target.s)):  # guessed price (a probe decides), or a batch's untimed
            return False
        batch = [replace(w, target_lag=1, cap=max(0, c)) for w, c in zip([v, *others], caps)]
        told = self.regime(v.regime).total[1] > 0 and self.costs.draft_priced()
        best, gain = self._best(batch, hope=not told, optimistic=told, doubt=told)
        return best[0] > 0 and (not told or gain >= self.t.retry_gain)

    def rates(self, regime: str) -> List[float]:
        """Tokens per second a lone steady sequence of ``regime`` is predicted at, K = 0..k_max."""
        v = SlotView(regime, self.k_max, remaining=self.t.unknown_left)
        g = expected_tokens(self.k_max, self.regime(regime).per_position())
        return [g[k] / max(self.costs.seconds([v], [k]), 1e-9) for k in range(self.k_max + 1)]

    def p_min(self, regime: str) -> float:
        """``p_min="auto"``: the draft's confidence below which one more draft token costs more than it is worth at the
        best rate (confidence taken as its chance of acceptance)."""
        one_more = self.costs.draft_forward(1) + self.costs.target(2) - self.costs.target(1)
        return min(1.0, one_more * max(self.rates(regime)))

    def explain(self, regime: str) -> str:
        """One line for users: the K a lone sequence of ``regime`` would draft, its
        predicted speed against plain decoding, each K's, and what that rests on."""
        r, (acc, ver) = self.rates(regime), self.regime(regime).total
        best = max(range(1, len(r)), key=lambda k: (r[k], -k))
        head = (f"K={best} is predicted at {r[best] / r[0]:.2f}x plain decoding" if r[best] > r[0] else
                f"drafting off: the best draft length, K={best}, is predicted at {r[best] / r[0]:.2f}x plain decoding")
        known = f"draft acceptance {acc / ver:.2f} over {ver:.0f} positions" if ver else "no acceptance known yet"
        basis = "costs from this process's rounds" if self.costs.target.s else "no forward timed yet"
        if not (self.costs.draft.s or self.costs.free) and (self.costs.stored.s or self.costs.target.s):
            basis += " (the draft's %s)" % ("as an earlier process timed it" if self.costs.stored.s else "guessed")
        return f"{head} (K {' '.join(f'{k}:{r[k] / r[0]:.2f}' for k in range(1, len(r)))}); {known}; {basis}"
