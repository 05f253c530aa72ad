"""What a round costs here, as this process's own rounds were timed.

The draft policy (:mod:`~specgguf.engine.policy`) weighs each K's expected
tokens against these seconds. No stored seconds price a round: identical
processes on one machine differ by 20%, and a busy spell moves every price
at once. What a process has not timed yet (the draft, before its first
forward here; the target's batches longer than any timed here) is priced as
an earlier process timed it *against the target's token* (:meth:`Costs.record`):
a ratio both models' speeds move alike, where a guess of a tenth had every
new CLI process measure a draft that cannot pay, and a hope priced a 33-token
batch as a 4-token one. Nothing here reads the clock itself: the caller
times its rounds and reports them as :class:`Measured`.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Deque, List, Optional, Sequence

from .tuning import Tuning


@dataclass
class SlotView:
    """One sequence as a round sees it: its sampling ``regime`` (acceptance is
    pooled by it); ``cap``, the most it may draft (a caller's K if ``fixed``);
    the tokens its target and draft caches lack besides the drafts (a prompt;
    the draft's catch-up); the tokens it may still emit (None: unknown); whether
    its last round ended in a rejection; its sequence id; the tokens it has emitted."""

    regime: str
    cap: int
    fixed: bool = False
    target_lag: int = 1
    draft_lag: int = 1
    remaining: Optional[int] = None
    after_miss: bool = False
    slot: int = 0
    emitted: int = 0

    def steady(self) -> SlotView:
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


class Timed:
    """Seconds of a forward by its tokens as timed here: a shape per count
    (between two counts timed, on the line between them; past the largest, the
    last secant, or ``flat`` where the caller hopes, so that one round times it,
    else rising at ``slope`` of its price per token; below the smallest, in
    proportion) times the machine's speed, ``pace[0]``, which
    every reading moves, so that a busy spell seen in the counts a round runs
    reprices those it does not. Not a line: one token runs other kernels and
    2 -> 9 tokens is concave, so a line prices K = 8 too dear ever to try."""

    def __init__(self, slope: float, flat: bool, pace: List[float], spike: float = Tuning.spike,
                 share: float = Tuning.pace_share, settle: int = Tuning.settle) -> None:
        self.slope, self.flat, self.pace, self.spike, self.s = slope, flat, pace, spike, {}
        self.share, self.settle, self.reads = share, settle, {}
        self.known: Optional["Timed"] = None  # an earlier process's shape, in ratios: past the counts timed here
        # A policy asks the same counts hundreds of times a round (a choice over four slots: about
        # 500 calls, 2 ms where a round takes 30): shapes are kept until a reading moves them, and
        # the counts timed in order, with the least seconds of any from each on.
        self._memo: dict = {}
        self._counts: List[int] = []
        self._least_from: List[float] = [float("inf")]

    def observe(self, n: int, seconds: float) -> None:
        """A forward over ``n`` tokens took ``seconds``: its price follows the
        reading (:func:`_follow`), and once ``settle`` readings have set the
        count's shape, ``share`` of that move (in ratio) is the machine's pace,
        which every count's price carries. The move is split, not made twice:
        moving the pace half way and then the shape towards the reading over
        the new pace ratcheted, as noise alone in the one count plain rounds
        read drove the pace to a third in a thousand rounds (every other count
        priced at a third of its time: at four slots drafting looked free)."""
        if n <= 0 or seconds <= 0.0:  # no forward, or none the clock could see
            return
        old = self.s.get(n)
        if old is None:
            self.s[n], self.reads[n] = seconds / self.pace[0], 1
        else:
            price = self.pace[0] * old
            moved = _follow(price, seconds) / price
            share = self.share if self.reads[n] >= self.settle else 0.0  # a first reading may be a warm-up
            self.pace[0] *= moved ** share
            self.s[n] = old * moved ** (1.0 - share)
            self.reads[n] += 1
        self._timed()

    def load(self, shape: dict) -> None:
        """Prices ``{tokens: seconds}`` as if each count had settled (a stored shape)."""
        self.s, self.reads = dict(shape), {n: self.settle for n in shape}
        self._timed()

    def forget(self) -> None:
        """Every count timed is dropped (they are doubted): the next readings replace them."""
        self.s.clear()
        self.reads.clear()
        self._timed()

    def _timed(self) -> None:
        self._memo.clear()
        self._counts = sorted(self.s)
        self._least_from = [float("inf")] * (len(self._counts) + 1)
        for i in range(len(self._counts) - 1, -1, -1):
            self._least_from[i] = min(self._least_from[i + 1], self.s[self._counts[i]])

    def __call__(self, n: int, hope: bool = True) -> float:
        """Seconds of a forward over ``n`` tokens (``hope``: flat past the largest
        count timed, if this is ``flat``): at most ``spike`` times a longer
        one's as timed (a one-token forward timed in a busy spell, never timed
        again while every round drafted, once made drafting look 49x faster
        than plain decoding; noise alone never reads a shorter forward 1.5x a longer)."""
        if n <= 0:
            return 0.0
        got = self._memo.get((n, hope))
        if got is None:
            got = self._memo[(n, hope)] = self._price(n, hope)
        return self.pace[0] * got

    def _price(self, n: int, hope: bool = True) -> float:
        """:meth:`__call__` at a pace of 1."""
        if not self.s:  # nothing timed (or a policy blind to the clock): a unit, at the slope guessed
            return 1 + self.slope * (n - 1)
        i = bisect_right(self._counts, n)  # counts[:i] <= n < counts[i:]
        got = min(self._shape(n, i, hope), self.spike * self._least_from[i])
        if 0 < self.reads.get(n, 0) < self.settle and i < len(self._counts):
            # A count read only a few times is priced at most as a longer one, and between two on the
            # line through them: its first forward may have built a new graph (a 4-token verification
            # read 41 ms against 22; a first decode 15.5 against 10), and priced so, it was never read
            # again (short lookups ran plain for good; a poor draft drafted K = 1 at 0.8x plain).
            got = min(got, self._least_from[i])
            if i > 1:
                got = min(got, self._line(self._counts[i - 2], self._counts[i], n))
        return got

    def _line(self, lo: int, hi: int, n: int) -> float:
        """The shape at ``n`` on the line through the counts ``lo`` < ``hi`` timed."""
        return self.s[lo] + (self.s[hi] - self.s[lo]) * (n - lo) / (hi - lo)

    def _shape(self, n: int, i: int, hope: bool) -> float:
        counts, s = self._counts, self.s
        if not i:  # below the smallest count timed
            return s[counts[0]] * n / counts[0]
        lo = counts[i - 1]
        if lo == n:
            return s[n]
        if i == len(counts):  # past the largest
            if self.known is not None and self.known.s:  # as an earlier process timed it, not hoped or guessed
                return s[lo] * self.known._price(n) / self.known._price(lo)
            if len(counts) == 1 or (self.flat and not hope):
                return s[lo] * (1 + self.slope * (n - lo))
            a, b = counts[-2], counts[-1]
            return s[b] + (0.0 if self.flat else max(0.0, (s[b] - s[a]) / (b - a)) * (n - b))
        return self._line(lo, counts[i], n)


class Fastest(Timed):
    """The fastest each count was read at, priced between counts as :class:`Timed` prices: a floor
    a retry may price the draft at (its timings may come from a slow spell), not the machine's pace."""

    def __init__(self, slope: float, spike: float = Tuning.spike, settle: int = Tuning.settle) -> None:
        super().__init__(slope, False, [1.0], spike, 0.0, settle)

    def observe(self, n: int, seconds: float) -> None:
        if n > 0 and seconds > 0.0:
            self.s[n], self.reads[n] = min(seconds, self.s.get(n, seconds)), self.reads.get(n, 0) + 1
            self._timed()


def _shape(record, key: str) -> Optional[dict]:
    """``record[key]`` as ``{tokens: ratio}``, or None if absent or damaged."""
    try:
        shape = {int(n): float(r) for n, r in record[key].items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return shape if shape and min(shape) >= 1 and all(0.0 < r < 1e4 for r in shape.values()) else None


def _follow(old: Optional[float], new: float) -> float:
    """``old`` moved towards ``new``: noise only adds time, so a faster reading counts more, a slower
    one at most a quarter of 25%."""
    return new if old is None else old + (0.5 if new < old else 0.25) * (min(new, 1.25 * old) - old)


class Costs:
    """A round's seconds: the target's forward and the rest of the round by the
    tokens of one pass, each further pass (``passes([(slot, tokens)])``, a KV
    stream per slot) at one token's; the draft's forwards by their tokens
    (``free_draft``: a lookup, which costs nothing). The other numbers are the
    policy's (:class:`~specgguf.engine.tuning.Tuning`, where each is explained)."""

    def __init__(self, passes: Optional[Callable], free_draft: bool, tuning: Tuning,
                 record: Optional[dict] = None) -> None:
        t, pace = tuning, [1.0]  # a busy machine slows both models
        self.count_passes, self.free = passes, free_draft
        self.slope_guess, self.draft_guess, self.doubt = t.slope_guess, t.draft_guess, t.doubt
        self.steady, self.unknown_left = t.steady, t.unknown_left
        self.target, self.draft = (Timed(t.slope_guess, flat, pace, t.spike, t.pace_share, t.settle)
                                   for flat in (True, False))
        self.fastest = Fastest(t.slope_guess, t.spike, t.settle)  # the draft's
        self.stored = Timed(t.slope_guess, False, [1.0], t.spike, 0.0, t.settle)  # its forwards / a target token's
        self.target.known = Timed(t.slope_guess, False, [1.0], t.spike, 0.0, t.settle)  # the target's, likewise
        self.settle, self.stale, self.stored_uses = t.settle, t.stale, 0
        self._passes: dict = {}  # count_passes' answers: a function of the counts alone
        self.plain: Deque[float] = deque(maxlen=t.plain_reads)  # the last plain rounds' seconds
        self.again, self.any = t.reread_again, t.reread_any
        self.unread = 0  # rounds that drafted since a plain round was timed (see observe)
        self.add_record(record)

    def add_record(self, record: Optional[dict]) -> None:
        """An earlier process's :meth:`record`: the draft priced so until one of its forwards is timed
        here, the target's batches past those timed here (a 33-token lookup was hoped at a 4-token
        batch's price, 17 ms where it took 45); damaged shapes add nothing."""
        uses = record.get("uses", 0) if isinstance(record, dict) else None
        for key, timed in (("draft", self.stored), ("target", self.target.known)):
            shape = _shape(record, key)
            if shape and (key == "target" or (isinstance(uses, int) and uses >= 0)):
                timed.load(shape)
        self.stored_uses = uses if self.stored.s else 0

    def record(self) -> Optional[dict]:
        """This process's forwards, each over plain decoding's token (once that was read ``settle``
        times, so the ratios are of this process's rounds), for later processes: the target's
        batches, and the draft's forwards if it timed any. If it timed none but ran on a stored
        draft shape, that shape one process older: after ``stale`` such processes it is dropped
        (``"draft": {}``), so one timed in a slow spell, which no process then drafts on to time
        again, is not kept for good. None: too little timed."""
        if self.target.reads.get(1, 0) < self.settle:
            return None
        one = self.target(1)
        out: dict = {"target": {str(n): self.target(n) / one for n in sorted(self.target.s)}}
        if self.draft.s and not self.free:
            out.update(draft={str(n): self.draft(n) / one for n in sorted(self.draft.s)}, uses=0)
        elif self.stored.s and not self.free:
            uses = self.stored_uses + 1
            out.update(draft={str(n): r for n, r in self.stored.s.items()} if uses < self.stale else {}, uses=uses)
        return out

    def plain_median(self) -> float:
        """The median seconds of the last ``plain_reads`` plain rounds (inf: none), which a retry's gain
        is over: a first decode after a prompt reads 5-8% slow, and priced on it, retries at 1.05 paid a
        new prompt's catch-up for a draft that could not pay."""
        return statistics.median(self.plain) if self.plain else float("inf")

    def longest_draft(self) -> int:
        """The longest draft forward priced on a timing (this process's, or a stored one's)."""
        return max([*self.draft.s, *self.stored.s], default=0)

    def draft_priced(self) -> bool:
        """Whether the draft's price rests on a timing, this process's or a stored one."""
        return bool(self.free or self.draft.s or self.stored.s)

    def observe(self, m: Measured, prompt: bool, passes: int, reread: bool = False) -> None:
        # A round of several passes is priced as one pass over all its tokens and one token's per
        # further pass, so that share is what it took less those: left untimed, the price past the
        # largest count timed stayed hopeful for good, and lookups went on drafting long beside
        # other slots at a fraction of their price. (A prompt's round reads other kernels; before
        # anything is timed a token's price is a unit, not seconds.)
        # ``unread`` counts drafting rounds across prompts: a chat request drafts 15-18, and after a slow phase
        # plain decoding, never read again, stayed priced at 16 ms where it ran at 9.6. A ``reread`` (the policy's
        # plain round to read it) under ``again`` of its price is read once more: a reading moves it half way.
        before = self.target(1)
        seconds = m.target_seconds + m.rest_seconds - (passes - 1) * before
        if not prompt and m.target_tokens > 0 and (passes == 1 or self.target.s) and seconds > 0:
            self.target.observe(m.target_tokens, seconds)
            if m.target_tokens == 1:
                self.plain.append(seconds)
                self.unread = self.any if reread and seconds < self.again * before else 0
        self.unread += bool(m.draft_forwards)
        for n, seconds, _ in m.draft_forwards:
            self.timed_draft(n, seconds)

    def timed_draft(self, n: int, seconds: float) -> None:
        """A draft forward over ``n`` tokens took ``seconds``."""
        self.draft.observe(n, seconds)
        self.fastest.observe(n, seconds)

    def passes(self, views: Sequence[SlotView], ks: Sequence[int]) -> int:
        if self.count_passes is None or len(views) < 2:
            return 1
        counts = tuple((v.slot, v.target_lag + k) for v, k in zip(views, ks))
        got = self._passes.get(counts)
        if got is None:
            if len(self._passes) > 4096:  # a few rounds' shapes recur; a prompt's are new each time
                self._passes.clear()
            got = self._passes[counts] = self.count_passes(list(counts))
        return got

    def draft_forward(self, n: int, doubt: bool = False) -> float:
        """One draft forward over ``n`` tokens (``doubt``: at most ``doubt`` of the target's)."""
        if self.free or n <= 0:
            return 0.0
        if self.draft.s:
            d = self.draft(n)
        elif self.stored.s:  # as an earlier process timed it against a target token
            d = self.target(1) * self.stored(n)
        else:
            d = self.draft_guess * self.target(1) * (1 + self.slope_guess * (n - 1))
        return min(d, self.doubt * self.target(n)) if doubt else d

    def catch_up(self, n: int, doubt: bool = False) -> float:
        """A draft forward over ``n`` tokens of catch-up (``doubt``: at the fastest the draft was
        read at such a length. As timed, a slow spell of the draft alone priced every retry out
        while the catch-up grew with each plain round; at ``doubt`` of the target's, retries paid
        long catch-ups of a quantized draft that reads long texts slower than an F32 target)."""
        d = self.draft_forward(n)
        return min(d, self.fastest(n)) if doubt and self.fastest.s else d  # (a lookup's d is 0)

    def seconds(self, views: Sequence[SlotView], ks: Sequence[int], doubt: bool = False) -> float:
        """A round drafting ``ks``: the target's passes, the draft's first forward
        (each drafting sequence's lag, at most ``steady``) and one per further
        position; a longer catch-up is paid back over the tokens left (at most
        ``unknown_left`` if not known): a drafting round is weighed against a plain one."""
        return self.pricer(views, doubt)(ks)

    def pricer(self, views: Sequence[SlotView], doubt: bool = False,
               per_round: Optional[Sequence[bool]] = None, hope: bool = True) -> "Pricer":
        """:meth:`seconds` for these ``views`` as a function of ``ks`` (see :class:`Pricer`;
        ``per_round[i]`` False: without sequence i's catch-up, which the caller weighs itself;
        ``hope`` False: no forward priced hopefully)."""
        return Pricer(self, views, doubt, per_round, hope)


class Pricer:
    """:meth:`Costs.seconds` over fixed ``views``: called with ``ks``, it keeps its
    answers; :meth:`scan` prices one sequence's every K at once. A policy prices
    a few dozen ``ks`` per round over the same views, and at four slots a
    millisecond of a 35 ms round went to it: the draft's forwards are priced
    once here, by their tokens, and a scan costs O(K), not O(K x (slots + K))."""

    def __init__(self, costs: Costs, views: Sequence[SlotView], doubt: bool,
                 per_round: Optional[Sequence[bool]] = None, hope: bool = True) -> None:
        self.costs, self.views, self.known = costs, views, {}
        self.lag = sum(v.target_lag for v in views)
        # A forward longer than any timed is priced hopefully (flat) for a lone sequence only:
        # beside others a failed hope is paid by every slot of the round, and the round that
        # tries it may carry the draft's catch-up on every slot's prompt (BENCHMARKS.md,
        # "one to eight users"); and not for a retry (``hope`` False), which already hopes.
        self.hope = hope and len(views) == 1
        self.steady = [min(max(1, v.draft_lag), costs.steady) for v in views]
        # draft[n]: one draft forward over n tokens (draft[0] = 0: no forward)
        self.draft = [costs.draft_forward(n, doubt) for n in range(max(sum(self.steady), len(views)) + 2)]
        # each sequence's catch-up past a steady round's first forward, and the tokens it may still emit
        self.caught = [max(0.0, costs.catch_up(v.draft_lag, doubt) - costs.catch_up(s, doubt))
                       for v, s in zip(views, self.steady)]
        self.left = [max(1, v.remaining or costs.unknown_left) for v in views]
        per_round = [True] * len(views) if per_round is None else per_round
        self.catchup = [c / n if each else 0.0 for c, n, each in zip(self.caught, self.left, per_round)]

    def __call__(self, ks: Sequence[int]) -> float:
        ks = tuple(ks)
        got = self.known.get(ks)
        if got is None:
            c, draft = self.costs, self.draft
            got = c.target(max(1, self.lag + sum(ks)), self.hope) + (c.passes(self.views, ks) - 1) * c.target(1)
            drafting = sorted(k for k in ks if k)
            if drafting:
                got += draft[sum(s for s, k in zip(self.steady, ks) if k)]
                got += sum(x for x, k in zip(self.catchup, ks) if k)
                shorter = 0  # at position j, one forward over the sequences drafting j or more
                for j in range(2, drafting[-1] + 1):
                    while drafting[shorter] < j:
                        shorter += 1
                    got += draft[len(drafting) - shorter]
            self.known[ks] = got
        return got

    def scan(self, ks: Sequence[int], i: int, cap: int) -> List[float]:
        """Seconds of the round for ``ks`` with sequence ``i``'s K set to 0..``cap``."""
        c, draft = self.costs, self.draft
        others = [k for j, k in enumerate(ks) if j != i]
        held = sum(others)
        first = sum(s for j, (s, k) in enumerate(zip(self.steady, ks)) if k and j != i)
        catch = sum(x for j, (x, k) in enumerate(zip(self.catchup, ks)) if k and j != i)
        # the draft's forwards past the first: at position j, one over the sequences drafting j or more
        deep = [0] * (max(others, default=0) + 2)
        for k in others:
            for j in range(2, k + 1):
                deep[j] += 1
        further = sum(draft[n] for n in deep[2:])
        out, counts = [], list(ks)
        for k in range(cap + 1):
            if k >= 2:  # sequence i drafts position k too
                n = deep[k] if k < len(deep) else 0
                further += draft[n + 1] - draft[n]
            counts[i] = k
            t = c.target(max(1, self.lag + held + k), self.hope) + (c.passes(self.views, counts) - 1) * c.target(1)
            mine = (self.steady[i], self.catchup[i]) if k else (0, 0.0)
            out.append(t + draft[first + mine[0]] + further + catch + mine[1])
        return out
