"""How many tokens each sequence drafts next round (``k="auto"``): one policy
for every path, one sequence (the CLI, ``generate``, ``SpeculativeLlama``,
``DraftModel``) or several (``serve``).

A round that drafts K tokens for a sequence emits E(K) = 1 + a_0 + a_0 a_1 +
... of them (a_i: the chance draft position i is accepted given the ones
before it were; Leviathan et al.). What a round costs is predicted from
this process's own rounds, piece by piece (:class:`Costs`): the target's
forward as timed per token count for one sequence (:class:`ForwardTable`),
on a line in its tokens for several; each draft forward on a line in its
tokens (catch-ups on skipped text on a line of their own); the rest of the
round on a line in the rows it verifies. Only what was never timed is
guessed, hopefully (a draft as cheap as a board's, a longer forward as
cheap as the longest timed), so that one round measures it; nothing stored
prices anything: identical processes here differ by 20% in speed.

Acceptance is pooled per sampling regime (:class:`Regime`); what was known
before the process (a calibration, stored evidence) weighs a few
observations, and the process's own measurement of a prompt outweighs it.
Each round the policy drafts, per sequence, the K that gives the round the
most expected tokens per second; plain decoding (K = 0) is always a
candidate. Exploration, each bounded: one sequence probes a regime not
known yet with PROBE_K tokens (its catch-up weighed at PROBE_ODDS); a lone
sequence that waited re-explores at the optimistic acceptance, the draft no
dearer than DOUBT of a target token (its forwards may have been timed in a
phase in which the draft alone slowed), each fruitless try doubling the
wait; one plain round in BASELINE_EVERY re-times the target's single token;
drafting that delivers under GUARD of its promise makes the estimate mostly
forgotten.

Nothing here touches models, files or the clock: callers say what each
round held (:meth:`Policy.choose`) and took (:meth:`Policy.observe`,
:meth:`Policy.round_done`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence

from ..config import AUTO_K_MAX


def expected_tokens(k_max: int, acc: Sequence[float]) -> List[float]:
    """E(k) for k = 0..k_max from per-position acceptances ``acc``."""
    out, run = [1.0], 1.0
    for a in acc[:k_max]:
        run *= a
        out.append(out[-1] + run)
    return out


class Acceptance:
    """A draft's acceptance in one regime: decayed counts per draft position.

    Index k_max counts the first positions of rounds after a rejection:
    drafts miss in runs, so such a round starts worse (pooled, 0.7 against
    0.9 in simulation kept new calls from drafting). ``total`` counts a
    prior once; each position counts it.
    """

    DECAY = 0.95      # per round with verdicts: a memory of about 20 rounds
    SHRINK = 8.0      # each position is shrunk towards the overall rate by this many observations: deep
                      # positions are reached rarely (at 2, 0.86 where the text gave 0.96 kept K at 6 when 8 paid)
    PRIOR_CAP = 8.0   # what was known before the process weighs at most this many observations
    IDLE = 0.995      # per round without verdicts, on the evidence optimistic() counts

    def __init__(self, k_max: int) -> None:
        self.accepted, self.verified = [0.0] * (k_max + 1), [0.0] * (k_max + 1)
        self.total = [0.0, 0.0]
        self.idle = 0

    def add(self, accepted: Sequence[float], verified: Sequence[float], total: Sequence[float], f: float = 1.0) -> None:
        self.accepted = [a + f * x for a, x in zip(self.accepted, accepted)]
        self.verified = [v + f * x for v, x in zip(self.verified, verified)]
        self.total = [t + f * x for t, x in zip(self.total, total)]

    def add_prior(self, rate: float, weight: float = PRIOR_CAP) -> None:
        """A measured per-token acceptance ``rate``, worth ``weight`` observations at every position."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"a measured acceptance must be in [0, 1], got {rate!r}")
        n = len(self.verified)
        self.add([rate * weight] * n, [weight] * n, [rate * weight, weight])

    def add_record(self, record: Optional[dict]) -> None:
        """Stored counts (:meth:`record`) scaled to at most PRIOR_CAP observations; a damaged one adds nothing."""
        try:
            acc, ver, tot = ([float(x) for x in record[k]] for k in ("accepted", "verified", "total"))
            if len(acc) != len(self.verified) or len(ver) != len(acc) or len(tot) != 2 or min(acc + ver + tot) < 0:
                raise ValueError("counts of another shape")
        except (KeyError, TypeError, ValueError):
            return
        self.add(acc, ver, tot, min(1.0, self.PRIOR_CAP / tot[1]) if tot[1] > 0 else 0.0)

    def record(self) -> dict:
        return {"accepted": list(self.accepted), "verified": list(self.verified), "total": list(self.total)}

    def observe(self, verified: int, accepted: int, after_miss: bool = False) -> None:
        """A round whose verifier decided ``verified`` positions, accepting the first ``accepted``."""
        if verified:
            self._evidence()
            for i in range(min(verified, len(self.verified) - 1)):
                j = -1 if i == 0 and after_miss else i
                self.verified[j] += 1.0
                self.accepted[j] += 1.0 if i < accepted else 0.0
            self.total = [self.total[0] + accepted, self.total[1] + verified]

    def observe_skipped(self, accepted: float, positions: int) -> None:
        """The draft's read-back of ``positions`` tokens it caught up on
        (``accepted``: their summed acceptances), each a first position."""
        if positions:
            self._evidence()
            self.verified[0] += positions
            self.accepted[0] += accepted
            self.total = [self.total[0] + accepted, self.total[1] + positions]

    def _evidence(self) -> None:
        self.forget(self.DECAY)  # per round with verdicts, so plain rounds do not erase what was learned
        self.idle = 0

    def forget(self, f: float) -> None:
        self.accepted, self.verified = [a * f for a in self.accepted], [v * f for v in self.verified]
        self.total = [t * f for t in self.total]

    def per_position(self, after_miss: bool = False) -> List[float]:
        """Conditional acceptance per draft position (k_max values), shrunk to the overall rate."""
        overall = (self.total[0] + 1.0) / (self.total[1] + 2.0)
        out = [(a + self.SHRINK * overall) / (v + self.SHRINK) for a, v in zip(self.accepted, self.verified)]
        return ([out[-1]] if after_miss else out[:1]) + out[1:-1]

    def optimistic(self) -> float:
        """One sigma above the per-token acceptance, the evidence thinning while idle; at most 0.99."""
        f = self.IDLE ** self.idle
        n = self.total[1] * f
        g = (self.total[0] * f + 1.0) / (n + 2.0)
        return min(0.99, g + (g * (1.0 - g) / (n + 1.0)) ** 0.5)


