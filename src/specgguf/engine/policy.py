"""``k="auto"``: how many tokens each sequence drafts next round, on every path.

A round drafting K tokens emits E(K) = 1 + a_1 + a_1 a_2 + ... tokens (a_i:
the chance position i is accepted given those before it were; Leviathan et
al.) and costs what this process's own rounds took (:class:`Costs`: nothing
stored prices a round, identical processes differ by 20%). Each round drafts,
per sequence, the K with the most expected tokens per second; plain decoding
is always a candidate. A regime nothing is known of is probed by one
sequence (or measured on its prompt: :meth:`Policy.worth_measuring`); a lone
sequence that stopped drafting retries after ``retry`` plain rounds (twice
as many after each retry that did not hold) if the draft would pay at its optimistic acceptance or at a doubted price. Every
number is in :class:`Tuning`; each was kept because the simulator
(``bench/simulate.py --ablate``) loses more than 0.01 of its speed on some
trace without it. Nothing here touches models, files or the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence

from ..config import AUTO_K_MAX
from .costs import Costs, Measured, SlotView  # SlotView: what callers show the policy


@dataclass(frozen=True)
class Tuning:
    """The policy's numbers (BENCHMARKS.md, "How k=auto was chosen": what each is worth)."""

    decay: float = 0.95        # acceptance counts kept per round with verdicts: a memory of ~20 rounds
    shrink: float = 8.0        # a position's rate is pulled to the overall one by this many observations
    prior: float = 8.0         # what was known before the process (a record, a calibration) weighs this many
    guard: float = 0.6         # drafting that delivers under this of its promise (the text changed) ...
    forget: float = 0.2        # ... keeps this of the counts, as a measurement on this process's own prompt does
    thin: float = 0.995        # per plain round, what the optimistic rate keeps of the evidence
    probe_k: int = 3           # draft tokens of a probe of a regime not known
    odds: float = 0.2          # the chance a probe or a retry finds the draft good: its catch-up weighs 1/odds
    retry: int = 16            # plain rounds in a row before a lone sequence retries, doubled after
    retry_max: int = 256       # a retry that did not hold, up to this (a draft as slow as the target)
    retry_gain: float = 1.1    # a retry's predicted gain over plain decoding must reach this
    doubt: float = 0.5         # a retry may price the draft at this of the target (timed in a slow phase?)
    draft_guess: float = 0.1   # a draft forward, of a target token, before one is timed (hopeful)
    slope_guess: float = 0.06  # a forward's price per token past one count timed, of that count's
    unknown_left: int = 128    # tokens a sequence is taken to have left when it does not say
    steady: int = 2            # draft tokens a sequence has in a forward without catch-up
    spike: float = 1.5         # a shorter forward is priced at most this of a longer one as timed


def expected_tokens(k_max: int, acc: Sequence[float]) -> List[float]:
    """E(k) for k = 0..k_max from per-position acceptances ``acc``."""
    out, run = [1.0], 1.0
    for a in acc[:k_max]:
        run *= a
        out.append(out[-1] + run)
    return out


