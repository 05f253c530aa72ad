"""Choosing the draft length each round: speculate only when it pays.

With per-position acceptance a_0, a_1, ... (a_i = P(draft token i accepted |
tokens before it accepted)), a round that drafts K tokens emits on average

    E(K) = 1 + a_0 + a_0 a_1 + ... + a_0 ... a_{K-1}

tokens and costs ``K * draft + target(K + 1)`` (one draft forward per token,
one target forward over K+1 tokens, whose cost is not linear in K). The
policy picks the K in 0..k_max with the most expected tokens per unit of
cost (Leviathan et al.'s speedup formula with measured terms); K = 0 is plain
target decoding, kept unless drafting is expected to win by 5%. Acceptance is estimated online from counts that decay with
each verified position. While K = 0 is chosen, a probe round (K = 3) runs on
a fixed round schedule (backing off while probes fail) so that a draft that
becomes good again is noticed - but only while the draft could still pay:
at the calibrated costs and an optimistic acceptance (the upper end of what
the counts allow, widening again as idle rounds pass) it must beat plain
decoding by 5%. A probe is not free: the draft first catches up on every
token it skipped, which is why a draft known to be poor is not probed often,
and no probe runs when the tokens left to generate could not repay that.
A measured acceptance (the calibration's) can start the counts, so a
poor draft is known as such from the first round.

Reproducibility: with ``online_costs=False`` nothing here depends on the clock,
so a seeded run makes the same choices (and draws the same randoms) every time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence


@dataclass
class CostModel:
    """Forward costs, in any one unit (seconds or relative).

    ``draft``: one draft token. ``target[b - 1]``: one target forward over b
    tokens, for b = 1..len(target); longer batches extrapolate linearly.
    ``draft_prefill``: per token, the draft catching up on tokens it skipped
    (one batched forward; what a probe pays first after K = 0 rounds).
    ``seconds``: the unit is seconds (a calibration), not relative (defaults).
    """

    draft: float = 0.3
    target: List[float] = field(default_factory=lambda: [1.0 + 0.15 * b for b in range(9)])
    seconds: bool = False
    draft_prefill: float = 0.1

    def target_cost(self, b: int) -> float:
        t = self.target
        if b <= len(t):
            return t[b - 1]
        slope = (t[-1] - t[-2]) if len(t) > 1 else t[-1]
        return t[-1] + slope * (b - len(t))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        return cls(draft=float(d["draft"]), target=[float(x) for x in d["target"]],
                   seconds=bool(d.get("seconds", True)),
                   draft_prefill=float(d.get("draft_prefill", 0.5 * float(d["draft"]))))


class DraftPolicy:
    """Online choice of K (and of the draft confidence cutoff ``p_min``).

    Args:
        k_max: largest draft length considered.
        costs: initial :class:`CostModel` (a calibration; defaults otherwise).
        online_costs: refine costs from measured round timings (EMA). Leave
            False for seeded sampling runs so they stay reproducible.
        decay: per-round decay of the acceptance counts (memory ~ 1/(1-decay)).
        probe_every: K = 0 rounds between probes; doubles after a probe that
            does not pay, up to 32x.
        p_min: None (no cutoff), a float, or "auto" (learned: stop drafting
            when the draft's confidence predicts an acceptance below what one
            more draft token costs).
        prior: the draft's per-token acceptance measured beforehand (e.g. by
            :meth:`~specgguf.llama_adapter.LlamaPair.measure_acceptance`),
            counted as PRIOR_CAP observations; None: no prior (a uniform one).
    """

    PRIOR_WEIGHT = 2.0
    PRIOR_CAP = 8.0         # a measured or stored prior counts as at most this many observations
    BINS = 10
    PROBE_K = 3             # drafts per probe: the catch-up dominates its cost, so learn more
    BASELINE_EVERY = 32     # online: one plain round this often while drafting, to re-time it
    DRAFT_MARGIN = 1.05     # draft only when it is expected to beat plain decoding by this
    PROBE_MARGIN = 1.05     # probes run only if the draft could beat plain decoding by this
    IDLE_FORGET = 0.995     # per idle round, on the evidence used to rule probes out

    def __init__(self, k_max: int = 8, costs: Optional[CostModel] = None, *, online_costs: bool = False,
                 decay: float = 0.95, probe_every: int = 16, p_min=None,
                 prior: Optional[float] = None) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if p_min is not None and p_min != "auto" and not 0.0 <= float(p_min) <= 1.0:
            raise ValueError(f"p_min must be None, 'auto' or in [0, 1], got {p_min!r}")
        if prior is not None and not 0.0 <= float(prior) <= 1.0:
            raise ValueError(f"prior must be None or in [0, 1], got {prior!r}")
        self.k_max = k_max
        self.costs = costs or CostModel()
        # Probes are gated on these (the calibration), not on the live
        # estimates: one slow round on a noisy machine must not start probing.
        self.calibrated = CostModel.from_dict(self.costs.to_dict())
        self.online_costs = online_costs
        self.decay = decay
        self.probe_base = probe_every
        self.probe_every = probe_every
        self.p_min_setting = p_min
        # A measured prior is evidence like any other, at every position (one
        # early rejection must not outweigh it); observations decay it.
        n = 0.0 if prior is None else self.PRIOR_CAP
        a = 0.0 if prior is None else float(prior) * n
        self.acc, self.tried = [a] * k_max, [n] * k_max
        self.total_acc, self.total_tried = a, n
        self.bin_acc = [0.0] * self.BINS
        self.bin_tried = [0.0] * self.BINS
        self.zero_rounds = 0
        self.idle_rounds = 0
        self.busy_rounds = 0  # rounds since the last plain (K = 0) one
        self._samples: Dict[object, int] = {}  # live cost samples per key
        self.probing = False
        self._after_idle = True

    # -- estimates -----------------------------------------------------------
    def acceptance(self) -> List[float]:
        """Estimated conditional acceptance per draft position (shrunk to the global rate)."""
        g = (self.total_acc + 1.0) / (self.total_tried + 2.0)
        w = self.PRIOR_WEIGHT
        return [(a + w * g) / (t + w) for a, t in zip(self.acc, self.tried)]

    def expected_tokens(self, k: int, acc: Optional[Sequence[float]] = None) -> float:
        acc = self.acceptance() if acc is None else acc
        e, run = 1.0, 1.0
        for i in range(k):
            run *= acc[i]
            e += run
        return e

    def rate(self, k: int, acc: Optional[Sequence[float]] = None,
             costs: Optional[CostModel] = None) -> float:
        """Expected tokens per unit cost when drafting k (at ``costs``, default the live ones)."""
        c = costs or self.costs
        return self.expected_tokens(k, acc) / (k * c.draft + c.target_cost(k + 1))

    def best_k(self, acc: Optional[Sequence[float]] = None) -> int:
        """The K with the best expected rate; 0 unless drafting is expected to
        beat plain decoding by DRAFT_MARGIN (the cost estimates are noisy, and
        a marginal win predicted is often a loss measured)."""
        acc = self.acceptance() if acc is None else acc
        rates = [self.rate(k, acc) for k in range(self.k_max + 1)]
        k = max(range(1, self.k_max + 1), key=lambda k: (rates[k], -k))
        return k if rates[k] > self.DRAFT_MARGIN * rates[0] else 0

    def optimistic_acceptance(self) -> float:
        """Upper end of the per-token acceptance the counts allow (one sigma:
        a probe costs too much to chase long shots), the evidence thinning as
        idle rounds pass; at most 0.99."""
        f = self.IDLE_FORGET ** self.idle_rounds
        n = self.total_tried * f
        g = (self.total_acc * f + 1.0) / (n + 2.0)
        return min(0.99, g + (g * (1.0 - g) / (n + 1.0)) ** 0.5)

    def could_pay(self, remaining: Optional[int] = None, skipped: int = 0) -> bool:
        """Whether, at the calibrated costs and the optimistic acceptance, some
        K beats plain decoding by PROBE_MARGIN - and, given ``remaining``
        tokens still to generate, could save more on them than the probe's
        catch-up over ``skipped`` tokens costs (a long prompt near the end of
        a short answer is not worth it)."""
        acc = [self.optimistic_acceptance()] * self.k_max
        rate = lambda k: self.rate(k, acc, self.calibrated)
        best = max(range(1, self.k_max + 1), key=rate)
        if rate(best) <= self.PROBE_MARGIN * rate(0):
            return False
        return self.repays(best, remaining, skipped, acc, self.calibrated)

    def repays(self, k: int, remaining: Optional[int], skipped: int,
               acc: Optional[Sequence[float]] = None, costs: Optional[CostModel] = None) -> bool:
        """Whether drafting k per round over the ``remaining`` tokens is expected
        to save more than the draft's catch-up on ``skipped`` unseen tokens
        costs (a long prompt before a short answer may not be worth it). The
        last 2 do not count: every drafting round catches up on that many,
        and the draft's calibrated cost includes it."""
        if remaining is None or skipped <= 2:
            return True
        c = costs or self.costs
        saving = remaining * (1.0 / self.rate(0, acc, c) - 1.0 / self.rate(k, acc, c))
        return saving > (skipped - 2) * c.draft_prefill

    # -- what carries over between runs ---------------------------------------
    def state(self) -> Dict[str, object]:
        """The learned acceptance, to seed a later policy for the same pair."""
        return {"acc": list(self.acc), "tried": list(self.tried), "total_acc": self.total_acc,
                "total_tried": self.total_tried}

    def load_state(self, state: Optional[Dict[str, object]]) -> None:
        """Add a stored :meth:`state`, scaled down to at most PRIOR_CAP
        observations, to what the policy holds (its measured prior, if any).

        Added, not substituted: a stored state has few observations at the
        deeper positions (often none), and a policy that decodes plainly never
        adds more, so alone it could keep a good draft's estimate low for good
        - the measured prior fills those positions."""
        if not state:
            return
        try:
            tried = float(state["total_tried"])
            f = min(1.0, self.PRIOR_CAP / tried) if tried > 0 else 0.0
            acc = [float(x) * f for x in state["acc"]][: self.k_max]
            tr = [float(x) * f for x in state["tried"]][: self.k_max]
            total_acc = float(state["total_acc"]) * f
        except (KeyError, TypeError, ValueError):
            return  # an old or damaged file: learn from scratch
        for i in range(len(acc)):
            self.acc[i] += acc[i]
            self.tried[i] += tr[i]
        self.total_acc += total_acc
        self.total_tried += tried * f

    # -- the per-round calls ---------------------------------------------------
    def choose(self, remaining: Optional[int] = None, skipped: int = 0) -> int:
        """K for the next round; ``remaining``: tokens left to generate (None:
        unknown), ``skipped``: tokens the draft has not seen (what a probe
        would first catch up on)."""
        k = self.best_k()
        if k and not self.repays(k, remaining, skipped):
            k = 0  # the draft's catch-up would cost more than it could win back
        self.probing = False
        if k == 0:
            self.zero_rounds += 1
            self.idle_rounds += 1
            if self.zero_rounds >= self.probe_every and self.could_pay(remaining, skipped):
                self.zero_rounds = 0
                self.probing = True
                k = min(self.PROBE_K, self.k_max)
        else:
            self.zero_rounds = 0
            self.probe_every = self.probe_base
            self.busy_rounds += 1
            # The cost of plain decoding is only measured in plain rounds; a
            # stale, slow estimate of it would keep the policy drafting.
            if self.online_costs and self.busy_rounds >= self.BASELINE_EVERY:
                k = 0
        if k == 0:
            self.busy_rounds = 0
        return k

    def p_min(self) -> Optional[float]:
        """The confidence cutoff for the next round (None: no cutoff)."""
        if self.p_min_setting != "auto":
            return None if self.p_min_setting is None else float(self.p_min_setting)
        # One more draft token costs `draft` plus the target's marginal batch
        # cost; at the current best rate that cost is worth `need` tokens.
        k = max(1, self.best_k())
        marginal = self.costs.draft + self.costs.target_cost(k + 2) - self.costs.target_cost(k + 1)
        need = marginal * self.rate(k)
        for b in range(self.BINS):  # lowest confidence bin whose acceptance pays, and all above it
            if all(self._bin_rate(j) >= need for j in range(b, self.BINS)):
                return b / self.BINS
        return 1.0

    def _bin_rate(self, b: int) -> float:
        prior = (b + 0.5) / self.BINS  # before data: confidence ~ acceptance
        return (self.bin_acc[b] + self.PRIOR_WEIGHT * prior) / (self.bin_tried[b] + self.PRIOR_WEIGHT)

    def update(self, drafted: int, accepted: int, confidences: Optional[Sequence[float]] = None,
               draft_cost: Optional[float] = None, target_cost: Optional[float] = None) -> None:
        """Record a round: ``drafted`` proposed, ``accepted`` kept; the draft's
        confidence per proposed token; measured costs (used if online_costs)."""
        verified = min(drafted, accepted + 1)  # positions the verifier decided on
        if self.probing and drafted == 0:  # the draft had nothing (no n-gram match): probe again
            self.zero_rounds = self.probe_every
        if verified:  # decay per observation, so idle rounds do not erase what was learned
            self.idle_rounds = 0
            d = self.decay
            self.acc = [a * d for a in self.acc]
            self.tried = [t * d for t in self.tried]
            self.total_acc *= d
            self.total_tried *= d
            self.bin_acc = [a * d for a in self.bin_acc]
            self.bin_tried = [t * d for t in self.bin_tried]
        for i in range(min(verified, self.k_max)):
            self.tried[i] += 1.0
            self.acc[i] += 1.0 if i < accepted else 0.0
        self.total_tried += verified
        self.total_acc += accepted
        if confidences is not None:
            for i in range(min(verified, len(confidences))):
                b = min(self.BINS - 1, max(0, int(confidences[i] * self.BINS)))
                self.bin_tried[b] += 1.0
                self.bin_acc[b] += 1.0 if i < accepted else 0.0
        if self.probing and drafted > 0 and self.best_k() == 0:
            self.probe_every = min(self.probe_every * 2, self.probe_base * 32)
        if self.online_costs and target_cost is not None and target_cost > 0:
            if not self.costs.seconds:  # first measurement: rescale the relative defaults
                scale = target_cost / self.costs.target_cost(drafted + 1)
                self.costs = CostModel(self.costs.draft * scale, [t * scale for t in self.costs.target],
                                       seconds=True)
            # A running mean over the first samples (the calibration counts
            # as one), then an EMA: shared machines are noisy.
            ema = lambda key: max(0.1, 1.0 / (self._samples.setdefault(key, 0) + 2))
            # After K = 0 rounds the draft first catches up on skipped tokens:
            # that round's draft time is not the cost of a drafted token.
            if draft_cost is not None and drafted > 0 and not self._after_idle:
                self.costs.draft += ema("draft") * (draft_cost / drafted - self.costs.draft)
                self._samples["draft"] += 1
            b = drafted + 1
            t = self.costs.target
            while len(t) < b:
                t.append(self.costs.target_cost(len(t) + 1))
            t[b - 1] += ema(b) * (target_cost - t[b - 1])
            self._samples[b] += 1
        self._after_idle = drafted == 0
