"""How many tokens each sequence drafts next round (``k="auto"``), on every
path: one sequence (the CLI, ``generate``, ``SpeculativeLlama``,
``DraftModel``) or several (``serve``).

A round drafting K tokens emits E(K) = 1 + a_1 + a_1 a_2 + ... tokens (a_i:
the chance position i is accepted given those before it were; Leviathan et
al.), and costs what this process's own rounds say (:class:`Costs`; nothing
stored prices a round: identical processes differ by 20%). Each round drafts,
per sequence, the K with the most expected tokens per second; plain decoding
is always a candidate. Exploring is bounded: a regime not known is probed by
one sequence (or measured on its prompt: :meth:`Policy.worth_measuring`); a
lone sequence that stopped drafting retries after ``retry`` plain rounds if
the draft would pay at its optimistic acceptance or at a doubted price.
Every number is in :class:`Tuning`, judged in the simulator
(``bench/simulate.py``). Nothing here touches models, files or the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence

from ..config import AUTO_K_MAX


@dataclass(frozen=True)
class Tuning:
    """The policy's numbers (BENCHMARKS.md: the simulator's table for each)."""

    decay: float = 0.95        # acceptance counts kept per round with verdicts: a memory of ~20 rounds
    shrink: float = 8.0        # a position's rate is pulled to the overall one by this many observations
    prior: float = 8.0         # what was known before the process (a record, a calibration) weighs this many
    evidence: float = 16.0     # positions this process must see before its estimate is trusted
    thin: float = 0.995        # per plain round, what the optimistic rate keeps of the evidence
    probe_k: int = 3           # draft tokens of a probe of a regime not known
    odds: float = 0.2          # the chance a probe or a retry finds the draft good: its catch-up weighs 1/odds
    retry: int = 16            # plain rounds in a row before a lone sequence retries, doubled after
    retry_max: int = 256       # a retry that did not hold, up to this (a draft as slow as the target)
    retry_gain: float = 1.1    # a retry's predicted gain over plain decoding must reach this
    doubt: float = 0.5         # a retry may price the draft at this of the target (timed in a slow phase?)
    guard: float = 0.6         # drafting that delivers under this of its promise ...
    forget: float = 0.2        # ... keeps this of the acceptance counts (the text changed)
    draft_guess: float = 0.1   # a draft forward, of a target token, before one is timed (hopeful)
    slope_guess: float = 0.06  # a forward's price per token past one count timed, of that count's
    unknown_left: int = 128    # tokens a sequence is taken to have left when it does not say
    steady: int = 2            # draft tokens a sequence has in a forward without catch-up


def expected_tokens(k_max: int, acc: Sequence[float]) -> List[float]:
    """E(k) for k = 0..k_max from per-position acceptances ``acc``."""
    out, run = [1.0], 1.0
    for a in acc[:k_max]:
        run *= a
        out.append(out[-1] + run)
    return out


class Acceptance:
    """A draft's acceptance in one regime: decayed counts per position, the last
    index a round's first position after a rejection (drafts miss in runs);
    ``total`` = (accepted, verified) overall, a prior counted once."""

    def __init__(self, k_max: int, t: Tuning = Tuning()) -> None:
        self.t, self.accepted, self.verified = t, [0.0] * (k_max + 1), [0.0] * (k_max + 1)
        self.total = [0.0, 0.0]

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

    def observe(self, verified: int, accepted: int, after_miss: bool = False) -> None:
        """A round whose verifier decided ``verified`` positions, accepting the first ``accepted``."""
        self.forget(self.t.decay)  # per round with verdicts: plain rounds do not erase what was learned
        for i in range(min(verified, len(self.verified) - 1)):
            j = -1 if i == 0 and after_miss else i
            self.verified[j] += 1.0
            self.accepted[j] += float(i < accepted)
        self.total = [self.total[0] + accepted, self.total[1] + verified]

    def read_back(self, accepted: float, positions: int) -> None:
        """The draft's read-back of ``positions`` tokens it caught up on (``accepted``: their acceptances)."""
        self.forget(self.t.decay)
        zeros = [0.0] * (len(self.verified) - 1)
        self.add([accepted] + zeros, [positions] + zeros, [accepted, positions])

    def forget(self, f: float) -> None:
        self.accepted, self.verified = [a * f for a in self.accepted], [v * f for v in self.verified]
        self.total = [t * f for t in self.total]

    def per_position(self, after_miss: bool = False) -> List[float]:
        """Conditional acceptance per draft position (k_max values), shrunk to the overall rate."""
        overall, s = (self.total[0] + 1.0) / (self.total[1] + 2.0), self.t.shrink
        out = [(a + s * overall) / (v + s) for a, v in zip(self.accepted, self.verified)]
        return ([out[-1]] if after_miss else out[:1]) + out[1:-1]

    def optimistic(self, idle: int = 0) -> float:
        """One sigma above the overall rate, its evidence thinned by ``idle`` plain rounds; at most 0.99."""
        f = self.t.thin ** idle
        n, g = self.total[1] * f, (self.total[0] * f + 1.0) / (self.total[1] * f + 2.0)
        return min(0.99, g + (g * (1.0 - g) / (n + 1.0)) ** 0.5)


