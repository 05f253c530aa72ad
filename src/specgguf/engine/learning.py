"""What one loaded pair learns across its runs, and hands to the state store.

A :class:`Learning` keeps one :class:`~specgguf.engine.policy.DraftPolicy` per
sampling regime (greedy, or the warp settings): what a chat session learns
in one call helps the next. A policy starts from the stored round times
(a prior for the K it has not timed yet, never a verdict: see
:mod:`specgguf.engine.policy`), the measured acceptance of ``calibrate()`` where it
applies, and what earlier runs learned; after each run its new evidence is
merged into the store and its measured round times replace the stored ones.

Runs whose output the clock could change (exact p/q sampling with a seed)
get a fresh policy on the stored values, blind to the clock, and write
nothing: the same seed, settings and stored state give the same text. Every
other run times its own rounds.

A run that knows nothing of its draft measures the draft's acceptance on its
prompt (:meth:`Learning.policy`). Unless the run is clock-blind, that
measurement is stored at once, a prior for its regime like calibrate()'s:
later processes, and seeded p/q runs (which would otherwise measure at
every call), start from it with the same weight instead of paying the
draft's prompt evaluation again. For a draft too poor to ever run, that
evaluation is all the draft costs; stored as weak evidence instead, it let
every seeded p/q call probe the draft again (measured: 9.6% of that row's
time in the draft, 36 rounds drafting in 1,144).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

from ..config import GenerationConfig
from .acceptance import merge_evidence
from .arms import CostModel
from .policy import DraftPolicy
from ..state import PairState

AUTO_K_MAX = 8  # the largest draft length k="auto" considers
LOOKUP_COSTS = CostModel(draft=1e-4, draft_prefill=0.0)  # an n-gram lookup: a round costs the target's forward
SAMPLED_PRIOR = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)  # where calibrate() measures


class Learning:
    """Draft policies for one pair, fed by and feeding its stored state.

    Args:
        state: the pair's records (read once per regime, when first needed).
        model_free: the draft is an n-gram lookup (its cost is nothing).
    """

    def __init__(self, state: PairState, model_free: bool = False) -> None:
        self.state = state
        self.model_free = model_free
        self.policies: Dict[str, DraftPolicy] = {}
        self.lookups: Dict[str, DraftPolicy] = {}  # an n-gram lookup's in front of the draft, per regime
        self.stored_costs = state.costs()
        self.measured = state.acceptance()

    def _costs(self) -> Optional[CostModel]:
        """Stored costs (a prior for round times not measured yet), an n-gram
        lookup's (free), or None: the built-in prior."""
        if self.stored_costs:
            try:
                return CostModel.from_dict(self.stored_costs)
            except (KeyError, TypeError, ValueError):
                pass  # a damaged record: the prior
        return LOOKUP_COSTS if self.model_free else None

    def prior(self, config: GenerationConfig) -> Optional[float]:
        """The measured acceptance that applies to ``config``'s regime, if any:
        greedy agreement for greedy runs; the sampled figure only at the
        settings it was measured at, with exact verification."""
        if not self.measured:
            return None
        if config.greedy:
            return self.measured.get("greedy")
        same = all(abs(getattr(config, k) - v) < 1e-9 for k, v in SAMPLED_PRIOR.items())
        return self.measured.get("sampled") if same and config.verification == "exact" else None

    def policy(self, config: GenerationConfig,
               measure: Optional[Callable[[], Optional[tuple]]] = None) -> Optional[DraftPolicy]:
        """The policy for a k="auto" run with ``config`` (None for a fixed k).

        ``measure()``: ``(the draft's acceptance on this run's prompt,
        positions measured)`` or None, asked for only when nothing is known of
        the draft: better than probing blind, where a probe into a poor draft
        pays the draft's whole catch-up to learn three tokens. It counts as
        one observation per position measured, and is stored unless the run
        is clock-blind (see the module docstring)."""
        if config.k != "auto":
            return None
        frozen, regime = _frozen(config), config.regime
        policy = self.policies.get(regime)
        if frozen or policy is None or policy.p_min_setting != config.p_min:
            prior = self.prior(config)
            policy = DraftPolicy(AUTO_K_MAX, self._costs(), online_costs=not frozen, p_min=config.p_min, prior=prior)
            policy.acceptance.add_before(self.state.evidence(regime))
            if prior is None:
                self._add_prompt_prior(policy, regime)
            if not frozen:
                self.policies[regime] = policy
        if measure is not None and policy.acceptance.knows_nothing():
            measured = measure()
            if measured is not None:
                policy.acceptance.add_prior(measured[0], float(measured[1]))
                if not frozen:
                    self.state.save_prompt_acceptance(regime, measured[0], measured[1])
        return policy

    def lookup_policy(self, config: GenerationConfig) -> Optional[DraftPolicy]:
        """The own policy of an n-gram lookup tried before the draft model
        (``ngram=True``) for a k="auto" run with ``config`` (None for a fixed
        k). Kept per regime for the process, never stored: what a lookup
        accepts is about the text, not the pair (see
        :mod:`specgguf.engine.lookup_first`)."""
        if config.k != "auto":
            return None
        if _frozen(config):
            return new_lookup_policy(online=False)
        if config.regime not in self.lookups:
            self.lookups[config.regime] = new_lookup_policy()
        return self.lookups[config.regime]

    def _add_prompt_prior(self, policy: DraftPolicy, regime: str) -> None:
        """The acceptance an earlier run measured on its prompt, if stored (a damaged record: none)."""
        stored = self.state.prompt_acceptance(regime)
        try:
            rate, weight = float(stored["acceptance"]), float(stored["positions"])
            if not 0 < weight <= 1024:
                raise ValueError("positions out of range")
            policy.acceptance.add_prior(rate, weight)
        except (KeyError, TypeError, ValueError):
            pass

    def finish(self, policy: Optional[DraftPolicy], config: GenerationConfig) -> None:
        """After a run: merge what ``policy`` learned into the store, and keep
        its measured round times for later processes, a prior there
        (clock-blind runs write nothing)."""
        if policy is None or not policy.online:
            return
        self.keep(config.regime, policy.acceptance.hand_over())
        if any(policy.arms.timed):
            self.stored_costs = policy.arms.record().to_dict()
            self.state.save_costs(self.stored_costs)

    def keep(self, regime: str, contribution: dict) -> None:
        """Merge a run's acceptance evidence (an :meth:`~specgguf.engine.acceptance.AcceptanceEstimate.hand_over`)
        into the store, where later runs and processes start from it."""
        if sum(contribution["counts"]["verified"]) > 0:
            self.state.update_evidence(regime, lambda old: merge_evidence(old, contribution))

    def calibrated(self, costs: CostModel, acceptance: Optional[dict]) -> None:
        """Store an explicit calibration; policies made from now on start from it."""
        self.stored_costs = costs.to_dict()
        self.state.save_costs(self.stored_costs)
        if acceptance is not None:
            self.measured = acceptance
            self.state.save_acceptance(acceptance)
        self.policies.clear()


def new_lookup_policy(online: bool = True) -> DraftPolicy:
    """A new policy for an n-gram lookup in front of a draft model: a lookup's
    costs, and no re-timing of its own (see :mod:`specgguf.engine.lookup_first`)."""
    return DraftPolicy(AUTO_K_MAX, LOOKUP_COSTS, online_costs=online, retime=False)


def _frozen(config: GenerationConfig) -> bool:
    """Exact p/q sampling with a seed: the clock must not change the output."""
    return config.verification == "exact" and config.seed is not None
