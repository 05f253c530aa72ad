"""K per slot when several sequences share each round (the engine's policy).

A round's wall time is the target's forward over every slot's tokens, the
draft's forwards (its catch-up, then one forward per draft position across
the slots still drafting) and the work around them (warping and verifying
each row, picking each draft token). Each piece is a line in the tokens or
rows it processes, fitted by discounted least squares to what the engine's
own steady forwards took (:class:`RoundCosts`, of :class:`LineFit` lines; a
draft's catch-ups have a line of their own): no cost is guessed once the
engine has run a few rounds. Acceptance comes from every slot's verdicts,
pooled per sampling regime (:class:`~specgguf.engine.acceptance.AcceptanceEstimate`).

The choice maximises the batch's expected tokens per second (see
:meth:`BatchPolicy.choose` for how a round slowed by a prompt is scored).
K = 0 for all is batched plain decoding, always a candidate: speculation drafts only where
the measured lines say it delivers more. Under load the target's line is
steeper in total tokens than the draft's savings, so K shrinks by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from .acceptance import AcceptanceEstimate
from .policy import Delivered, DraftPolicy, Trials, expected_tokens, why_line


def ubatches(counts: Sequence[Tuple[int, int]]) -> int:
    """How many ubatches (passes over the weights) a split KV cache's
    ``llama_decode`` makes of a batch with ``counts``: ``(sequence id,
    tokens)`` in the batch's order, ids increasing. As llama.cpp's
    ``split_equal`` (sequential): each ubatch takes the run of consecutive
    ids from the first sequence with tokens left, the same number of tokens
    from each (the fewest any has left). Equal counts over consecutive ids:
    one; a sequence left out or one with more tokens: another."""
    left = [(s, n) for s, n in counts if n > 0]
    passes = 0
    while left:
        run = 1
        while run < len(left) and left[run][0] == left[run - 1][0] + 1:
            run += 1
        m = min(n for _, n in left[:run])
        left = [(s, n - m) for s, n in left[:run] if n > m] + left[run:]
        passes += 1
    return passes


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

    def age(self, f: float) -> None:
        """Scale every forward seen by ``f``: the next ones outweigh them."""
        self.w, self.n, self.y, self.nn, self.ny = (x * f for x in (self.w, self.n, self.y, self.nn, self.ny))

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
        slot: its sequence id (with a split target cache, which ubatches a round makes).
    """

    regime: str
    cap: int
    fixed: bool
    target_lag: int
    draft_lag: int
    remaining: int
    after_miss: bool = False
    slot: int = 0

    def steady(self) -> "SlotView":
        """The slot in a steady round: no prompt to read, no catch-up beyond the usual."""
        return replace(self, target_lag=1, draft_lag=min(self.draft_lag, 2))