class Timed:
    """Seconds of a forward by its tokens as timed here: a shape per count
    (between two counts timed, on the line between them; past the largest, the
    last secant, or ``flat``; below the smallest, in proportion; hopeful, so
    that one round times it) times the machine's speed, ``pace[0]``, which
    every reading moves, so that a busy spell seen in the counts a round runs
    reprices those it does not. Not a line: one token runs other kernels and
    2 -> 9 tokens is concave, so a line prices K = 8 too dear ever to try."""

    def __init__(self, slope: float, flat: bool, pace: List[float]) -> None:
        self.slope, self.flat, self.pace, self.s = slope, flat, pace, {}

    def observe(self, n: int, seconds: float) -> None:
        if n <= 0 or seconds <= 0.0:  # no forward, or none the clock could see
            return
        if n in self.s:
            self.pace[0] = _follow(self.pace[0], seconds / self.s[n])
        self.s[n] = _follow(self.s.get(n), seconds / self.pace[0])

    def __call__(self, n: int) -> float:
        if n <= 0:
            return 0.0
        if not self.s:  # nothing timed (or a policy blind to the clock): a unit, at the slope guessed
            return self.pace[0] * (1 + self.slope * (n - 1))
        lo, hi = max((c for c in self.s if c <= n), default=0), min((c for c in self.s if c >= n), default=0)
        if not lo:
            return self.pace[0] * self.s[hi] * n / hi
        if not hi:
            if len(self.s) == 1:
                return self.pace[0] * self.s[lo] * (1 + self.slope * (n - lo))
            (a, x), (b, y) = sorted(self.s.items())[-2:]
            return self.pace[0] * (y + (0.0 if self.flat else max(0.0, (y - x) / (b - a)) * (n - b)))
        f = (n - lo) / (hi - lo) if hi > lo else 0.0
        return self.pace[0] * (self.s[lo] + (self.s[hi] - self.s[lo]) * f)


def _follow(old: Optional[float], new: float) -> float:
    """``old`` moved towards ``new``: noise only adds time, so a faster reading counts more, a slower
    one at most a quarter of 25%."""
    return new if old is None else old + (0.5 if new < old else 0.25) * (min(new, 1.25 * old) - old)


@dataclass
class SlotView:
    """One sequence as a round sees it: its sampling ``regime`` (acceptance is
    pooled by it); ``cap``, the most it may draft (a caller's K if ``fixed``);
    the tokens its target and draft caches lack besides the drafts (a prompt;
    the draft's catch-up); the tokens it may still emit (None: unknown); whether
    its last round ended in a rejection; its sequence id."""

    regime: str
    cap: int
    fixed: bool = False
    target_lag: int = 1
    draft_lag: int = 1
    remaining: Optional[int] = None
    after_miss: bool = False
    slot: int = 0

    def steady(self) -> "SlotView":
        """In a steady round: no prompt to read, no catch-up beyond the usual."""
        return replace(self, target_lag=1, draft_lag=min(self.draft_lag, 2))


@dataclass
class Measured:
    """A round as timed (seconds): the target's forward over ``target_tokens``, each
    draft forward ``(tokens, seconds, sequences)``, the rest (``rows`` verified)."""

    target_tokens: int
    target_seconds: float
    draft_forwards: Sequence[tuple] = ()
    rows: int = 1
    rest_seconds: float = 0.0


