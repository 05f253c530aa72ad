"""What a round costs here, as this process's own rounds were timed.

The draft policy (:mod:`~specgguf.engine.policy`) weighs each K's expected
tokens against these seconds. Nothing stored prices a round: identical
processes on one machine differ by 20%, and a busy spell moves every price
at once. Nothing here reads the clock itself: the caller times its rounds
and reports them as :class:`Measured`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, List, Optional, Sequence


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
    last secant, or ``flat``; below the smallest, in proportion; hopeful, so
    that one round times it) times the machine's speed, ``pace[0]``, which
    every reading moves, so that a busy spell seen in the counts a round runs
    reprices those it does not. Not a line: one token runs other kernels and
    2 -> 9 tokens is concave, so a line prices K = 8 too dear ever to try."""

    def __init__(self, slope: float, flat: bool, pace: List[float], spike: float = 1.5) -> None:
        self.slope, self.flat, self.pace, self.spike, self.s = slope, flat, pace, spike, {}
        # A policy asks the same counts hundreds of times a round (a choice over four slots: about
        # 500 calls, 2 ms where a round takes 30): answers are kept until a reading or the pace moves.
        self._memo: dict = {}
        self._memo_pace = pace[0]

    def observe(self, n: int, seconds: float) -> None:
        if n <= 0 or seconds <= 0.0:  # no forward, or none the clock could see
            return
        if n in self.s:
            self.pace[0] = _follow(self.pace[0], seconds / self.s[n])
        self.s[n] = _follow(self.s.get(n), seconds / self.pace[0])
        self._memo.clear()

    def forget(self) -> None:
        """Every count timed is dropped (they are doubted): the next readings replace them."""
        self.s.clear()
        self._memo.clear()

    def __call__(self, n: int) -> float:
        """Seconds of a forward over ``n`` tokens: at most ``spike`` times a longer
        one's as timed (a one-token forward timed in a busy spell, never timed
        again while every round drafted, once made drafting look 49x faster
        than plain decoding; noise alone never reads a shorter forward 1.5x a longer)."""
        if n <= 0:
            return 0.0
        if self._memo_pace != self.pace[0]:  # the other table's reading moved the shared pace
            self._memo.clear()
            self._memo_pace = self.pace[0]
        got = self._memo.get(n)
        if got is None:
            got = self._memo[n] = self._price(n)
        return got

    def _price(self, n: int) -> float:
        if not self.s:  # nothing timed (or a policy blind to the clock): a unit, at the slope guessed
            return self.pace[0] * (1 + self.slope * (n - 1))
        longer = [y for c, y in self.s.items() if c > n]
        return self.pace[0] * (min(self._shape(n), self.spike * min(longer)) if longer else self._shape(n))

    def _shape(self, n: int) -> float:
        lo, hi = max((c for c in self.s if c <= n), default=0), min((c for c in self.s if c >= n), default=0)
        if not lo:
            return self.s[hi] * n / hi
        if not hi:
            if len(self.s) == 1:
                return self.s[lo] * (1 + self.slope * (n - lo))
            (a, x), (b, y) = sorted(self.s.items())[-2:]
            return y + (0.0 if self.flat else max(0.0, (y - x) / (b - a)) * (n - b))
        f = (n - lo) / (hi - lo) if hi > lo else 0.0
        return self.s[lo] + (self.s[hi] - self.s[lo]) * f


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

    def __init__(self, passes: Optional[Callable], free_draft: bool, slope_guess: float, draft_guess: float,
                 doubt: float, steady: int, unknown_left: int, spike: float) -> None:
        self.count_passes, self.free, pace = passes, free_draft, [1.0]  # a busy machine slows both
        self.slope_guess, self.draft_guess, self.doubt = slope_guess, draft_guess, doubt
        self.steady, self.unknown_left = steady, unknown_left
        self.target, self.draft = Timed(slope_guess, True, pace, spike), Timed(slope_guess, False, pace, spike)

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
        d = self.draft(n) if self.draft.s else self.draft_guess * self.target(1) * (1 + self.slope_guess * (n - 1))
        return min(d, self.doubt * self.target(n)) if doubt else d

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
        steady = [min(max(1, v.draft_lag), self.steady) for v, _ in drafting]
        t += self.draft_forward(sum(steady), doubt)
        t += sum(self.draft_forward(sum(k >= j for _, k in drafting), doubt) for j in range(2, max(ks) + 1))
        for (v, _), s in zip(drafting, steady):
            catchup = self.draft_forward(v.draft_lag) - self.draft_forward(s)
            t += max(0.0, catchup) / max(1, v.remaining or self.unknown_left)
        return t
