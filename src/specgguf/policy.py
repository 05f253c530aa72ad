"""How many tokens to draft each round (``k="auto"``), in small parts.

The rule (Leviathan et al.): if the draft's i-th token of a round is accepted
with probability a_i given the ones before it were, a round that drafts K
tokens emits E(K) = 1 + a_0 + a_0 a_1 + ... + a_0 ... a_{K-1} tokens and costs
K draft forwards plus one target forward over K+1 tokens. The best K is the
one with the most expected tokens per second,
E(K) / (c_first + (K - 1) c_draft + T(K+1)); K = 0 is plain decoding, E = 1
at cost T(1). A round's first draft forward (c_first) costs more than the
next ones: it runs right after the target's, with the draft's weights out
of cache, and after a fully accepted round it evaluates two tokens.
Measured here it was about twice a warm one, which makes K = 1 a loss at
any acceptance on that machine; one cost per draft token hid that.

* :class:`AcceptanceEstimate` holds what is known of the a_i: decayed counts
  of verified and accepted draft positions from this run, plus what was
  known before it (a measured acceptance and what earlier runs learned,
  together worth at most ``PRIOR_CAP`` observations). Only this run's counts
  are handed to the state store, so a prior is never counted twice.
* :class:`CostTracker` holds c_first, c_draft, T(1..k_max+1) and the draft's per-token
  catch-up cost, starting from a conservative prior (or stored costs) and
  refined from the run's own timed forwards when the clock may change nothing
  (greedy runs, and sampling that is unseeded or drafter-invariant).
* :class:`ProbeSchedule` holds when the next probe is due while K = 0,
  backing off while probes fail.
* :class:`DraftPolicy` chooses K each round from these: the best K if it
  beats plain decoding by ``DRAFT_MARGIN`` (once drafting, by
  ``STAY_MARGIN``: leaving costs a catch-up to come back) and repays the
  draft's catch-up on the tokens it has not seen; while K = 0, an occasional
  short probe (backing off while probes fail) if the draft could still pay,
  which also learns from the draft's read-back of the tokens it caught up on
  (:meth:`AcceptanceEstimate.observe_skipped`); one plain round in
  ``BASELINE_EVERY`` to re-time plain decoding; and, with ``p_min="auto"``, a
  learned confidence cutoff.

Nothing here touches models, files or the clock: the decoder reports each
round (:meth:`DraftPolicy.update`) and asks for the next K
(:meth:`DraftPolicy.choose`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .checks import check_p_min


@dataclass
class CostModel:
    """Forward costs, in any one unit (seconds, or relative to T(1)).

    ``draft``: one more draft token within a round. ``draft_first``: a
    round's first draft token (None: the same as ``draft``; see the module
    docstring). ``target[b - 1]``: one target forward over b tokens, for
    b = 1..len(target); longer batches extrapolate linearly.
    ``draft_prefill``: per token, the draft catching up on tokens it skipped
    (one batched forward; what a probe pays first after K = 0 rounds).
    ``seconds``: the unit is seconds (measured), not relative (the prior).
    ``measured``: the batch sizes b whose ``target[b - 1]`` was timed, the
    others being guesses (:meth:`CostTracker._follow_timed`); None: all
    were (a calibration, or a record from before this field), when
    ``seconds``.

    The default is a conservative prior: a draft token at 0.4 of a target
    token and a batch of b at 1 + 0.2 (b - 1), so a draft must accept often
    before drafting looks worth it; live timings replace it within rounds.
    """

    draft: float = 0.4
    target: List[float] = field(default_factory=lambda: [1.0 + 0.2 * b for b in range(9)])
    seconds: bool = False
    draft_prefill: float = 0.1
    draft_first: Optional[float] = None
    measured: Optional[List[int]] = None

    def draft_cost(self, k: int) -> float:
        """The draft's forwards in a round that drafts k tokens."""
        if k <= 0:
            return 0.0
        return (self.draft if self.draft_first is None else self.draft_first) + (k - 1) * self.draft

    def target_cost(self, b: int) -> float:
        t = self.target
        if b <= len(t):
            return t[b - 1]
        slope = (t[-1] - t[-2]) if len(t) > 1 else t[-1]
        return t[-1] + slope * (b - len(t))

    def scaled(self, factor: float) -> "CostModel":
        """Every cost times ``factor``, in seconds (a relative prior meeting its
        first measurement)."""
        return CostModel(self.draft * factor, [t * factor for t in self.target], True,
                         self.draft_prefill * factor,
                         None if self.draft_first is None else self.draft_first * factor,
                         self.measured if self.seconds else [])

    def copy(self) -> "CostModel":
        return CostModel.from_dict(self.to_dict())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        return cls(draft=float(d["draft"]), target=[float(x) for x in d["target"]],
                   seconds=bool(d.get("seconds", cls.seconds)),
                   draft_prefill=float(d.get("draft_prefill", 0.5 * float(d["draft"]))),
                   draft_first=None if d.get("draft_first") is None else float(d["draft_first"]),
                   measured=cls._sizes(d.get("measured"), len(d["target"])))

    @staticmethod
    def _sizes(sizes, n: int) -> Optional[List[int]]:
        if sizes is None:
            return None
        out = sorted({int(b) for b in sizes})
        if any(not 1 <= b <= n for b in out) or any(int(b) != b for b in sizes):
            raise ValueError(f"measured batch sizes must be in 1..{n}, got {sizes!r}")
        return out