class Regime:
    """The draft's acceptance in one sampling regime, pooled over its sequences:
    decayed counts per position (the last index: a round's first position
    after a rejection, as drafts miss in runs), ``total`` = (accepted,
    verified) overall, a prior counted once; ``seen``: positions verified in
    this process (a prior is no verdict); ``idle``: plain rounds in a row;
    ``wait``: plain rounds before a retry; ``retried``: 2 as one starts;
    ``promised``: recent drafting rounds' tokens, the estimate's promise, rounds."""

    def __init__(self, k_max: int, t: Tuning = Tuning()) -> None:
        self.t, self.accepted, self.verified = t, [0.0] * (k_max + 1), [0.0] * (k_max + 1)
        self.total, self.seen, self.idle, self.wait, self.retried = [0.0, 0.0], 0.0, 0, t.retry, 0
        self.promised = [0.0, 0.0, 0.0]

    @property
    def known(self) -> bool:
        return self.seen > 0

    def add(self, accepted: Sequence[float], verified: Sequence[float], total: Sequence[float], f=1.0) -> None:
        self.accepted = [a + f * x for a, x in zip(self.accepted, accepted)]
        self.verified = [v + f * x for v, x in zip(self.verified, verified)]
        self.total = [a + f * x for a, x in zip(self.total, total)]

    def add_prior(self, rate: float, weight: Optional[float] = None) -> None:
        """A measured acceptance ``rate``, worth ``weight`` (default ``prior``) observations at every position."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"a measured acceptance must be in [0, 1], got {rate!r}")
        w, n = self.t.prior if weight is None else weight, len(self.verified)
        self.add([rate * w] * n, [w] * n, [rate * w, w])

    def add_record(self, record: Optional[dict]) -> None:
        """Stored counts (:meth:`record`), scaled to at most ``prior`` observations; damaged ones add nothing."""
        try:
            acc, ver, tot = ([float(x) for x in record[k]] for k in ("accepted", "verified", "total"))
            if len(acc) != len(self.verified) or len(ver) != len(acc) or len(tot) != 2 or min(acc + ver + tot) < 0:
                raise ValueError("counts of another shape")
        except (KeyError, TypeError, ValueError):
            return
        self.add(acc, ver, tot, min(1.0, self.t.prior / tot[1]) if tot[1] > 0 else 0.0)

    def record(self) -> dict:
        return {"accepted": list(self.accepted), "verified": list(self.verified), "total": list(self.total)}

    def forget(self, f: float) -> None:
        self.accepted, self.verified = [a * f for a in self.accepted], [v * f for v in self.verified]
        self.total = [t * f for t in self.total]

    def observe(self, drafted: int, accepted: int, after_miss: bool = False) -> None:
        """A verdict: the first ``accepted`` of ``drafted`` tokens (decided up to the first
        rejection). Drafting that delivers under ``guard`` of its promise (the text changed;
        deep positions, rarely reached, keep old rates) forgets most of what was known."""
        promise = expected_tokens(drafted, self.per_position(after_miss))[drafted]
        self.promised = [p * 0.8 + x for p, x in zip(self.promised, (accepted + 1, promise, 1))]
        verified = drafted if accepted == drafted else accepted + 1
        self.forget(self.t.decay)  # per round with verdicts: plain rounds do not erase what was learned
        for i in range(min(verified, len(self.verified) - 1)):
            j = -1 if i == 0 and after_miss else i
            self.verified[j] += 1.0
            self.accepted[j] += float(i < accepted)
        self.total = [self.total[0] + accepted, self.total[1] + verified]
        self.seen += verified
        if self.promised[2] >= 3 and self.promised[0] < self.t.guard * self.promised[1]:
            self.forget(self.t.forget)
            self.promised = [0.0, 0.0, 0.0]

    def read_back(self, accepted: float, positions: int) -> None:
        """The draft's read-back of ``positions`` tokens it caught up on (``accepted``: their acceptances)."""
        self.forget(self.t.decay)
        zeros = [0.0] * (len(self.verified) - 1)
        self.add([accepted] + zeros, [positions] + zeros, [accepted, positions])
        self.seen += positions

    def measured(self, acceptance: float, positions: int) -> None:
        """The draft measured on this process's own text (a prompt): it outweighs what was known."""
        self.forget(self.t.forget)
        self.add_prior(acceptance, positions)
        self.seen += positions

    def per_position(self, after_miss: bool = False) -> List[float]:
        """Conditional acceptance per draft position (k_max values), shrunk to the overall rate."""
        overall, s = (self.total[0] + 1.0) / (self.total[1] + 2.0), self.t.shrink
        out = [(a + s * overall) / (v + s) for a, v in zip(self.accepted, self.verified)]
        return ([out[-1]] if after_miss else out[:1]) + out[1:-1]

    def optimistic(self) -> float:
        """One sigma above the overall rate, its evidence thinned by the plain rounds since; at most 0.99."""
        f = self.t.thin ** self.idle
        n, g = self.total[1] * f, (self.total[0] * f + 1.0) / (self.total[1] * f + 2.0)
        return min(0.99, g + (g * (1.0 - g) / (n + 1.0)) ** 0.5)

    def gains(self, v: SlotView, optimistic: bool = False) -> List[float]:
        """Expected tokens at K = 0..cap: estimated once known, else (or ``optimistic``)
        at the optimistic rate (a probe's first ``probe_k`` positions only)."""
        if self.known and not optimistic:
            return expected_tokens(v.cap, self.per_position(v.after_miss))
        n = v.cap if optimistic else self.t.probe_k
        return expected_tokens(v.cap, [self.optimistic()] * n + [0.0] * v.cap)


