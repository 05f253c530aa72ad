"""What is known of a draft's acceptance: the estimators the draft policy reads.

* :class:`AcceptanceEstimate`: per-position acceptance from decayed counts of
  this run's verdicts, plus what was known before it (a measured acceptance
  and what earlier runs stored, together worth at most ``PRIOR_CAP``
  observations). Only this run's counts are handed to the state store
  (:func:`merge_evidence`), so a prior is never counted twice.
* :class:`ConfidenceBins`: acceptance by the draft's confidence in its token,
  what ``p_min="auto"`` learns its cutoff from.
"""

from __future__ import annotations

from typing import List, Optional, Sequence


class Counts:
    """Decayed counts of verified and accepted draft positions, per position
    and overall (a measured prior counts once overall, at every position).

    Position 0 is counted twice over, by what came before the round: the
    last slot (index k_max) holds first positions of rounds that follow a
    rejection. Drafts miss in runs (hard stretches of text), so a round
    after a rejection starts worse than one after a full acceptance, a
    plain round or a new prompt; pooled, the post-rejection figure (0.7
    against 0.9 in simulation) kept new calls from drafting at all.
    """

    def __init__(self, k_max: int) -> None:
        self.accepted = [0.0] * (k_max + 1)
        self.verified = [0.0] * (k_max + 1)
        self.total = [0.0, 0.0]  # accepted, verified

    def decay(self, d: float) -> None:
        self.accepted = [a * d for a in self.accepted]
        self.verified = [v * d for v in self.verified]
        self.total = [t * d for t in self.total]

    def add(self, verified: int, accepted: int, after_miss: bool = False) -> None:
        for i in range(min(verified, len(self.verified) - 1)):
            j = -1 if i == 0 and after_miss else i
            self.verified[j] += 1.0
            self.accepted[j] += 1.0 if i < accepted else 0.0
        self.total[0] += accepted
        self.total[1] += verified

    def add_everywhere(self, rate: float, weight: float) -> None:
        """A measured acceptance ``rate`` worth ``weight`` observations at every
        position (and the after-a-rejection slot), counted once overall."""
        self.accepted = [a + rate * weight for a in self.accepted]
        self.verified = [v + weight for v in self.verified]
        self.total = [self.total[0] + rate * weight, self.total[1] + weight]

    def add_unconditional(self, accepted: float, verified: int) -> None:
        """Positions scored one by one from the true context (a catch-up's
        read-back): each is what a round's first draft token is."""
        self.verified[0] += verified
        self.accepted[0] += accepted
        self.total[0] += accepted
        self.total[1] += verified

    def add_scaled(self, other: "Counts", f: float) -> None:
        for i in range(min(len(other.verified), len(self.verified))):
            self.accepted[i] += other.accepted[i] * f
            self.verified[i] += other.verified[i] * f
        self.total[0] += other.total[0] * f
        self.total[1] += other.total[1] * f

    def to_dict(self) -> dict:
        return {"accepted": list(self.accepted), "verified": list(self.verified), "total": list(self.total)}

    @classmethod
    def from_dict(cls, d: dict, k_max: int) -> "Counts":
        c = cls(k_max)
        a, v = [float(x) for x in d["accepted"]], [float(x) for x in d["verified"]]
        n = min(len(a), len(v), k_max + 1)
        c.accepted[:n], c.verified[:n] = a[:n], v[:n]
        c.total = [float(x) for x in d["total"]][:2]
        if len(c.total) != 2:
            raise ValueError("total needs two values")
        return c


