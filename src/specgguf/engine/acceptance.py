"""How often the draft is accepted, per sampling regime: what the policy
(:mod:`~specgguf.engine.policy`) expects of a draft of K tokens.

A round drafting K tokens emits E(K) = 1 + a_1 + a_1 a_2 + ... tokens (a_i:
the chance position i is accepted given those before it were; Leviathan et
al.). :class:`Regime` keeps the counts behind each a_i, decayed so that the
estimate follows the text; what was known before the process (a stored
record, a calibration, a measurement on the prompt) enters as a prior worth a
few observations. Nothing here touches models, files or the clock.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from .costs import SlotView
from .tuning import Tuning


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
    ``spent``: what the last cost; ``bet``: the gain it bet on;
    ``promised``: recent drafting rounds' tokens, the estimate's promise, rounds."""

    def __init__(self, k_max: int, t: Tuning = Tuning()) -> None:
        self.t, self.accepted, self.verified = t, [0.0] * (k_max + 1), [0.0] * (k_max + 1)
        self.total, self.seen, self.idle, self.wait, self.retried = [0.0, 0.0], 0.0, 0, t.retry, 0
        self.promised, self.spent, self.bet = [0.0, 0.0, 0.0], 0.0, t.retry_gain

    def round_done(self, drafted: bool, spent: float) -> None:
        """A round ended (``drafted``: this regime drafted in it; ``spent``: its time past a plain round's, in
        plain rounds). The round after a retry tells whether drafting held: one that did not waits twice as
        long, or, if longer, till what it cost is ``retry_share`` of what the plain rounds since would have won at
        the gain it bet on (up to ``retry_max``). Real chat: a 37-token catch-up took 106 ms where a plain round
        took 9.5, and at waits of 16, 32, 64 ... a retry came in each of a process's first requests where no K
        paid, costing 7-15% of it; a bet on a large gain waits less, as waiting loses more if it was right."""
        self.spent = spent if self.retried == 2 else self.spent
        if self.retried == 1:
            share = self.t.retry_share * max(0.01, self.bet - 1.0)
            self.wait = self.t.retry if drafted else min(max(2 * self.wait, round(self.spent / share)),
                                                         self.t.retry_max)
        self.retried, self.idle = max(0, self.retried - 1), 0 if drafted else self.idle + 1

    @property
    def known(self) -> bool:
        return self.seen > 0

    def add(self, accepted: Sequence[float], verified: Sequence[float], total: Sequence[float], f=1.0) -> None:
        self.accepted = [a + f * x for a, x in zip(self.accepted, accepted)]
        self.verified = [v + f * x for v, x in zip(self.verified, verified)]
        self.total = [a + f * x for a, x in zip(self.total, total)]

    def add_prior(self, rate: Optional[float], weight: Optional[float] = None) -> None:
        """A measured acceptance ``rate`` (None: nothing), worth ``weight`` (default ``prior``) observations at every
        position."""
        if rate is None:
            return
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