class Policy:
    """K per sequence each round, up to ``k_max``; ``passes``, ``free_draft`` as
    :class:`~specgguf.engine.costs.Costs`; ``clock`` False (a seeded p/q run, whose
    text the clock must not change) prices every round at the guesses and times nothing."""

    auto = True  # what K objects say of themselves (a fixed K: :class:`~specgguf.engine.draft_length.FixedK`)

    def __init__(self, k_max: int = AUTO_K_MAX, passes: Optional[Callable] = None, free_draft: bool = False,
                 clock: bool = True, tuning: Tuning = Tuning()) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max, self.clock, self.t = k_max, clock, tuning
        self.costs = Costs(passes, free_draft, tuning.slope_guess, tuning.draft_guess, tuning.doubt, tuning.steady,
                           tuning.unknown_left, tuning.spike)
        self.regimes: Dict[str, Regime] = {}

    def regime(self, name: str) -> Regime:
        if name not in self.regimes:
            self.regimes[name] = Regime(self.k_max, self.t)
        return self.regimes[name]

    acceptance = regime  # what tests and the store read of it: the regime's counts

    def blind(self) -> "Policy":
        """A policy like this one, blind to the clock, knowing nothing yet (for a seeded p/q run)."""
        return Policy(self.k_max, self.costs.count_passes, self.costs.free, clock=False, tuning=self.t)

    def begin(self, regime: str, prior: Optional[float] = None, record: Optional[dict] = None) -> None:
        """On ``regime``'s first use: what was known before this process (a
        measured acceptance ``prior``, a stored ``record``); later calls add nothing."""
        if regime not in self.regimes:
            r = self.regime(regime)
            if prior is not None:
                r.add_prior(prior)
            r.add_record(record)

    def record(self, regime: str) -> Optional[dict]:
        """What this process learned of ``regime`` to store for later ones (None: nothing, or blind)."""
        r = self.regimes.get(regime)
        return r.record() if self.clock and r is not None and r.total[1] > 0 else None

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

    def round_done(self, views: Sequence[SlotView], ks: Sequence[int], m: Optional[Measured]) -> None:
        """After a round that drafted ``ks`` for ``views``: its costs (``m``; None: untimed)."""
        if m is not None and self.clock:
            self.costs.observe(m, any(v.target_lag > 1 for v in views), self.costs.passes(views, ks))
        drafted = {v.regime for v, k in zip(views, ks) if k}
        for name, r in self.regimes.items():  # the round after a retry tells whether drafting held
            if r.retried == 1:
                r.wait = self.t.retry if name in drafted else min(2 * r.wait, self.t.retry_max)
            r.retried, r.idle = max(0, r.retried - 1), 0 if name in drafted else r.idle + 1

    def choose(self, views: Sequence[SlotView]) -> List[int]:
        """K for each sequence (see the module docstring)."""
        r = [self.regime(v.regime) for v in views][0]  # every regime seen from its first round
        if self.clock and not self.costs.target.s:
            return [v.cap if v.fixed else 0 for v in views]
        lone = len(views) == 1 and not views[0].fixed and views[0].cap > 0 and r.known
        if lone and r.idle >= r.wait and self.clock:
            for hope in (True, False):  # the draft may accept more now, or cost less than when timed
                best, gain = self._best(views, optimistic=hope, doubt=not hope)
                if best[0] and gain >= self.t.retry_gain:
                    r.retried = 2
                    if not hope:  # its timings were doubted: this round's replace them
                        self.costs.draft.forget()
                    return best
        return self._best(views)[0]

    def _best(self, views: Sequence[SlotView], hope=False, optimistic=False, doubt=False) -> tuple:
        """The best common K, then each sequence's own in turn, scored as expected
        tokens minus ``rate`` x seconds (``rate``: the best tokens/s of a steady
        round); and that rate over plain decoding's. ``hope``: every position
        accepted at 0.99. One sequence of a regime not known probes; the
        others of its regime wait for its verdict."""
        first, capped = set(), []
        for v in views:
            probe = not v.fixed and not self.regime(v.regime).known
            if probe:
                v = replace(v, cap=0 if v.regime in first else min(v.cap, self.t.probe_k))
                first.add(v.regime)
            if probe or optimistic:  # what may find nothing pays its catch-up back over fewer tokens
                v = replace(v, remaining=max(1, round((v.remaining or self.t.unknown_left) * self.t.odds)))
            capped.append(v)
        gains = [expected_tokens(v.cap, [0.99] * v.cap) if hope else self.regimes[v.regime].gains(v, optimistic)
                 for v in capped]
        steady = [v.steady() for v in capped]
        commons = [[v.cap if v.fixed else min(k, v.cap) for v in capped] for k in range(self.k_max + 1)]
        total = lambda ks: sum(g[k] for g, k in zip(gains, ks))  # noqa: E731
        rate = max(total(ks) / max(self.costs.seconds(steady, ks, doubt), 1e-9) for ks in commons)
        score = lambda ks: total(ks) - rate * self.costs.seconds(capped, ks, doubt)  # noqa: E731
        best = max(commons, key=score)
        for i, v in enumerate(capped):
            if not v.fixed and v.cap > 0:
                best[i] = max(range(v.cap + 1), key=lambda k: score(best[:i] + [k] + best[i + 1:]))
        return best, rate * self.costs.seconds(steady, commons[0]) / max(1e-9, total(commons[0]))

    def worth_measuring(self, v: SlotView) -> bool:
        """Whether to measure the draft on the prompt ``v`` is about to read: while its
        regime is not known, if drafting would pay were the draft good."""
        cap = min(self.k_max, (v.remaining or self.t.unknown_left) - 1)
        if self.regime(v.regime).known or cap <= 0:
            return False
        return self._best([replace(v, target_lag=1, cap=cap)], hope=True)[0][0] > 0

    def rates(self, regime: str) -> List[float]:
        """Tokens per second a lone steady sequence of ``regime`` is predicted at, K = 0..k_max."""
        v = SlotView(regime, self.k_max, remaining=self.t.unknown_left)
        g = expected_tokens(self.k_max, self.regime(regime).per_position())
        return [g[k] / max(self.costs.seconds([v], [k]), 1e-9) for k in range(self.k_max + 1)]

    def p_min(self, regime: str) -> float:
        """``p_min="auto"``: the draft's confidence below which one more draft token
        costs more than it is worth at the best rate (confidence taken as its
        chance of acceptance)."""
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
        basis = ("no forward timed yet" if not self.costs.target.s else "costs from this process's rounds" +
                 ("" if self.costs.draft.s or self.costs.free else " (the draft's guessed: none timed yet)"))
        return f"{head} (K {' '.join(f'{k}:{r[k] / r[0]:.2f}' for k in range(1, len(r)))}); {known}; {basis}"