class CostTracker:
    """Forward costs as the run measures them.

    Args:
        costs: where to start (stored costs, or the relative prior).
        online: refine from timed rounds; False keeps ``costs`` unchanged (a
            seeded run with p/q verification must not read the clock).
    """

    def __init__(self, costs: Optional[CostModel] = None, online: bool = False) -> None:
        self.costs = (costs or CostModel()).copy()
        # Probes are gated on these starting costs, not on the live ones: one
        # slow round on a noisy machine must not start probing.
        self.start = self.costs.copy()
        self.online = online
        self.samples: Dict[object, int] = {}  # live samples per cost entry
        self.shape = 0  # counts changes other than every cost scaled alike: what a choice of K sees

    def timed(self, b: int) -> bool:
        """Whether a target batch of ``b`` has been timed: a measured starting
        cost (stored or calibrated), or a round of that size timed here."""
        return self.samples.get(b, 0) > 0 or self._measured_at_start(b)

    def _measured_at_start(self, key: object) -> bool:
        s = self.start
        return s.seconds and (not isinstance(key, int) or s.measured is None or key in s.measured)

    def timed_sizes(self) -> List[int]:
        """The batch sizes of ``costs.target`` timed, before this run or in it."""
        return [b for b in range(1, len(self.costs.target) + 1) if self.timed(b)]

    def measured_costs(self) -> CostModel:
        """The live costs, with the batch sizes timed so far or before (what
        is stored for later runs: a size guessed here must not be taken
        there as measured, or it is never put to the test)."""
        out = self.costs.copy()
        timed = self.timed_sizes()
        out.measured = None if len(timed) == len(out.target) else timed
        return out

    def knows_plain(self) -> bool:
        """Whether T(1) was measured: stored or calibrated costs, or a plain round timed here."""
        return self.timed(1)

    # What a cost stored by an earlier process (or a calibration) weighs
    # against one timing in this run: a prior, never a verdict. At one full
    # sample, a record written while another process held the CPU (the
    # draft's forwards 3x) kept a good draft off for every later call: the
    # first probes only halved the error (simulator: 0.79 of the best K).
    START_WEIGHT = 0.25

    def _blend(self, key: object, old: float, new: float) -> float:
        # A running mean over the first samples, then an EMA: shared machines
        # are noisy. A measured starting value (stored or calibrated costs)
        # counts as START_WEIGHT of a sample; a guess (the prior, or a batch
        # size guessed from the timed ones) counts as none: averaged with the
        # first measurement, a guess too high kept a run at K = 3 after it
        # had timed the larger batches.
        seen = self.samples.get(key, 0)
        self.samples[key] = seen + 1
        n = seen + (self.START_WEIGHT if self._measured_at_start(key) else 0.0)
        return old + max(0.1, 1.0 / (n + 1)) * (new - old)

    def drafting_timed(self) -> bool:
        """Whether this run has timed a draft forward (else the draft's costs are the start's)."""
        return self.samples.get("draft", 0) + self.samples.get("draft_first", 0) > 0

    def gate_costs(self) -> CostModel:
        """The costs probes are gated on: the starting ones (one slow round on
        a noisy machine must not start probing), but while this run has not
        timed the draft, no dearer than the built-in prior at the plain cost
        measured now: stored costs that say drafting loses must not keep a
        run from ever measuring the draft."""
        if self.drafting_timed() or not self.costs.seconds:
            return self.start
        prior = CostModel().scaled(self.costs.target[0])
        s = self.start if self.start.seconds else prior
        return CostModel(min(s.draft, prior.draft), [min(a, b) for a, b in zip(s.target, prior.target)], True,
                         min(s.draft_prefill, prior.draft_prefill),
                         None if s.draft_first is None else min(s.draft_first, prior.draft))

    def observe(self, drafted: int, draft_seconds: Optional[float], target_seconds: Optional[float],
                draft_caught_up: bool, first_seconds: Optional[float] = None) -> None:
        """One round's timings. ``draft_caught_up``: the draft first evaluated
        tokens it had skipped, so its first forward is not a round's usual
        one. ``first_seconds``: the draft's first forward, when the drafter
        timed it; without it the round's draft time counts evenly per token."""
        if not self.online or target_seconds is None or target_seconds <= 0:
            return
        if not self.costs.seconds:  # first measurement: rescale the relative prior
            self.costs = self.costs.scaled(target_seconds / self.costs.target_cost(drafted + 1))
        if draft_seconds is not None and drafted > 0:
            self._observe_draft(drafted, draft_seconds, draft_caught_up, first_seconds)
        t, b = self.costs.target, drafted + 1
        while len(t) < b:
            t.append(self.costs.target_cost(len(t) + 1))
        before = t[b - 1]
        t[b - 1] = self._blend(b, before, target_seconds)
        if b == 1:
            self._follow_plain(t[0] / before)
        else:
            self.shape += 1
        # Scaling every cost alike leaves the untimed batches where the last
        # call put them: only a newly timed size moves them.
        some_guessed = not self.start.seconds or self.start.measured is not None
        if some_guessed and (b > 1 or self.samples[1] == 1):
            self._follow_timed()
            self.shape += 1

    def _follow_plain(self, f: float) -> None:
        """Every other cost follows T(1)'s change by the factor ``f``. Plain
        rounds re-time T(1) often, the drafting costs are timed only while
        drafting: on a shared machine whose speed drifts, a slow spell seen in
        T(1) alone made the stale drafting costs look cheap, and a poor draft
        drafted into measured losses (greedy, K = 1 at a predicted +10%).
        Moved together, only ratios measured decide."""
        c = self.costs
        c.target[1:] = [x * f for x in c.target[1:]]
        c.draft, c.draft_prefill = c.draft * f, c.draft_prefill * f
        if c.draft_first is not None:
            c.draft_first *= f

    def _follow_timed(self) -> None:
        """Batches not timed yet follow the ones timed, not the prior's shape.
        The prior's slope (0.2 T(1) per token) is a guess; on the machine
        measured here a batch of 9 cost 1.8 T(1), not its 2.6, which kept a
        first run at small K until each size had been tried. Each guess errs
        high, for the concave costs measured (T(2) 1.35 T(1), T(4) 1.47):
        between timed sizes, the larger one's cost (a batch never costs
        less than a smaller one); beyond them, the line through the last
        two. Linear between T(1) and T(4) put T(2) 15% low, and a poor
        draft at K = 1 looked like a win. Larger sizes are put to the test
        (DraftPolicy.choose), smaller ones are not: only those may be
        guessed high for good."""
        t = self.costs.target
        timed = self.timed_sizes()
        if len(timed) < 2 or timed[0] != 1:
            return
        for b in range(2, len(t) + 1):
            if b in timed:
                continue
            hi = min((x for x in timed if x > b), default=None)
            if hi is not None:
                t[b - 1] = max(t[hi - 1], t[max(x for x in timed if x < b) - 1])
            else:
                lo, hi = timed[-2], timed[-1]
                t[b - 1] = t[hi - 1] + max(0.0, (t[hi - 1] - t[lo - 1]) / (hi - lo)) * (b - hi)

    def _observe_draft(self, drafted: int, seconds: float, caught_up: bool, first: Optional[float]) -> None:
        c = self.costs
        if first is None:  # one figure per token (a drafter that does not time its forwards)
            if not caught_up:
                c.draft = self._blend("draft", c.draft, seconds / drafted)
                c.draft_first = None
            return
        if not caught_up:
            c.draft_first = self._blend("draft_first", c.draft_cost(1), first)
        if drafted > 1:  # the later forwards are warm single tokens, after a catch-up too
            c.draft = self._blend("draft", c.draft, max(0.0, seconds - first) / (drafted - 1))