class AcceptanceEstimate:
    """Per-position acceptance of the draft.

    Args:
        k_max: draft positions tracked.
        prior: a measured per-token acceptance (e.g. by calibrate()), worth
            PRIOR_CAP observations at every position; None: none.
        decay: per-observation decay of every count (memory ~ 1/(1 - decay)).
    """

    PRIOR_CAP = 8.0     # what was known before the run counts as at most this many observations
    PRIOR_WEIGHT = 2.0  # shrinkage of each position towards the overall rate
    IDLE_FORGET = 0.995  # per round without evidence, on the evidence used to rule probes out

    def __init__(self, k_max: int, prior: Optional[float] = None, decay: float = 0.95) -> None:
        if prior is not None and not 0.0 <= float(prior) <= 1.0:
            raise ValueError(f"prior must be None or in [0, 1], got {prior!r}")
        self.decay = decay
        self.before = Counts(k_max)  # known before this run: measured prior, earlier runs
        self.run = Counts(k_max)     # observed since the last hand-over to the store
        self.run_decay = 1.0         # how much `before` decayed meanwhile
        self.rounds_without_evidence = 0
        if prior is not None:
            self.add_prior(float(prior))

    def add_prior(self, rate: float, weight: float = PRIOR_CAP) -> None:
        """A measured per-token acceptance, worth ``weight`` observations at
        every position (one early rejection must not outweigh it), counted
        once overall; observations decay it like any other evidence."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"a measured acceptance must be in [0, 1], got {rate!r}")
        self.before.add_everywhere(rate, weight)

    def knows_nothing(self) -> bool:
        """No prior, no stored evidence, no observation yet."""
        return self.totals()[1] == 0

    def totals(self) -> tuple:
        """(accepted, verified) overall, before and during the run."""
        return self.before.total[0] + self.run.total[0], self.before.total[1] + self.run.total[1]

    def per_position(self, after_miss: bool = False) -> List[float]:
        """Estimated conditional acceptance per draft position (k_max values),
        shrunk to the overall rate; ``after_miss``: for a round that follows a rejection."""
        acc, ver = self.totals()
        overall = (acc + 1.0) / (ver + 2.0)
        w = self.PRIOR_WEIGHT
        out = [(a0 + a1 + w * overall) / (v0 + v1 + w) for a0, a1, v0, v1 in
               zip(self.before.accepted, self.run.accepted, self.before.verified, self.run.verified)]
        return ([out[-1]] if after_miss else out[:1]) + out[1:-1]

    def optimistic(self) -> float:
        """The upper end (one sigma) of the per-token acceptance the counts
        allow, the evidence thinning as rounds without it pass; at most 0.99."""
        f = self.IDLE_FORGET ** self.rounds_without_evidence
        acc, ver = self.totals()
        n = ver * f
        g = (acc * f + 1.0) / (n + 2.0)
        return min(0.99, g + (g * (1.0 - g) / (n + 1.0)) ** 0.5)

    def observe(self, verified: int, accepted: int, after_miss: bool = False) -> None:
        """A round whose verifier decided ``verified`` positions, accepting the
        first ``accepted``; ``after_miss``: the round before ended in a rejection."""
        if verified:
            self._new_evidence()
            self.run.add(verified, accepted, after_miss)

    def _new_evidence(self) -> None:
        # Decay per observation, so rounds without drafting do not erase what was learned.
        self.rounds_without_evidence = 0
        self.forget(self.decay)

    def idle(self) -> None:
        """A round that drafted nothing: the evidence that rules probes out thins (``optimistic``)."""
        self.rounds_without_evidence += 1

    def forget(self, f: float) -> None:
        """Scale every count by ``f`` (``before`` and this run's alike, so the
        hand-over stays ``stored * run_decay + counts``). Each observation
        does it at ``decay``; the policy's guard does it at once when what
        rounds delivered contradicted the estimate."""
        self.before.decay(f)
        self.run.decay(f)
        self.run_decay *= f

    def observe_skipped(self, accepted: float, positions: int) -> None:
        """The draft's agreement on ``positions`` emitted tokens it had skipped
        (``accepted``: their expected acceptances), read back as it caught
        up; it decays the counts once, as a round does."""
        if positions:
            self._new_evidence()
            self.run.add_unconditional(accepted, positions)

    def add_before(self, evidence: Optional[dict]) -> None:
        """Add what earlier runs learned (a stored :meth:`hand_over` sum),
        scaled down to at most PRIOR_CAP observations, to what was known
        before. Added, not substituted: stored evidence rarely reaches the
        deeper positions, where the measured prior must stay."""
        k_max = len(self.before.verified) - 1
        try:
            stored = Counts.from_dict(evidence, k_max)
        except (KeyError, TypeError, ValueError):
            return  # none, or an old or damaged record: learn from scratch
        n = stored.total[1]
        self.before.add_scaled(stored, min(1.0, self.PRIOR_CAP / n) if n > 0 else 0.0)

    def hand_over(self) -> dict:
        """This run's contribution for the store, then start a new one:
        ``{"counts", "decay"}``, to be merged as ``stored * decay + counts``
        (:func:`merge_evidence`)."""
        out = {"counts": self.run.to_dict(), "decay": self.run_decay}
        self.before.add_scaled(self.run, 1.0)
        self.run = Counts(len(self.before.verified) - 1)
        self.run_decay = 1.0
        return out


def merge_evidence(stored: Optional[dict], contribution: dict) -> dict:
    """Stored evidence decayed by what the run observed, plus the run's counts.
    Concurrent runs each apply their own contribution: none is lost. A
    damaged stored record is replaced by the contribution."""
    counts = contribution["counts"]
    k_max = len(counts["verified"]) - 1
    merged = Counts.from_dict(counts, k_max)
    try:
        merged.add_scaled(Counts.from_dict(stored, k_max), contribution["decay"])
    except (KeyError, TypeError, ValueError):
        pass
    return merged.to_dict()


class ConfidenceBins:
    """Acceptance by the draft's confidence in its token, in ten bins: what
    ``p_min="auto"`` learns its cutoff from."""

    BINS = 10

    def __init__(self) -> None:
        self.accepted = [0.0] * self.BINS
        self.verified = [0.0] * self.BINS

    def observe(self, verified: int, accepted: int, confidences: Optional[Sequence[float]],
                decay: float) -> None:
        if verified:
            self.accepted = [a * decay for a in self.accepted]
            self.verified = [v * decay for v in self.verified]
        for i in range(min(verified, 0 if confidences is None else len(confidences))):
            b = min(self.BINS - 1, max(0, int(confidences[i] * self.BINS)))
            self.verified[b] += 1.0
            self.accepted[b] += 1.0 if i < accepted else 0.0

    def acceptance(self, b: int) -> float:
        prior = (b + 0.5) / self.BINS  # before data: confidence ~ acceptance
        w = AcceptanceEstimate.PRIOR_WEIGHT
        return (self.accepted[b] + w * prior) / (self.verified[b] + w)

    def cutoff(self, need: float) -> float:
        """The lowest confidence whose bin, and every bin above it, accepts at least ``need``."""
        for b in range(self.BINS):
            if all(self.acceptance(j) >= need for j in range(b, self.BINS)):
                return b / self.BINS
        return 1.0
