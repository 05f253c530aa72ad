"""A prompt lookup tried before the draft model, each judged on its own rounds.

With ``ngram=True`` a round drafts from an n-gram lookup
(:class:`~specgguf.ops.ngram.NgramDrafter`) when the text so far has a match
and the lookup's K is not 0; otherwise the draft model's K decides. The two
differ in everything a policy weighs: a lookup costs microseconds and never
lags, and its acceptance follows how much the text copies; the model pays a
forward per token and catches up on whatever the lookup drafted. Pooled in
one policy (as a single fallback drafter had them), the lookup's cheap rounds
priced the model's K too low, the acceptance followed the copies, and a run
stored that mixture as the model's evidence for every later run of the pair.

So each drafter has its own K: a fixed one, or its own
:class:`~specgguf.engine.policy.DraftPolicy`. A plain round times plain
decoding for both policies, and the model's asks for them (the lookup's
does not re-time: a plain round it asked for while the model drafted would
come only at the model's next one); only the model's is stored (the
lookup's acceptance is about this text, not about the pair). Used by the decoder and
by :class:`~specgguf.draft_model.DraftModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..ops.drafter import Drafter
from .policy import DraftPolicy


@dataclass
class Turn:
    """Who drafts the next round, and how many tokens (0: a plain round)."""

    drafter: Drafter
    policy: Optional[DraftPolicy]  # the one that chose k and hears how the round went; None: a fixed k
    k: int


@dataclass
class LookupFirst:
    """An n-gram lookup and its own K (``policy``, or the fixed ``k`` when None)."""

    lookup: Drafter
    policy: Optional[DraftPolicy]
    k: int = 0

    def turn(self, context: Sequence[int], remaining: Optional[int]) -> Optional[Turn]:
        """The lookup's turn if it has a match for ``context`` and its K is not 0; None otherwise."""
        if not self.lookup.propose(context, 1).tokens:
            return None
        k = self.policy.choose(remaining, 0) if self.policy is not None else self.k
        return Turn(self.lookup, self.policy, k) if k > 0 else None


def next_turn(context: Sequence[int], remaining: Optional[int], drafter: Drafter,
              policy: Optional[DraftPolicy], k: int, lookup: Optional[LookupFirst]) -> Turn:
    """The next round's :class:`Turn`: the lookup's, if it takes one, else
    the model ``drafter``'s with ``policy``'s K (or the fixed ``k``)."""
    turn = lookup.turn(context, remaining) if lookup is not None else None
    if turn is not None:
        return turn
    return Turn(drafter, policy, policy.choose(remaining, drafter.lag(context)) if policy is not None else k)


def report(turn: Turn, lookup: Optional[LookupFirst], drafted: int, accepted: int,
           confidence: Optional[Sequence[float]] = None, seconds: Optional[float] = None,
           first_seconds: Optional[float] = None, catchup: Optional[tuple] = None) -> None:
    """How ``turn``'s round went, to the policy that chose it (see
    :meth:`DraftPolicy.update`); a plain round also to the lookup's, which
    needs plain decoding's time as much as the model's does."""
    if turn.policy is not None:
        turn.policy.update(drafted, accepted, confidence, seconds, first_seconds, catchup)
    if drafted == 0 and lookup is not None and lookup.policy is not None and lookup.policy is not turn.policy:
        lookup.policy.update(0, 0, None, seconds)