class ConfidenceBins:
    """Acceptance by the draft's confidence in its token, in ten bins: what
    ``p_min="auto"`` learns its cutoff from (before data, confidence ~ acceptance)."""

    def __init__(self) -> None:
        self.accepted, self.verified = [0.0] * 10, [0.0] * 10

    def observe(self, verified: int, accepted: int, confidences: Optional[Sequence[float]], decay: float) -> None:
        if verified:
            self.accepted, self.verified = [a * decay for a in self.accepted], [v * decay for v in self.verified]
        for i in range(min(verified, 0 if confidences is None else len(confidences))):
            b = min(9, max(0, int(confidences[i] * 10)))
            self.verified[b] += 1.0
            self.accepted[b] += 1.0 if i < accepted else 0.0

    def cutoff(self, need: float) -> float:
        """The lowest confidence whose bin, and every bin above it, accepts at least ``need``."""
        ok = [(a + 0.2 * b + 0.1) / (v + 2.0) >= need for b, (a, v) in enumerate(zip(self.accepted, self.verified))]
        return next((b / 10 for b in range(10) if all(ok[b:])), 1.0)


class LineFit:
    """``seconds = a + b * tokens`` by least squares over recent forwards, each
    weight decaying by DECAY per new one. With too little spread in the
    token counts to see a slope, the slope is SLOPE_PRIOR times the
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
        return (my - b * mn, b) if my >= b * mn else (0.0, my / mn)

    def age(self, f: float) -> None:
        """Scale every forward seen by ``f``: the next ones outweigh them."""
        self.w, self.n, self.y, self.nn, self.ny = (x * f for x in (self.w, self.n, self.y, self.nn, self.ny))

    def __call__(self, tokens: int) -> float:
        a, b = self.line()
        return a + b * tokens if tokens > 0 else 0.0


@dataclass
class SlotView:
    """What the policy needs of one sequence this round.

    Attributes:
        regime: its sampling regime (acceptance is pooled by it).
        cap: the largest K it may draft (its budget, a fixed k, no drafter: 0).
        fixed: the caller fixed K (``cap`` is then that K, and it is kept).
        target_lag: tokens its target cache lacks besides the drafts (1 usually; a prompt: more).
        draft_lag: tokens its draft cache lacks (caught up on before its first draft).
        remaining: tokens it may still emit (None: unknown, as in ``DraftModel``).
        after_miss: its last round ended in a rejection.
        slot: its sequence id (which passes a round makes: ``Costs.passes``).
    """

    regime: str
    cap: int
    fixed: bool = False
    target_lag: int = 1
    draft_lag: int = 1
    remaining: Optional[int] = None
    after_miss: bool = False
    slot: int = 0

    def steady(self) -> "SlotView":
        """The sequence in a steady round: no prompt to read, no catch-up beyond the usual."""
        return replace(self, target_lag=1, draft_lag=min(self.draft_lag, 2))


@dataclass
class Measured:
    """One round's pieces as the caller timed them (seconds): the target's
    forward over ``target_tokens``, each draft forward ``(tokens, seconds,
    sequences)``, and the rest of the round, which verified ``rows`` rows."""

    target_tokens: int
    target_seconds: float
    draft_forwards: Sequence[tuple] = ()
    rows: int = 1
    rest_seconds: float = 0.0


class ForwardTable:
    """What a target forward of b = 1..size tokens of one sequence takes, as
    timed in this process: one token in seconds, more as a ratio to it
    (when timed), so that every count follows the machine's speed as the
    single token is re-timed (identical processes here differ by 20%).

    Why not the line alone: a forward's cost is not linear in its tokens.
    llama.cpp runs 1 token by another kernel (0.69 of a 2-token forward
    through ``Llama(draft_model=...)``), and on Zen 4 2 -> 9 tokens cost
    29 -> 44 ms, concave, so a line through the K=4-6 rounds a policy
    settles in priced K=8 15% too dear and it never went there (0.944 of
    the best fixed K in the simulator). A count not timed yet is priced
    between the counts timed either side of it; above every count timed, at
    the largest one's price: hopeful (costs rise with tokens, so this is a
    lower bound), so that one round times it. Rounds of several sequences
    keep the line: there a count above every one timed is a batch the
    table never saw (four plain slots timed at 4 tokens priced four slots
    drafting one token each at that; serve at 4 clients read 0.94x -k 0).
    """

    def __init__(self, size: int) -> None:
        self.one: Optional[float] = None                           # seconds of one token
        self.ratio: List[Optional[float]] = [None] * (size + 1)    # seconds of b tokens / one
        self.prices: Optional[List[float]] = None                  # per count, from the two above; None: stale

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens == 1:
            self.one = _follow(self.one, seconds)
        elif 1 < tokens < len(self.ratio) and self.one:
            self.ratio[tokens] = _follow(self.ratio[tokens], seconds / self.one)
        self.prices = None

    def __call__(self, tokens: int, line: Callable[[int], float]) -> Optional[float]:
        """Seconds for ``tokens``, or None past the table or before one token is timed (``line``: the
        price above one token while no other count is timed)."""
        if not 0 < tokens < len(self.ratio) or not self.one:
            return None
        if not any(self.ratio):
            return self.one if tokens == 1 else max(self.one, line(tokens))
        if self.prices is None:  # asked for every K of every round: worked out once per forward timed
            self.prices = self._interpolate()
        return self.prices[tokens]

    def _interpolate(self) -> List[float]:
        timed = [(1, self.one)] + [(b, r * self.one) for b, r in enumerate(self.ratio) if r]
        out = [0.0]
        for tokens in range(1, len(self.ratio)):
            (b0, s0) = [x for x in timed if x[0] <= tokens][-1]
            above = [x for x in timed if x[0] >= tokens]
            (b1, s1) = above[0] if above else (b0, s0)
            out.append(s0 if b1 == b0 else s0 + (s1 - s0) * (tokens - b0) / (b1 - b0))
        return out


class Costs:
    """A round's wall time from this process's rounds: the target's forward
    of one sequence from :class:`ForwardTable`, of several from a line;
    the draft's and the rest from lines.

    Args:
        passes: ``[(slot, tokens)] -> passes`` the target's forward makes over
            its weights (a KV stream per slot: :func:`specgguf.llama.model.ubatches`); None: one.
        free_draft: the drafter costs nothing (an n-gram lookup).
    """

    HORIZON = 256      # most tokens a catch-up's cost is spread over
    GUESS = 0.1        # before any draft forward is timed, a draft token at this of a target token:
                       # a board's; hopeful, so that one drafting round measures it
    DOUBT = 0.5        # a draft doubted (timed before a long plain stretch) at most this: this machine's
    STEADY = 2         # draft tokens a sequence has in a forward without catch-up

    def __init__(self, k_max: int = AUTO_K_MAX, passes: Optional[Callable] = None, free_draft: bool = False) -> None:
        self.count_passes, self.free = passes, free_draft
        self.target, self.draft, self.catchup, self.rest = LineFit(), LineFit(), LineFit(), LineFit()
        self.timed = ForwardTable(k_max + 1)

    def lines(self, doubt: bool = False) -> tuple:
        """The lines ``(a, b)`` of the target (before any forward: one unit
        and the prior slope), the draft (its steady forwards'; else its
        catch-ups'; else GUESS of the target's) and the rest, and ``doubt``:
        the draft then no dearer than DOUBT of the target's."""
        t = self.target.line() if self.target.known else (1.0, LineFit.SLOPE_PRIOR)
        d = (0.0, 0.0) if self.free else next((f.line() for f in (self.draft, self.catchup) if f.known),
                                               (self.GUESS * t[0], self.GUESS * t[1]))
        if doubt and d[0] + 2 * d[1] > self.DOUBT * (t[0] + 2 * t[1]):
            d = (self.DOUBT * t[0], self.DOUBT * t[1])
        return t, d, self.rest.line(), doubt

    def basis(self) -> str:
        """What the prices rest on, for users."""
        if not self.target.known:
            return "no forward timed yet"
        guessed = not (self.draft.known or self.free)
        return "costs from this process's rounds" + (" (the draft's guessed: none of its forwards timed yet)"
                                                      if guessed else "")

    def passes(self, slots: Sequence[SlotView], ks: Sequence[int]) -> int:
        if self.count_passes is None or len(slots) < 2:
            return 1
        return self.count_passes([(s.slot, s.target_lag + k) for s, k in zip(slots, ks)])

    def seconds(self, slots: Sequence[SlotView], ks: Sequence[int], lines: tuple) -> float:
        """Predicted wall time of a round drafting ``ks`` for ``slots``: the
        target's passes and tokens, the rows' work, the draft's first forward
        (each drafting sequence's usual one or two tokens) and one forward per
        further position. A catch-up beyond the usual is paid once for the
        rounds after it: its forward's cost beyond a usual first one (the
        catch-up line) counts per token left, at most HORIZON, because a
        drafting round is weighed against a plain one, which moves one token
        (spread over rounds instead, a request whose draft lagged its prompt
        never drafted, its lag growing each plain round)."""
        (at, bt), (ad, bd), (ar, br), doubt = lines
        n, b = sum(ks), sum(s.target_lag for s in slots) + sum(ks)
        passes = self.passes(slots, ks)
        timed = self.timed(b, lambda x: at + bt * x) if len(slots) == 1 else None
        t = (at * passes + bt * b if timed is None else timed) + ar + br * (n + len(slots))
        if not n:
            return t
        first = later = extra = 0.0
        for s, k in zip(slots, ks):
            if k:
                first, later = first + min(s.draft_lag, self.STEADY), later + k - 1
                if s.draft_lag > self.STEADY and not self.free:
                    cost = bd * (s.draft_lag - self.STEADY)
                    if self.catchup.known:  # its own line; doubted, no dearer than the draft's
                        fitted = max(0.0, self.catchup(s.draft_lag) - ad - self.STEADY * bd)
                        cost = min(cost, fitted) if doubt else fitted
                    extra += cost / min(self.HORIZON, max(1, s.remaining or self.HORIZON // 2))
        return t + ad * max(ks) + bd * (first + later) + extra

    def pricer(self, slots: Sequence[SlotView], lines: tuple) -> Callable[..., float]:
        """``price(ks, steady=False)``: :meth:`seconds` of a round drafting
        ``ks`` for ``slots`` (``steady``: in their steady round, no prompt and
        no catch-up beyond the usual), each choice worked out once: choosing
        for a lone sequence asks about the same few choices ~30 times."""
        steady, memo = [s.steady() for s in slots], {}
        same = steady == list(slots)

        def price(ks: Sequence[int], in_steady: bool = False) -> float:
            key = (tuple(ks), in_steady and not same)
            if key not in memo:
                memo[key] = self.seconds(steady if key[1] else slots, ks, lines)
            return memo[key]
        return price

    def observe(self, m: Measured, prompt: bool, passes: int, sequences: int = 1) -> None:
        """A round's pieces. Only steady forwards fit the round lines: the
        target's with no prompt in one pass (and the table: of one sequence), the draft's with at most STEADY
        tokens a sequence; longer draft forwards (catch-ups) fit their own.
        A forward's cost per token falls as it grows, so a prompt's 40 tokens
        fitted with the rounds' 1-9 bent the lines flat (K=8 promised 1.7x
        plain decoding and delivered 1.15x)."""
        if not prompt and passes == 1:
            self.target.observe(m.target_tokens, m.target_seconds)
            if sequences == 1:
                self.timed.observe(m.target_tokens, m.target_seconds)
        for n, sec, seqs in m.draft_forwards:
            (self.draft if n <= self.STEADY * seqs else self.catchup).observe(n, sec)
        self.rest.observe(m.rows, m.rest_seconds)


def _follow(old: Optional[float], new: float) -> float:
    """An estimate moved towards ``new``: noise adds time, so a faster reading is trusted more, and a
    hiccup moves it a quarter of 25% at most."""
    return new if old is None else old + (0.5 if new < old else 0.25) * (min(new, 1.25 * old) - old)


class Regime:
    """What is known of the draft in one sampling regime, pooled over its
    sequences: its acceptance, how much of it this process has seen, how
    recent drafting delivered against the estimate, and when to re-explore."""

    EVIDENCE = 16         # positions this process must see before its estimate is trusted
    GUARD = 0.6           # drafting rounds delivering under this of the tokens promised: forget
    FORGET = 0.2          # what is kept of the acceptance counts then, or when the prompt is measured
    EXPLORE_EVERY = 16    # rounds without drafting before a lone sequence tries again: a rough patch of
                          # text leaves the estimate low until then (Zen 4 trace, engine: 48 -> 0.81, 16 -> 0.99)
    EXPLORE_BACKOFF = 2   # each try that went plain at once doubles the wait, to at most this times
                          # EXPLORE_EVERY: a stored record's low prior outlived longer waits (Zen 4, 16: 0.86)

    def __init__(self, k_max: int) -> None:
        self.estimate, self.bins = Acceptance(k_max), ConfidenceBins()
        self.seen = 0.0                  # positions verified in this process, never decayed
        self.promised = [0.0, 0.0, 0.0]  # drafting rounds' tokens, the estimate's promise, rounds; decayed
        self.wait, self.idle, self.trying = self.EXPLORE_EVERY, 0, False  # idle: rounds since one drafted

    @property
    def known(self) -> bool:
        """EVIDENCE positions seen in this process: what was known before it
        (a stored record, a calibration) is a prior, never a verdict."""
        return self.seen >= self.EVIDENCE

    def read_back(self, accepted: float, positions: int) -> None:
        """The draft's read-back of ``positions`` tokens it caught up on
        (:meth:`Acceptance.observe_skipped`): seen in this process, as verdicts are."""
        self.estimate.observe_skipped(accepted, positions)
        self.seen += positions

    def measured(self, acceptance: float, positions: int) -> None:
        """The draft measured on this process's own text (a prompt, scored by
        both models): evidence at every position, which outweighs what was
        known before (kept at FORGET: a record from other texts is a prior)."""
        self.estimate.forget(self.FORGET)
        self.estimate.add_prior(acceptance, positions)
        self.seen += positions

    def observe(self, drafted: int, accepted: int, after_miss: bool, confidences: Optional[Sequence[float]]) -> None:
        """One sequence's verdict. Rounds that deliver under GUARD of what the
        estimate promised (the text no longer suits the draft: deep positions,
        rarely reached now, kept their old 0.9) make it mostly forgotten; else
        a draft turned poor was retried after every plain round (0.95x plain)."""
        e = expected_tokens(drafted, self.estimate.per_position(after_miss))[drafted]
        m = 0.8  # about the last five drafting rounds
        self.promised = [self.promised[0] * m + accepted + 1, self.promised[1] * m + e, self.promised[2] * m + 1]
        verified = drafted if accepted == drafted else accepted + 1
        self.estimate.observe(verified, accepted, after_miss)
        self.bins.observe(verified, accepted, confidences, Acceptance.DECAY)
        self.seen += verified
        if self.promised[2] >= 3 and self.promised[0] < self.GUARD * self.promised[1]:
            self.estimate.forget(self.FORGET)
            self.promised = [0.0, 0.0, 0.0]

    def round(self, drafted: bool, clear: bool) -> None:
        """A round passed (``clear``: its choice was predicted to win clearly).
        A try (a re-exploration, and the drafting after it while no clear
        gain is predicted) that finds a clear gain resets the wait; one that
        goes plain doubles it (a draft at break-even is retried less often). A
        draft too poor to pay is retried only once idle rounds have thinned
        its evidence (:meth:`Acceptance.optimistic`)."""
        explored = drafted and self.idle >= self.wait
        if drafted and clear and not explored:
            self.wait = self.EXPLORE_EVERY
        elif not drafted and self.trying:
            self.wait = min(2 * self.wait, self.EXPLORE_EVERY * self.EXPLORE_BACKOFF)
        self.trying = explored or (self.trying and drafted and not clear)
        self.idle = 0 if drafted else self.idle + 1
        if not drafted:
            self.estimate.idle += 1

    def gains(self, s: SlotView, alone: bool, probe_k: int) -> List[float]:
        """Expected tokens ``s`` emits at K = 0..cap: at the optimistic
        acceptance for every K for a lone sequence that has waited (capped at
        a probe's K, a re-exploration could never pay where a draft token
        costs a third of a target token), for ``probe_k`` tokens while not
        known (counted with decaying evidence instead, a poor draft's few
        verdicts never added up and it was probed every call), else estimated."""
        if alone and self.idle >= self.wait:
            acc = [self.estimate.optimistic()] * s.cap
        elif not self.known:
            acc = [self.estimate.optimistic()] * probe_k + [0.0] * s.cap
        else:
            acc = self.estimate.per_position(s.after_miss)
        return expected_tokens(s.cap, acc)


class Policy:
    """K per sequence each round, from measured costs and pooled acceptance:
    up to ``k_max``; ``passes`` and ``free_draft`` as :class:`Costs`; ``clock``
    False (a seeded p/q run, whose text timing must not change) prices every
    round at the priors."""

    PROBE_K = 3           # while a regime is not known, one sequence drafts this many
    PROBE_ODDS = 0.2      # the chance a probe finds the optimistic acceptance: its catch-up is weighed at it
    DOUBT_MARGIN = 1.2    # re-explore at the doubted price only if drafting would win by this there
    AGE = 0.1             # what a re-exploration that drafts keeps of the draft's timed forwards
    BASELINE_EVERY = 32   # rounds with drafting before a plain one re-times the target's single token
    ENTRY = 1.05          # a gain predicted above this is clear: from plain decoding, a lone sequence drafts
                          # only then (it pays a catch-up), and only then does a try count as found

    def __init__(self, k_max: int = AUTO_K_MAX, passes: Optional[Callable] = None, free_draft: bool = False,
                 clock: bool = True) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max, self.clock = k_max, clock
        self.costs = Costs(k_max, passes, free_draft)
        self.regimes: Dict[str, Regime] = {}
        self.since_plain, self.clear = 0, False  # rounds since a plain one; the last choice clearly won

    def regime(self, name: str) -> Regime:  # made empty on first use
        if name not in self.regimes:
            self.regimes[name] = Regime(self.k_max)
        return self.regimes[name]

    def acceptance(self, regime: str) -> Acceptance:
        return self.regime(regime).estimate

    def choose(self, slots: Sequence[SlotView]) -> List[int]:
        """K for each sequence: the best common K, then each one's own in turn,
        scored as expected tokens minus ``rate`` x predicted seconds, ``rate``
        the best tokens/s of a steady round (no prompt, no catch-up): the
        round's own tokens/s would draft where another's prompt made it slow."""
        for s in slots:
            self.regime(s.regime)
        if self.clock and (not self.costs.target.known or self.since_plain >= self.BASELINE_EVERY):
            return [s.cap if s.fixed else 0 for s in slots]
        doubt = len(slots) == 1 and self._doubts(slots[0])
        best, margin = self._best(slots, doubt)
        self.clear = margin >= self.ENTRY
        lone = len(slots) == 1 and not slots[0].fixed and self.regimes[slots[0].regime].known
        if lone and self.since_plain == 0 and not self.clear and not doubt:
            return [0]  # K=1 entered at a predicted 1.0-1.05x gave 0.83x through Llama(draft_model=...)
        if doubt and best[0]:  # the forwards timed now price the draft, not the old ones
            self.costs.draft.age(self.AGE)
            self.costs.catchup.age(self.AGE)
        return best

    def _best(self, slots: Sequence[SlotView], doubt: bool = False, hope: bool = False) -> tuple:
        """The choice (see :meth:`choose`) and the steady rate it is predicted at
        over plain decoding's; ``hope``: every draft position accepted at 0.99."""
        gains = [expected_tokens(s.cap, [0.99] * s.cap) if hope else
                 self.regimes[s.regime].gains(s, len(slots) == 1, self.PROBE_K) for s in slots]
        slots, probe = self._probes(slots)
        seconds = self.costs.pricer(slots, self.costs.lines(doubt))
        commons = [[s.cap if s.fixed else min(k, s.cap) for s in slots] for k in range(self.k_max + 1)]
        rate = max(sum(g[k] for g, k in zip(gains, ks)) / max(seconds(ks, True), 1e-9) for ks in commons)
        score = lambda ks: sum(g[k] for g, k in zip(gains, ks)) - rate * seconds(ks)  # noqa: E731
        best = max(commons, key=score)
        for i, s in enumerate(slots):
            if not s.fixed and s.cap > 0:
                options = (0, min(self.PROBE_K, s.cap)) if probe[i] else range(s.cap + 1)
                best[i] = max(options, key=lambda k: score(best[:i] + [k] + best[i + 1:]))
        return best, rate * seconds(commons[0], True) / max(1e-9, sum(g[0] for g in gains))

    def _probes(self, slots: Sequence[SlotView]) -> tuple:
        """``(slots, probe)``: one sequence per regime not known probes, its
        catch-up spread over the tokens left times PROBE_ODDS, its cap PROBE_K
        (so the rate it is weighed at is one a probe can reach); the others of
        that regime wait (cap 0): 8 new requests probing at once, each with a
        prompt to catch up on, read 0.65x k=0 on a fresh engine."""
        out, probe, first = [], [], set()
        for s in slots:
            p = s.cap > 0 and not s.fixed and not self.regime(s.regime).known
            if p and s.regime in first:
                p, s = False, replace(s, cap=0)
            elif p:
                first.add(s.regime)
                left = Costs.HORIZON // 2 if s.remaining is None else s.remaining
                s = replace(s, cap=min(s.cap, self.PROBE_K), remaining=max(1, round(left * self.PROBE_ODDS)))
            out.append(s)
            probe.append(p)
        return out, probe

    def _doubts(self, s: SlotView) -> bool:
        """Whether a lone sequence re-exploring prices the draft at most DOUBT of
        a target token: if drafting would then win by DOUBT_MARGIN at the
        optimistic acceptance. Priced in a slow phase of the draft, drafting
        stopped for good (0.947 of the best K); at the estimated acceptance,
        an estimate 0.03 lower (a stored record's) kept it stopped."""
        r = self.regimes[s.regime]
        if s.fixed or s.cap == 0 or r.idle < r.wait or not self.clock:
            return False
        g, steady, lines = expected_tokens(s.cap, [r.estimate.optimistic()] * s.cap), s.steady(), self.costs.lines(True)
        rate = [g[k] / max(self.costs.seconds([steady], [k], lines), 1e-9) for k in range(s.cap + 1)]
        return max(rate[1:]) > self.DOUBT_MARGIN * rate[0]

    def worth_measuring(self, s: SlotView) -> bool:
        """Whether to measure the draft on the prompt ``s`` is about to read:
        while its regime is not known (whatever was stored: this keeps a record
        a prior), if a probe would pay were the draft good (after a long prompt
        a short answer could not repay the draft's catch-up)."""
        cap = min(self.k_max, (s.remaining or Costs.HORIZON) - 1)
        if self.regime(s.regime).known or cap <= 0:
            return False
        return self._best([replace(s, target_lag=1, cap=cap)], hope=True)[0][0] > 0

    def observe(self, regime: str, drafted: int, accepted: int, after_miss: bool = False,
                confidences: Optional[Sequence[float]] = None) -> None:
        """One sequence's verdict: ``accepted`` of ``drafted`` tokens (the
        draft's ``confidences`` in them, for :meth:`p_min`)."""
        if drafted:
            self.regime(regime).observe(drafted, accepted, after_miss, confidences)

    def round_done(self, slots: Sequence[SlotView], ks: Sequence[int], m: Optional[Measured]) -> None:
        """After a round that drafted ``ks`` (what was proposed) for ``slots``:
        its costs (``m``; None if untimed), and each regime's round."""
        if m is not None and self.clock:
            self.costs.observe(m, any(s.target_lag > 1 for s in slots), self.costs.passes(slots, ks), len(slots))
        chosen = any(k for s, k in zip(slots, ks) if not s.fixed)  # a fixed K is not the policy's
        self.since_plain = self.since_plain + 1 if chosen else 0
        drafted = {s.regime for s, k in zip(slots, ks) if k}
        for name, r in self.regimes.items():
            r.round(name in drafted, self.clear)

    def rates(self, regime: str) -> List[float]:
        """Tokens per second a lone steady sequence of ``regime`` is predicted at, for K = 0..k_max."""
        lone = SlotView(regime, self.k_max, remaining=Costs.HORIZON)
        g, lines = expected_tokens(self.k_max, self.acceptance(regime).per_position()), self.costs.lines()
        return [g[k] / max(self.costs.seconds([lone], [k], lines), 1e-9) for k in range(self.k_max + 1)]

    def p_min(self, regime: str) -> float:
        """``p_min="auto"``'s cutoff: below it a draft token is accepted less
        often than one more draft token costs, in tokens at the best rate
        (another draft forward, a target token and a row, from the lines)."""
        (_, bt), (ad, bd), (_, br), _ = self.costs.lines()
        return self.regime(regime).bins.cutoff((ad + bd + bt + br) * max(self.rates(regime)))

    def explain(self, regime: str) -> str:
        """One line for users: the K a lone sequence of ``regime`` would
        draft, its predicted speed against plain decoding, each K's, and
        what that rests on."""
        return why(self.rates(regime), self.acceptance(regime).total, self.costs.basis())


def why(rates: Sequence[float], totals: Sequence[float], costs: str) -> str:
    """The one line of :meth:`Policy.explain`: ``rates``, tokens per second
    at K = 0..k_max; ``totals``, the acceptance's (accepted, verified);
    ``costs``, where the costs come from."""
    r, (acc, ver) = rates, totals
    best = max(range(1, len(r)), key=lambda k: (r[k], -k))
    head = (f"K={best} is predicted at {r[best] / r[0]:.2f}x plain decoding" if r[best] > r[0] else
            f"drafting off: the best draft length, K={best}, is predicted at {r[best] / r[0]:.2f}x plain decoding")
    known = f"draft acceptance {acc / ver:.2f} over {ver:.0f} positions" if ver else "no acceptance known yet"
    return f"{head} (K {' '.join(f'{k}:{r[k] / r[0]:.2f}' for k in range(1, len(r)))}); {known}; {costs}"