class Costs:
    """A round's seconds: the target's forward and the rest of the round by the
    tokens of one pass, each further pass (``passes([(slot, tokens)])``, a KV
    stream per slot) at one token's; the draft's forwards by their tokens."""

    def __init__(self, t: Tuning, passes: Optional[Callable] = None, free_draft: bool = False) -> None:
        self.t, self.count_passes, self.free, pace = t, passes, free_draft, [1.0]  # a busy machine slows both
        self.target, self.draft = Timed(t.slope_guess, True, pace), Timed(t.slope_guess, False, pace)

    def observe(self, m: Measured, prompt: bool, passes: int) -> None:
        if not prompt and passes == 1 and m.target_tokens > 0:  # nor does a prompt's, several passes', none
            self.target.observe(m.target_tokens, m.target_seconds + m.rest_seconds)
        for n, seconds, _ in m.draft_forwards:
            self.draft.observe(n, seconds)

    def passes(self, views: Sequence[SlotView], ks: Sequence[int]) -> int:
        if self.count_passes is None or len(views) < 2:
            return 1
        return self.count_passes([(v.slot, v.target_lag + k) for v, k in zip(views, ks)])

    def draft_forward(self, n: int, doubt: bool = False) -> float:
        """One draft forward over ``n`` tokens (``doubt``: at most ``doubt`` of the target's)."""
        if self.free or n <= 0:
            return 0.0
        d = self.draft(n) if self.draft.s else self.t.draft_guess * self.target(1) * (1 + self.t.slope_guess * (n - 1))
        return min(d, self.t.doubt * self.target(n)) if doubt else d

    def seconds(self, views: Sequence[SlotView], ks: Sequence[int], doubt: bool = False) -> float:
        """A round drafting ``ks``: the target's passes, the draft's first forward
        (each drafting sequence's lag, at most ``steady``) and one per further
        position; a longer catch-up is paid back over the tokens left (at most
        ``unknown_left`` if not known): a drafting round is weighed against a plain one."""
        t = self.target(max(1, sum(v.target_lag for v in views) + sum(ks)))
        t += (self.passes(views, ks) - 1) * self.target(1)
        drafting = [(v, k) for v, k in zip(views, ks) if k]
        if not drafting:
            return t
        steady = [min(max(1, v.draft_lag), self.t.steady) for v, _ in drafting]
        t += self.draft_forward(sum(steady), doubt)
        t += sum(self.draft_forward(sum(k >= j for _, k in drafting), doubt) for j in range(2, max(ks) + 1))
        for (v, _), s in zip(drafting, steady):
            catchup = self.draft_forward(v.draft_lag) - self.draft_forward(s)
            t += max(0.0, catchup) / max(1, v.remaining or self.t.unknown_left)
        return t


class Regime:
    """What is known of the draft in one sampling regime, pooled over its sequences."""

    def __init__(self, k_max: int, t: Tuning) -> None:
        self.t, self.estimate = t, Acceptance(k_max, t)
        self.seen = 0.0                  # positions verified in this process (a prior is no verdict)
        self.promised = [0.0, 0.0, 0.0]  # recent drafting rounds' tokens, the estimate's promise, rounds
        self.idle, self.wait, self.retried = 0, t.retry, 0  # plain rounds in a row; before a retry; 2: one ran

    @property
    def known(self) -> bool:
        return self.seen >= self.t.evidence

    def read_back(self, accepted: float, positions: int) -> None:
        self.estimate.read_back(accepted, positions)
        self.seen += positions

    def measured(self, acceptance: float, positions: int) -> None:
        """The draft measured on this process's own text (a prompt): it outweighs what was known."""
        self.estimate.forget(self.t.forget)
        self.estimate.add_prior(acceptance, positions)
        self.seen += positions

    def observe(self, drafted: int, accepted: int, after_miss: bool) -> None:
        """A verdict. Drafting that delivers under ``guard`` of its promise (the text
        changed; deep positions, rarely reached, keep old rates) forgets most."""
        promise = expected_tokens(drafted, self.estimate.per_position(after_miss))[drafted]
        self.promised = [p * 0.8 + x for p, x in zip(self.promised, (accepted + 1, promise, 1))]
        verified = drafted if accepted == drafted else accepted + 1
        self.estimate.observe(verified, accepted, after_miss)
        self.seen += verified
        if self.promised[2] >= 3 and self.promised[0] < self.t.guard * self.promised[1]:
            self.estimate.forget(self.t.forget)
            self.promised = [0.0, 0.0, 0.0]

    def round(self, drafted: bool) -> None:
        """A round passed, drafting in this regime or not; the one after a retry
        tells whether drafting held (the wait resets) or not (it doubles)."""
        if self.retried == 1:
            self.wait = self.t.retry if drafted else min(2 * self.wait, self.t.retry_max)
        self.retried = max(0, self.retried - 1)
        self.idle = 0 if drafted else self.idle + 1

    def gains(self, v: SlotView, optimistic: bool = False) -> List[float]:
        """Expected tokens at K = 0..cap: estimated once known, else (or ``optimistic``)
        at the optimistic rate (a probe's first ``probe_k`` positions only)."""
        if self.known and not optimistic:
            return expected_tokens(v.cap, self.estimate.per_position(v.after_miss))
        n = v.cap if optimistic else self.t.probe_k
        return expected_tokens(v.cap, [self.estimate.optimistic(self.idle)] * n + [0.0] * v.cap)


