"""What one loaded pair learns across its runs, and hands to the state store.

One :class:`~specgguf.engine.policy.Policy` serves every run of the pair in
this process: its costs are this process's rounds, whatever the regime, and
what a chat learns in one call helps the next. What a run learns of the
draft's acceptance in a regime is stored as that regime's evidence; a later
process starts from it as a prior (a few observations' worth, never a
verdict), with calibrate()'s measured acceptance where it applies. What the
forwards cost against a target token is stored too: a later process prices
the draft so until its own first forward is timed, and the target's batches
past those it timed (identical processes here differ by 20% in speed, the
two models alike).

A process's first run in a regime measures the draft's acceptance on its
prompt, in the prompt's round (:func:`~specgguf.engine.rounds.to_measure`),
whatever was stored: better than probing blind (a probe into a poor draft
pays the draft's whole catch-up to learn three tokens), and what makes a
stored record a prior, never a verdict (one written where the text did not
suit the draft is outweighed by the first prompt).

Runs whose text the clock could change (exact p/q sampling with a seed) get
a policy of their own, blind to the clock, on the stored evidence, and write
nothing: the same seed, settings and stored state give the same text.
"""

from __future__ import annotations

from typing import Optional

from ..config import AUTO_K_MAX, LOOKUP_K_MAX, GenerationConfig
from ..ops.sampling import seed_fixes_text
from .draft_length import DraftLength, draft_length
from .policy import Policy, Tuning
from ..state import PairState

SAMPLED_PRIOR = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)  # where calibrate() measures


class Learning:
    """The draft policy of one pair, fed by and feeding its stored state.

    Args:
        state: the pair's records.
        model_free: the draft is an n-gram lookup (it costs nothing).
        passes: how the target's forward is cut into passes (several slots: see
            :class:`~specgguf.engine.costs.Costs`).
        k_max: the longest draft it considers (a lookup alone: LOOKUP_K_MAX).
        tuning: the policies' numbers (the simulator tries others).
    """

    def __init__(self, state: PairState, model_free: bool = False, passes=None, k_max: int = AUTO_K_MAX,
                 tuning: Tuning = Tuning()) -> None:
        self.state = state
        costs = state.costs()
        self.online = Policy(k_max, passes, free_draft=model_free, tuning=tuning, costs=costs)
        self.lookup = Policy(LOOKUP_K_MAX, passes, free_draft=True, tuning=tuning, costs=costs)  # before a model
        self.measured = state.acceptance()

    def prior(self, config: GenerationConfig) -> Optional[float]:
        """calibrate()'s measured acceptance where it applies to ``config``:
        greedy agreement for greedy runs; the sampled figure only at the
        settings it was measured at, with exact verification."""
        if not self.measured:
            return None
        if config.greedy:
            return self.measured.get("greedy")
        same = all(abs(getattr(config, k) - v) < 1e-9 for k, v in SAMPLED_PRIOR.items())
        return self.measured.get("sampled") if same and config.verification == "exact" else None

    def length(self, config: GenerationConfig) -> DraftLength:
        """The K object for a run with ``config``: its fixed K, or for
        k="auto" the policy, its regime readied (:meth:`ready`). While the
        policy has seen too little of the draft in this process, the run's
        rounds measure the draft on its prompt (:func:`~specgguf.engine.rounds.to_measure`),
        whatever was stored: a record is a prior, never a verdict."""
        length = draft_length(config.k, lambda: self._own(self.online, config))
        self.ready(length, config)
        return length

    @staticmethod
    def _own(policy: Policy, config: GenerationConfig) -> Policy:
        """``policy``, or for a run the clock must not change a blind one of its own."""
        return policy.blind() if clock_blind(config) else policy

    def ready(self, length: DraftLength, config: GenerationConfig) -> None:
        """On ``config``'s regime's first use in a policy: what was known
        before, calibrate()'s measurement where it applies and stored evidence
        (a fixed K takes none)."""
        length.begin(config.regime, self.prior(config), self.state.evidence(config.regime))

    def lookup_length(self, config: GenerationConfig) -> DraftLength:
        """The own K object of an n-gram lookup tried before the draft model:
        the run's fixed K, or for k="auto" the lookup's policy; never stored:
        what a lookup accepts is about the text, not the pair."""
        return draft_length(config.k, lambda: self._own(self.lookup, config))

    def finish(self, length: DraftLength, config: GenerationConfig) -> None:
        """After a run: store what ``length`` learned of the draft in the run's
        regime, and what the pair's rounds timed, for later processes (a fixed K and
        clock-blind runs write nothing)."""
        self.keep(config.regime, length.record(config.regime))
        if length is self.online:
            self.keep_costs()

    def keep_costs(self) -> None:
        """Store what the pair's policies timed of the forwards (:meth:`~specgguf.engine.policy.Policy.cost_record`;
        the lookup's rounds time the target's long batches, the model's its short ones). The caller
        holds whatever lock guards the policies (the engine's, beside its rounds)."""
        records = (policy.cost_record() for policy in (self.lookup, self.online))
        self.state.save_costs(*(r for r in records if r is not None))  # one read and write of the file

    def keep(self, regime: str, record: Optional[dict]) -> None:
        """Store ``record`` (:meth:`~specgguf.engine.policy.Policy.record`) as ``regime``'s evidence."""
        if record is not None:
            self.state.save_evidence(regime, record)

    def calibrated(self, acceptance: Optional[dict]) -> None:
        """Store calibrate()'s measured acceptance; regimes first used from now on start from it."""
        if acceptance is not None:
            self.measured = acceptance
            self.state.save_acceptance(acceptance)
            self.online.forget()  # every regime starts again from the measurement


def clock_blind(config: GenerationConfig) -> bool:
    """Exact p/q sampling with a seed: the clock must not change the output."""
    return seed_fixes_text(config.verification, config.seed)