class RoundCosts:
    """A round's wall time in the tokens and rows it processes: lines fitted
    to the engine's own forwards (module docstring)."""

    HORIZON = 256         # most tokens a catch-up's cost is spread over
    DRAFT_PRIOR = 0.5     # before any draft forward is timed: a draft token costs half a target token
    STEADY = 2            # draft tokens a sequence in a forward without catch-up (its last draft and the bonus)

    def __init__(self, split: bool = False) -> None:
        self.split = split  # the target's KV cache has a stream per slot: a round may take several passes
        self.target, self.draft = LineFit(), LineFit()
        self.catchup = LineFit()  # the draft's forwards that catch up (a prompt, plain rounds' tokens)
        self.rows = LineFit()  # the rest of a round, by the rows verified (each slot's K + 1)

    def lines(self, doubt_draft: bool = False) -> tuple:
        """The fitted lines ``(a, b)`` of the target, the draft (before any
        draft forward: DRAFT_PRIOR of the target's) and the per-row work.
        ``doubt_draft``: the draft's line no dearer than that prior (its
        forwards were timed before a long plain stretch: see :meth:`BatchPolicy.choose`)."""
        t = self.target.line()
        prior = (self.DRAFT_PRIOR * t[0], self.DRAFT_PRIOR * t[1])
        d = self.draft.line() if self.draft.known else prior
        if doubt_draft and d[0] + 2 * d[1] > prior[0] + 2 * prior[1]:
            d = prior
        return t, d, self.rows.line()

    def seconds(self, slots: Sequence[SlotView], ks: Sequence[int], lines: Optional[tuple] = None,
                doubt_draft: bool = False) -> float:
        """Predicted wall time of a round drafting ``ks`` for ``slots``: the
        target's forward, the rows' work, and the draft's first forward (each
        drafting slot's usual one or two tokens) and one forward per further
        draft position. A catch-up beyond the usual is paid once, for the
        rounds that follow: what its forward costs beyond a usual first one
        (the catch-up line, fitted on such forwards) counts spread over the
        tokens the slot has left, at most HORIZON: per token, not per round,
        because a drafting round is weighed against a plain round, which
        moves one token. Spread
        over the rounds, a catch-up had to pay for itself E(K) times over: a
        request whose draft lagged its prompt never drafted, and its lag and
        catch-up grew with every plain round. ``lines``: :meth:`lines`, when
        the caller holds them already; ``doubt_draft``: as :meth:`lines`, the
        catch-ups priced at the draft line's rate, if lower."""
        (at, bt), (ad, bd), (ar, br) = lines or self.lines(doubt_draft)
        n = sum(ks)
        t = at * self.passes(slots, ks) + bt * (sum(s.target_lag for s in slots) + n) + ar + br * (n + len(slots))
        if n:
            first = extra = later = 0.0
            for s, k in zip(slots, ks):
                if k:
                    first += min(s.draft_lag, 2)
                    later += k - 1
                    if s.draft_lag > 2:
                        cost = bd * (s.draft_lag - 2)
                        if self.catchup.known:
                            fitted = max(0.0, self.catchup(s.draft_lag) - ad - 2 * bd)
                            cost = min(cost, fitted) if doubt_draft else fitted
                        extra += cost / min(self.HORIZON, max(1.0, s.remaining))
            t += ad * max(ks) + bd * (first + later) + extra
        return t

    def passes(self, slots: Sequence[SlotView], ks: Sequence[int]) -> int:
        """The target's passes over its weights in a round drafting ``ks``
        for ``slots`` (in slot order): one, or with a split cache
        :func:`ubatches`' count (a pass costs the target line's intercept)."""
        if not self.split or len(slots) < 2:
            return 1
        return ubatches([(s.slot, s.target_lag + k) for s, k in zip(slots, ks)])

    def observe_round(self, target_tokens: int, target_seconds: float, draft_forwards: Sequence[tuple],
                      rows: int, other_seconds: float, prompt: bool = False, passes: int = 1) -> None:
        """One round's measured pieces: the target's forward over
        ``target_tokens`` (``prompt``: it also read a prompt), each draft
        forward ``(tokens, seconds, sequences)``, and the rest of the round,
        which verified ``rows`` rows.

        Only steady forwards fit the round lines: the target's without a
        prompt, the draft's at most STEADY tokens a sequence; the draft's
        longer ones (catch-ups) fit a line of their own. A forward's cost per
        token falls as it grows, so a prompt's 40 tokens, fitted with the
        rounds' 1-9, bent both lines flat: a K=8 round was predicted at
        150 ms where it took 225, the policy promised 1.7x plain decoding,
        drafted K=8 and delivered 1.15x, below a fixed K=6. Priced at the
        steady line instead, a catch-up looked so dear that a new request
        never drafted (its lag grows each plain round). A round the split
        cache cut into several ``passes`` fits none of the lines' target part
        (the line is one pass's)."""
        if not prompt and passes == 1:
            self.target.observe(target_tokens, target_seconds)
        for n, sec, seqs in draft_forwards:
            (self.draft if n <= self.STEADY * seqs else self.catchup).observe(n, sec)
        self.rows.observe(rows, other_seconds)


@dataclass
class Regime:
    """What the policy knows of the draft in one sampling regime, pooled over its slots."""

    estimate: AcceptanceEstimate
    wait: int                 # idle rounds before a lone slot re-explores
    idle: int = 0             # rounds since a slot of the regime drafted
    trying: bool = False      # the last drafting round was a re-exploration
    seen: float = 0.0         # positions verified here, never decayed
    delivered: Delivered = field(default_factory=Delivered)  # drafting rounds' tokens against the estimate's