class Policy:
    """K per sequence each round, up to ``k_max``; ``passes``, ``free_draft`` as
    :class:`Costs`; ``clock`` False (a seeded p/q run, whose text the clock must
    not change) prices every round at the guesses and times nothing."""

    def __init__(self, k_max: int = AUTO_K_MAX, passes: Optional[Callable] = None, free_draft: bool = False,
                 clock: bool = True, tuning: Tuning = Tuning()) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max, self.clock, self.t = k_max, clock, tuning
        self.costs, self.regimes = Costs(tuning, passes, free_draft), {}  # type: Costs, Dict[str, Regime]

    auto = True  # what K objects say of themselves (a fixed K: :class:`~specgguf.engine.draft_length.FixedK`)

    def regime(self, name: str) -> Regime:
        if name not in self.regimes:
            self.regimes[name] = Regime(self.k_max, self.t)
        return self.regimes[name]

    def acceptance(self, regime: str) -> Acceptance:
        return self.regime(regime).estimate

    def blind(self) -> "Policy":
        """A policy like this one, blind to the clock, knowing nothing yet (for a seeded p/q run)."""
        return Policy(self.k_max, self.costs.count_passes, self.costs.free, clock=False, tuning=self.t)

    def begin(self, regime: str, prior: Optional[float] = None, record: Optional[dict] = None) -> None:
        """On ``regime``'s first use: what was known before this process (a
        measured acceptance ``prior``, a stored ``record``); later calls add nothing."""
        if regime not in self.regimes:
            est = self.acceptance(regime)
            if prior is not None:
                est.add_prior(prior)
            est.add_record(record)

    def record(self, regime: str) -> Optional[dict]:
        """What this process learned of ``regime`` to store for later ones (None: nothing, or blind)."""
        if not self.clock or regime not in self.regimes:
            return None
        rec = self.regimes[regime].estimate.record()
        return rec if rec["total"][1] > 0 else None

    def forget(self) -> None:
        """Every regime starts again (from what :meth:`begin` is given next)."""
        self.regimes.clear()

    def read_back(self, regime: str, accepted: float, positions: int) -> None:
        """The draft's read-back of ``positions`` tokens it caught up on (``accepted`` of them)."""
        self.regime(regime).read_back(accepted, positions)

    def measured(self, regime: str, acceptance: float, positions: int) -> None:
        """The draft's acceptance measured on a prompt of ``regime`` (it outweighs what was known)."""
        self.regime(regime).measured(acceptance, positions)

    def choose(self, views: Sequence[SlotView]) -> List[int]:
        """K for each sequence (see the module docstring)."""
        r = [self.regime(v.regime) for v in views][0]
        if self.clock and not self.costs.target.s:
            return [v.cap if v.fixed else 0 for v in views]
        lone = len(views) == 1 and not views[0].fixed and views[0].cap > 0 and r.known
        if lone and r.idle >= r.wait and self.clock:
            for hope in (True, False):  # the draft may accept more now, or cost less than when timed
                best, gain = self._best(views, optimistic=hope, doubt=not hope)
                if best[0] and gain >= self.t.retry_gain:
                    r.retried = 2
                    if not hope:  # its timings were doubted: this round's replace them
                        self.costs.draft.s.clear()
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

    def observe(self, regime: str, drafted: int, accepted: int, after_miss: bool = False) -> None:
        """One sequence's verdict: the first ``accepted`` of ``drafted`` tokens."""
        if drafted:
            self.regime(regime).observe(drafted, accepted, after_miss)

    def round_done(self, views: Sequence[SlotView], ks: Sequence[int], m: Optional[Measured]) -> None:
        """After a round that drafted ``ks`` for ``views``: its costs (``m``; None: untimed)."""
        if m is not None and self.clock:
            self.costs.observe(m, any(v.target_lag > 1 for v in views), self.costs.passes(views, ks))
        drafted = {v.regime for v, k in zip(views, ks) if k}
        for name, r in self.regimes.items():
            r.round(name in drafted)

    def rates(self, regime: str) -> List[float]:
        """Tokens per second a lone steady sequence of ``regime`` is predicted at, K = 0..k_max."""
        v, g = SlotView(regime, self.k_max, remaining=self.t.unknown_left), expected_tokens(
            self.k_max, self.acceptance(regime).per_position())
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
        r, (acc, ver) = self.rates(regime), self.acceptance(regime).total
        best = max(range(1, len(r)), key=lambda k: (r[k], -k))
        head = (f"K={best} is predicted at {r[best] / r[0]:.2f}x plain decoding" if r[best] > r[0] else
                f"drafting off: the best draft length, K={best}, is predicted at {r[best] / r[0]:.2f}x plain decoding")
        known = f"draft acceptance {acc / ver:.2f} over {ver:.0f} positions" if ver else "no acceptance known yet"
        basis = ("no forward timed yet" if not self.costs.target.s else "costs from this process's rounds" +
                 ("" if self.costs.draft.s or self.costs.free else " (the draft's guessed: none timed yet)"))
        return f"{head} (K {' '.join(f'{k}:{r[k] / r[0]:.2f}' for k in range(1, len(r)))}); {known}; {basis}"