def rates(k_max: int, acc: Sequence[float], costs: CostModel) -> List[float]:
    """Expected tokens per unit cost when drafting k tokens a round, for
    k = 0..k_max: E(k) / cost(k) (module docstring), E built up in one pass
    (the policy asks every round: nine separate sums cost a plain round
    ~40 us of Python)."""
    out, e, run = [], 1.0, 1.0
    for k in range(k_max + 1):
        if k:
            run *= acc[k - 1]
            e += run
        out.append(e / (costs.draft_cost(k) + costs.target_cost(k + 1)))
    return out


def rate(k: int, acc: Sequence[float], costs: CostModel) -> float:
    """Expected tokens per unit cost when drafting k tokens a round."""
    return rates(k, acc, costs)[k]


class Counts:
    """Decayed counts of verified and accepted draft positions, per position
    and overall (a measured prior counts once overall, at every position)."""

    def __init__(self, k_max: int) -> None:
        self.accepted = [0.0] * k_max
        self.verified = [0.0] * k_max
        self.total = [0.0, 0.0]  # accepted, verified

    def decay(self, d: float) -> None:
        self.accepted = [a * d for a in self.accepted]
        self.verified = [v * d for v in self.verified]
        self.total = [t * d for t in self.total]

    def add(self, verified: int, accepted: int) -> None:
        for i in range(min(verified, len(self.verified))):
            self.verified[i] += 1.0
            self.accepted[i] += 1.0 if i < accepted else 0.0
        self.total[0] += accepted
        self.total[1] += verified

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
        n = min(len(a), len(v), k_max)
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
        self.version = 0             # counts changes to the counts
        if prior is not None:
            self.add_prior(float(prior))

    def add_prior(self, rate: float, weight: float = PRIOR_CAP) -> None:
        """A measured per-token acceptance, worth ``weight`` observations at
        every position (one early rejection must not outweigh it), counted
        once overall; observations decay it like any other evidence."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"a measured acceptance must be in [0, 1], got {rate!r}")
        self.version += 1
        self.before.accepted = [a + rate * weight for a in self.before.accepted]
        self.before.verified = [v + weight for v in self.before.verified]
        self.before.total = [self.before.total[0] + rate * weight, self.before.total[1] + weight]

    def knows_nothing(self) -> bool:
        """No prior, no stored evidence, no observation yet."""
        return self.totals()[1] == 0

    def totals(self) -> tuple:
        """(accepted, verified) overall, before and during the run."""
        return self.before.total[0] + self.run.total[0], self.before.total[1] + self.run.total[1]

    def per_position(self) -> List[float]:
        """Estimated conditional acceptance per draft position, shrunk to the overall rate."""
        acc, ver = self.totals()
        overall = (acc + 1.0) / (ver + 2.0)
        w = self.PRIOR_WEIGHT
        return [(a0 + a1 + w * overall) / (v0 + v1 + w) for a0, a1, v0, v1 in
                zip(self.before.accepted, self.run.accepted, self.before.verified, self.run.verified)]

    def optimistic(self) -> float:
        """The upper end (one sigma) of the per-token acceptance the counts
        allow, the evidence thinning as rounds without it pass; at most 0.99."""
        f = self.IDLE_FORGET ** self.rounds_without_evidence
        acc, ver = self.totals()
        n = ver * f
        g = (acc * f + 1.0) / (n + 2.0)
        return min(0.99, g + (g * (1.0 - g) / (n + 1.0)) ** 0.5)

    def observe(self, verified: int, accepted: int) -> None:
        """A round whose verifier decided ``verified`` positions, accepting the first ``accepted``."""
        if verified:
            self._new_evidence()
            self.run.add(verified, accepted)

    def _new_evidence(self) -> None:
        # Decay per observation, so rounds without drafting do not erase what was learned.
        self.rounds_without_evidence = 0
        self.version += 1
        self.before.decay(self.decay)
        self.run.decay(self.decay)
        self.run_decay *= self.decay

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
        k_max = len(self.before.verified)
        try:
            stored = Counts.from_dict(evidence, k_max)
        except (KeyError, TypeError, ValueError):
            return  # none, or an old or damaged record: learn from scratch
        n = stored.total[1]
        self.before.add_scaled(stored, min(1.0, self.PRIOR_CAP / n) if n > 0 else 0.0)
        self.version += 1

    def hand_over(self) -> dict:
        """This run's contribution for the store, then start a new one:
        ``{"counts", "decay"}``, to be merged as ``stored * decay + counts``
        (:func:`merge_evidence`)."""
        out = {"counts": self.run.to_dict(), "decay": self.run_decay}
        self.before.add_scaled(self.run, 1.0)
        self.run = Counts(len(self.before.verified))
        self.run_decay = 1.0
        return out


def merge_evidence(stored: Optional[dict], contribution: dict) -> dict:
    """Stored evidence decayed by what the run observed, plus the run's counts.
    Concurrent runs each apply their own contribution: none is lost. A
    damaged stored record is replaced by the contribution."""
    counts = contribution["counts"]
    k_max = len(counts["verified"])
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


class ProbeSchedule:
    """When a probe is due while the policy decodes plainly: after ``every``
    plain rounds. A probe after which the policy stays plain doubles the wait
    (up to BACKOFF_CAP times the start), or halves it if it kept all its
    tokens: probes thin out unless most keep everything, and a draft that
    improved is noticed soon. Any drafting round restores the starting wait.

    Args:
        every: plain rounds between probes to start with.
    """

    BACKOFF_CAP = 32

    def __init__(self, every: int) -> None:
        self.base = self.every = every
        self.waited = 0       # plain rounds since the last probe or drafting round
        self.probing = False  # the current round is a probe

    def plain_round(self) -> bool:
        """Count a plain round; True when a probe is due."""
        self.probing = False
        self.waited += 1
        return self.waited >= self.every

    def start(self) -> None:
        """The current round probes."""
        self.probing, self.waited = True, 0

    def drafting(self) -> None:
        """The current round drafts by the policy's own choice."""
        self.probing, self.waited, self.every = False, 0, self.base

    def outcome(self, drafted: int, kept_all: bool, stays_plain: bool) -> None:
        """The current probe drafted ``drafted`` tokens, kept them all or not;
        ``stays_plain``: what it showed leaves the policy at K = 0."""
        if drafted == 0:  # nothing to propose (no n-gram match): probe again next plain round
            self.waited = self.every
        elif stays_plain:
            grow = 0.5 if kept_all else 2
            self.every = max(self.base, min(int(self.every * grow), self.base * self.BACKOFF_CAP))


