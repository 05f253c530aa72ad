"""Whose turn a round is, and telling its K object how the round went.

With a lookup in front of the draft model (the default:
:class:`~specgguf.ops.suffix.SuffixDrafter`; ``DraftModel(ngram=True)``:
:class:`~specgguf.ops.ngram.NgramDrafter`) a round drafts from the lookup
when the text so far has a match and the lookup's K is not 0; otherwise the
draft model's K decides. The two
differ in everything a policy weighs: a lookup costs microseconds and never
lags, and its acceptance follows how much the text copies; the model pays a
forward per token and catches up on whatever the lookup drafted. Pooled in
one policy, the lookup's cheap rounds priced the model's K too low, the
acceptance followed the copies, and a run stored that mixture as the
model's evidence for every later run of the pair.

So each drafter has its own K object
(:mod:`~specgguf.engine.draft_length`): a fixed K, or its own
:class:`~specgguf.engine.policy.Policy` (the lookup's prices drafting at
nothing). A plain round is reported to both, as both weigh plain decoding;
only the model's evidence is stored (the lookup's acceptance is about this
text, not the pair). Used by the decoder and by
:class:`~specgguf.api.draft_model.DraftModel`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from ..ops.drafter import Draft, Drafter
from .draft_length import DraftLength
from .costs import Measured
from .policy import SlotView

# Where an emitted token came from (DecoderStats.emit; the API names them decoder.SOURCES).
FROM_TARGET, FROM_DRAFT, FROM_LOOKUP = 0, 1, 2


@dataclass
class Turn:
    """Who drafts the next round, and how many tokens (0: a plain round)."""

    drafter: Drafter
    length: DraftLength  # the K object that chose k and hears how the round went
    k: int
    view: SlotView            # what the policy was shown of the sequence

    @property
    def source(self) -> int:
        """What its accepted tokens count as (:meth:`~specgguf.engine.decoder.DecoderStats.emit`)."""
        return FROM_LOOKUP if getattr(self.drafter, "model_free", False) else FROM_DRAFT


def lookup_view(view: SlotView, k_max: int) -> SlotView:
    """A sequence as the lookup's policy sees it: nothing for the lookup to
    catch up on, and the lookup's own bound ``k_max`` (LOOKUP_K_MAX, or a
    fixed K) within what is left to generate."""
    return replace(view, draft_lag=0, cap=k_max if view.remaining is None else min(k_max, view.remaining - 1))


@dataclass
class LookupFirst:
    """An n-gram lookup and its own K object."""

    lookup: Drafter
    length: DraftLength

    def turn(self, context: Sequence[int], view: SlotView) -> Optional[Turn]:
        """The lookup's turn if it has a match for ``context`` and its K is not 0; None otherwise."""
        if not self.lookup.propose(context, 1).tokens:
            return None
        view = lookup_view(view, self.length.k_max)
        k = self.length.choose([view])[0]
        return Turn(self.lookup, self.length, k, view) if k > 0 else None


def next_turn(context: Sequence[int], view: SlotView, drafter: Drafter, length: DraftLength,
              lookup: Optional[LookupFirst]) -> Turn:
    """The next round's :class:`Turn` for a sequence the K objects see as
    ``view``: the lookup's, if it takes one, else the model ``drafter``'s
    with ``length``'s K (within ``view.cap``)."""
    turn = lookup.turn(context, view) if lookup is not None and view.cap > 0 else None
    if turn is not None:
        return turn
    return Turn(drafter, length, length.choose([view])[0] if view.cap > 0 else 0, view)


def measured(turn: Turn, draft: Draft, draft_seconds: float, target_seconds: float, round_seconds: float) -> Measured:
    """What a round took, for the policies: the target's forward over its
    tokens, each draft forward (a drafter that did not time its forwards:
    its time shared among them, the first over the draft's lag), and the rest."""
    n = len(draft.tokens)
    forwards = draft.forwards
    if forwards is None:
        forwards = [(max(1, turn.view.draft_lag) if i == 0 else 1, draft_seconds / n) for i in range(n)]
    spent = sum(s for _, s in forwards)
    return Measured(turn.view.target_lag + n, target_seconds, [(t, s, 1) for t, s in forwards], n + 1,
                    max(0.0, round_seconds - target_seconds - spent))


def report(turn: Turn, lookup: Optional[LookupFirst], draft: Draft, accepted: int,
           m: Optional[Measured]) -> None:
    """How ``turn``'s round went, to the K object that chose it (its verdict,
    the draft's read-back of tokens it caught up on, the round's costs; ``m``
    None: untimed); the model's rounds and plain ones also to the lookup's: it
    times the target's forwards from them (when the model drafts every round,
    the lookup's policy heard no forward and never drafted), and counts them
    as rounds it did not draft."""
    view, n, length = turn.view, len(draft.tokens), turn.length
    if draft.catchup:
        length.read_back(view.regime, float(draft.catchup[0]), int(draft.catchup[1]))
    length.observe(view.regime, n, accepted, view.after_miss)
    length.round_done([view], [n], m)
    if lookup is not None and lookup.length is not length:
        lookup.length.round_done([view], [0], m)