class BatchPolicy:
    """Per-slot K for the engine's rounds, from measured forward costs.

    Args:
        k_max: the largest K a slot drafts.
        split: the target's KV cache has a stream per slot (a round whose
            slots carry unequal counts takes several passes: :func:`ubatches`).
    """

    PROBE_K = 3           # while a regime's acceptance is unknown, its slots draft this many
    PROBE_EVIDENCE = 16   # draft positions verified before the estimate is trusted
    PROBE_ODDS = Trials.PROBE_ODDS  # the chance a probe finds the optimistic acceptance
    GUARD = 0.6           # drafting rounds delivering under this of the tokens they were expected to: forget
    FORGET = DraftPolicy.FORGET  # what is kept of the acceptance counts then
    EXPLORE_EVERY = 48    # rounds without drafting in a regime before a lone slot tries again
    EXPLORE_BACKOFF = 16  # each try that went plain at once doubles the wait, up to this many times
    DOUBT_MARGIN = 1.2   # and only if drafting would win by this at the estimated acceptance and the prior's price
    AGE = 0.1             # what a re-exploration that drafts keeps of the draft's timed forwards

    def __init__(self, k_max: int = 8, split: bool = False) -> None:
        self.k_max = k_max
        self.costs = RoundCosts(split)
        self.regimes: Dict[str, Regime] = {}

    def estimate(self, regime: str, prior: Optional[float] = None,
                 evidence: Optional[dict] = None) -> AcceptanceEstimate:
        """The pooled acceptance of ``regime``, made on first use from a
        measured ``prior`` and stored ``evidence``."""
        if regime not in self.regimes:
            est = AcceptanceEstimate(self.k_max, prior)
            est.add_before(evidence)
            self.regimes[regime] = Regime(est, self.EXPLORE_EVERY)
        return self.regimes[regime].estimate

    def _known(self, regime: str) -> bool:
        """PROBE_EVIDENCE positions known: verified here, or before (a prior, stored evidence)."""
        r = self.regimes[regime]
        return max(r.seen, r.estimate.totals()[1]) >= self.PROBE_EVIDENCE

    def _gains(self, s: SlotView, alone: bool) -> List[float]:
        """Expected tokens the slot emits at K = 0..cap. For a lone slot (under
        load a probe's catch-up stalls every slot) after ``wait`` rounds
        without drafting (see :meth:`round_done`): every K at the optimistic
        figure. Else, until PROBE_EVIDENCE positions were ever verified: the
        optimistic figure for PROBE_K tokens (counted with the decaying
        evidence instead, a poor draft's few verdicts never added up, and it
        was probed, catch-up and all, in every call: 0.94x plain decoding).
        Capped at PROBE_K, a re-exploration could never pay where
        a draft token costs a third of a target token (a round of K=3 must
        then beat plain decoding at 3.8x its time): a lone request that had
        gone plain for 48 rounds stayed plain to its end (128 of 128
        rounds, where K=6 delivered 1.2x)."""
        r = self.regimes[s.regime]
        est = r.estimate
        if alone and r.idle >= r.wait:
            acc = [est.optimistic()] * self.k_max
        elif not self._known(s.regime):
            acc = [est.optimistic()] * self.PROBE_K + [0.0] * self.k_max
        else:
            acc = est.per_position(s.after_miss)
        return expected_tokens(s.cap, acc)

    def choose(self, slots: Sequence[SlotView]) -> List[int]:
        """K for each slot: the best common K, then each slot's own in turn.

        Choices are scored as expected tokens minus ``rate`` x predicted
        seconds, where ``rate`` is the best tokens/s these slots reach in a
        steady round (no prompt to read, no catch-up). Maximising the round's
        own tokens/s instead would draft in a round made slow by another
        slot's prompt (a long round makes any addition look cheap), though
        the seconds drafting adds buy fewer tokens than the plain rounds after it."""
        for s in slots:
            self.estimate(s.regime)
        if not self.costs.target.known:
            return [s.cap if s.fixed else 0 for s in slots]
        known: Dict[tuple, List[float]] = {}
        gains = [known.setdefault((s.regime, s.after_miss, s.cap), self._gains(s, len(slots) == 1)) for s in slots]
        slots, probe = self._probes(slots)
        doubt = len(slots) == 1 and self._doubts_price(slots[0])
        lines = self.costs.lines(doubt_draft=doubt)
        seconds = lambda sl, ks, ln: self.costs.seconds(sl, ks, ln, doubt_draft=doubt)  # noqa: E731
        steady = [s.steady() for s in slots]
        commons = [[s.cap if s.fixed else min(k, s.cap) for s in slots] for k in range(self.k_max + 1)]
        rate = max(sum(g[k] for g, k in zip(gains, ks)) / max(seconds(steady, ks, lines), 1e-9) for ks in commons)
        score = lambda ks: sum(g[k] for g, k in zip(gains, ks)) - rate * seconds(slots, ks, lines)  # noqa: E731
        best = max(commons, key=score)
        for i, s in enumerate(slots):
            if not s.fixed and s.cap > 0:
                options = (0, min(self.PROBE_K, s.cap)) if probe[i] else range(s.cap + 1)
                best[i] = max(options, key=lambda k: score(best[:i] + [k] + best[i + 1:]))
        if doubt and best[0]:  # the forwards timed now price the draft, not the old ones
            self.costs.draft.age(self.AGE)
            self.costs.catchup.age(self.AGE)
        return best

    def _probes(self, slots: Sequence[SlotView]) -> tuple:
        """``(slots, probe)``: which slots probe an unknown regime, and the
        slots as :meth:`choose` weighs them. Acceptance is pooled per regime,
        so one slot's probe informs them all: the others of its regime wait
        (cap 0; each of 8 new requests probing at once, each with its prompt
        to catch up on, read 0.65 of k=0 on a fresh engine's first batch). A
        probe's catch-up repays only if the draft turns out good: it is
        spread over the tokens left times PROBE_ODDS."""
        out, probe, first = [], [], set()
        for s in slots:
            p = s.cap > 0 and not s.fixed and not self._known(s.regime)
            if p and s.regime in first:
                p, s = False, replace(s, cap=0)
            elif p:
                first.add(s.regime)
                s = replace(s, remaining=max(1, round(s.remaining * self.PROBE_ODDS)))
            out.append(s)
            probe.append(p)
        return out, probe

    def _doubts_price(self, s: SlotView) -> bool:
        """Whether a lone slot re-exploring (see :meth:`_gains`) prices the
        draft no dearer than the prior (:meth:`RoundCosts.lines`): when, at
        the estimated acceptance and that price, drafting would beat plain
        decoding by DOUBT_MARGIN in a steady round. This machine has phases
        in which the draft's forwards alone slow, and drafting priced in one
        stopped for good (simulator: 0.947 of the best K), as no draft
        forward was timed again; the decoder's policy retries likewise
        (:meth:`~specgguf.engine.policy.Trials.retry`). At a margin of 1.1,
        the recorded poor drafts' early verdicts (0.6 on the first position)
        passed, and their catch-ups cost 0.4-0.7% (simulator); at 1.2 no
        trace but the two with phases changes.
        """
        r = self.regimes[s.regime]
        if s.fixed or s.cap == 0 or r.idle < r.wait:
            return False
        steady = s.steady()
        g = expected_tokens(s.cap, r.estimate.per_position(s.after_miss))
        lines = self.costs.lines(doubt_draft=True)
        rate = [g[k] / max(self.costs.seconds([steady], [k], lines, True), 1e-9) for k in range(s.cap + 1)]
        return max(rate[1:]) > self.DOUBT_MARGIN * rate[0]

    def explain(self, regime: str) -> str:
        """One line on what a slot of ``regime`` would draft in a steady
        round on its own, and what that rests on (other slots' load shrinks
        K further: see :meth:`choose`)."""
        costs = self.costs
        if not costs.target.known:
            return "no forward timed yet"
        self.estimate(regime)
        lone = SlotView(regime, self.k_max, False, 1, 1, costs.HORIZON)
        g = self._gains(lone, False)
        lines = costs.lines()
        r = [g[k] / max(costs.seconds([lone], [k], lines), 1e-9) for k in range(self.k_max + 1)]
        timed = "draft forwards timed" if costs.draft.known else "the draft's cost guessed (no draft forward timed yet)"
        return why_line(r, self.regimes[regime].estimate.totals(), f"costs from this engine's forwards ({timed}); "
                        "other requests in the same rounds shrink K", qualifier=" for a request alone")

    def observe(self, regime: str, drafted: int, accepted: int, after_miss: bool) -> None:
        """One slot's verdict: ``accepted`` of ``drafted`` tokens."""
        if drafted:
            r = self.regimes[regime]
            r.delivered.add(accepted + 1, expected_tokens(drafted, r.estimate.per_position(after_miss))[drafted])
            verified = drafted if accepted == drafted else accepted + 1
            r.estimate.observe(verified, accepted, after_miss)
            r.seen += verified
            if r.delivered.below(self.GUARD):  # the estimate lags what the text does now: mostly forget it
                r.estimate.forget(self.FORGET)
                r.delivered = Delivered()

    def round_done(self, drafted_regimes: set) -> None:
        """Count rounds without drafting per regime, and judge re-explorations:
        one the next round drafts on from resets the wait; one it drops
        doubles it. A draft too poor to pay (Q2_K here, 0.55) paid a
        catch-up of the whole text every 48 rounds: 4-5% of each call."""
        for regime, r in self.regimes.items():
            drafted = regime in drafted_regimes
            explored = drafted and r.idle >= r.wait
            if drafted and not explored:  # drafting on its merits: tries come at the usual pace
                r.wait = self.EXPLORE_EVERY
            elif not drafted and r.trying:  # a try dropped at once
                r.wait = min(2 * r.wait, self.EXPLORE_EVERY * self.EXPLORE_BACKOFF)
            r.trying = explored
            r.idle = 0 if drafted else r.idle + 1
            if not drafted:
                r.estimate.idle()