class DraftPolicy:
    """The choice of K each round (and of the draft confidence cutoff ``p_min``).

    Args:
        k_max: largest draft length considered.
        costs: the starting :class:`CostModel` (stored costs; the relative
            prior otherwise).
        online_costs: refine costs from timed rounds (see :class:`CostTracker`).
        decay: per-round decay of the acceptance counts.
        probe_every: plain rounds between probes to start with (see :class:`ProbeSchedule`).
        p_min: None (no cutoff), a float, or "auto" (learned: stop drafting
            when the draft's confidence predicts an acceptance below what one
            more draft token costs).
        prior: the draft's per-token acceptance measured beforehand, worth
            ``AcceptanceEstimate.PRIOR_CAP`` observations; None: none.
    """

    PROBE_K = 3           # drafts per probe: the catch-up dominates its cost, so learn more
    PROBE_EVERY = 16      # plain rounds between probes to start with (each pays the draft's catch-up)
    BASELINE_EVERY = 32   # online: one plain round this often while drafting, to re-time it
    DRAFT_MARGIN = 1.10   # draft only when it is expected to beat plain decoding by this: with
                          # a poor draft, wins predicted at +5-10% measured as 6-12% losses
    STAY_MARGIN = 1.0     # once drafting, it stops when expected to lose at all: leaving costs the
                          # draft's catch-up to come back, and on noisy estimates (two misses at the
                          # first position, at acceptance 0.95) the entry margin made leaving a trap:
                          # in simulation a good draft stayed off in 1 run in 8 and drafted in 56% of
                          # rounds; at 1.0, 1 in 20 and 85%, a poor draft unchanged
    PROBE_MARGIN = 1.10   # probes run only if the draft could beat plain decoding by this: a probe
                          # pays the draft's whole catch-up, so marginal hopes are not worth one
    PROBE_ODDS = 0.2      # the chance a probe finds the draft as good as the optimistic estimate
                          # (its one-sigma upper end): what a probe's catch-up is weighed against

    def __init__(self, k_max: int = 8, costs: Optional[CostModel] = None, *, online_costs: bool = False,
                 decay: float = 0.95, probe_every: int = PROBE_EVERY, p_min=None,
                 prior: Optional[float] = None) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max = k_max
        self.acceptance = AcceptanceEstimate(k_max, prior, decay)
        self.tracker = CostTracker(costs, online_costs)
        self.p_min_setting = check_p_min(p_min)
        self.probes = ProbeSchedule(probe_every)
        self.rounds_since_plain = 0      # drafting rounds since the last plain one
        self.after_plain = True          # the last round drafted nothing: the draft lags
        self.drafting = False            # the last choice, before probes and re-timing, was to draft
        self._best: tuple = (None, 0)    # (what it depends on, best_k) as _best_k_now last found it
        self.by_confidence = ConfidenceBins()

    @property
    def costs(self) -> CostModel:
        return self.tracker.costs

    # -- estimates -----------------------------------------------------------
    def rate(self, k: int, acc: Optional[Sequence[float]] = None, costs: Optional[CostModel] = None) -> float:
        """Expected tokens per unit cost when drafting k (at ``costs``, default the live ones)."""
        return rate(k, self.acceptance.per_position() if acc is None else acc, costs or self.costs)

    def best_k(self, acc: Optional[Sequence[float]] = None, margin: Optional[float] = None) -> int:
        """The K with the best expected rate; 0 unless drafting is expected to
        beat plain decoding by ``margin`` (default DRAFT_MARGIN: the cost
        estimates are noisy, and a marginal win predicted is often a loss
        measured)."""
        r = rates(self.k_max, self.acceptance.per_position() if acc is None else acc, self.costs)
        k = max(range(1, self.k_max + 1), key=lambda k: (r[k], -k))
        return k if r[k] > (self.DRAFT_MARGIN if margin is None else margin) * r[0] else 0

    def could_pay(self, remaining: Optional[int] = None, lag: int = 0) -> bool:
        """Whether, at the starting costs and the optimistic acceptance, some
        K beats plain decoding by PROBE_MARGIN, and the chance (PROBE_ODDS) of
        saving that much on the ``remaining`` tokens outweighs the draft's
        catch-up over ``lag`` tokens. Measured with a poor draft, probes at
        even odds ran at every call's start, each catching up on the prompt
        to learn three tokens: 2-3% of the run, for nothing."""
        acc = [self.acceptance.optimistic()] * self.k_max
        start = self.tracker.gate_costs()
        r = rates(self.k_max, acc, start)
        best = max(range(1, self.k_max + 1), key=lambda k: r[k])
        if r[best] <= self.PROBE_MARGIN * r[0]:
            return False
        return self.repays(best, remaining, lag, acc, start, self.PROBE_ODDS)

    def repays(self, k: int, remaining: Optional[int], lag: int, acc: Optional[Sequence[float]] = None,
               costs: Optional[CostModel] = None, odds: float = 1.0) -> bool:
        """Whether drafting k per round over the ``remaining`` tokens is expected
        to save more (times ``odds``, the chance of saving it) than the draft's
        catch-up on ``lag`` unseen tokens costs (a long prompt before a short
        answer may not be worth it). The last 2 do not count: every drafting
        round catches up on that many, and the draft's cost includes it."""
        if remaining is None or lag <= 2:
            return True
        c = costs or self.costs
        saving = remaining * (1.0 / self.rate(0, acc, c) - 1.0 / self.rate(k, acc, c))
        return odds * saving > (lag - 2) * c.draft_prefill

    # -- the per-round calls ---------------------------------------------------
    def choose(self, remaining: Optional[int] = None, lag: int = 0) -> int:
        """K for the next round; ``remaining``: tokens left to generate (None:
        unknown); ``lag``: tokens of the context the draft has not evaluated
        (what drafting now would first catch up on)."""
        k = self._best_k_now()
        if k and not self.repays(k, remaining, lag):
            k = 0  # the draft's catch-up would cost more than it could win back
        self.drafting = k > 0
        if k == 0:
            self.acceptance.rounds_without_evidence += 1
            # Knowing nothing of the draft, any plain round may probe: waiting
            # would cost a good draft's first run most of its speed-up.
            due = self.probes.plain_round() or self.acceptance.knows_nothing()
            if due and self.could_pay(remaining, lag):
                self.probes.start()
                k = min(self.PROBE_K, self.k_max)
        else:
            self.probes.drafting()
            self.rounds_since_plain += 1
            # Plain decoding is only timed in plain rounds; a stale, slow
            # estimate of it would keep the policy drafting. Until one plain
            # round has been timed (the first round, which reads the prompt,
            # is not), its cost is a guess: time one early.
            every = self.BASELINE_EVERY if self.tracker.knows_plain() else 2
            if self.tracker.online and self.rounds_since_plain >= every:
                k = 0
            elif self.tracker.online and every == self.BASELINE_EVERY and self.rounds_since_plain == every // 2:
                # Untimed batch sizes past the timed ones cost what the line
                # through the last two says: a guess, and a guess too high is never put to the test
                # (a bench run kept K = 3 where fixed K = 8 ran 9% faster; in
                # simulation 3 runs in 10 did, the worst at 0.80 of the best
                # rate). One round in BASELINE_EVERY drafts up to the smallest
                # larger size not timed yet, which then is.
                k = next((b - 1 for b in range(k + 2, self.k_max + 2) if not self.tracker.timed(b)), k)
        if k == 0:
            self.rounds_since_plain = 0
        return k

    def _best_k_now(self) -> int:
        """best_k() at the margin that applies now, computed again only when
        the acceptance counts or the costs' shape changed: a plain round
        scales every cost alike, which moves no rate ratio (at K = 0 this
        was most of the policy's time, ~30 us a round)."""
        margin = self.STAY_MARGIN if self.drafting else self.DRAFT_MARGIN
        key = (self.acceptance.version, self.tracker.shape, margin)
        if key != self._best[0]:
            self._best = (key, self.best_k(margin=margin))
        return self._best[1]

    def p_min(self) -> Optional[float]:
        """The confidence cutoff for the next round (None: no cutoff)."""
        if self.p_min_setting != "auto":
            return None if self.p_min_setting is None else float(self.p_min_setting)
        # One more draft token costs `draft` plus the target's marginal batch
        # cost; at the current best rate that cost is worth `need` tokens.
        k = max(1, self.best_k())
        c = self.costs
        return self.by_confidence.cutoff((c.draft + c.target_cost(k + 2) - c.target_cost(k + 1)) * self.rate(k))

    def update(self, drafted: int, accepted: int, confidences: Optional[Sequence[float]] = None,
               draft_cost: Optional[float] = None, target_cost: Optional[float] = None,
               first_cost: Optional[float] = None, catchup: Optional[Tuple[float, int]] = None) -> None:
        """Record a round: ``drafted`` proposed, ``accepted`` kept; the draft's
        confidence per proposed token; the round's measured forward times
        (``first_cost``: the draft's first forward, if the drafter timed it);
        ``catchup``: ``(acceptances, positions)`` the draft's read-back of
        tokens it caught up on showed (:attr:`~specgguf.drafter.Draft.catchup`)."""
        if catchup:
            self.acceptance.observe_skipped(float(catchup[0]), int(catchup[1]))
        verified = min(drafted, accepted + 1)  # positions the verifier decided on
        self.acceptance.observe(verified, accepted)
        self.by_confidence.observe(verified, accepted, confidences, self.acceptance.decay)
        if self.probes.probing:
            # A probe cut short by p_min and kept whole does not count as
            # keeping all: one kept token says little.
            self.probes.outcome(drafted, accepted >= min(self.PROBE_K, self.k_max),
                                drafted > 0 and self.best_k() == 0)
        self.tracker.observe(drafted, draft_cost, target_cost, self.after_plain, first_cost)
        self.after_plain = drafted == 0
