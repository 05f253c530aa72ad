"""Whose turn a round is, and telling its K object how the round went.

With a lookup in front of the draft model (the default:
:class:`~specgguf.ops.suffix.SuffixDrafter`; ``DraftModel(ngram=True)``:
:class:`~specgguf.ops.ngram.NgramDrafter`) a round drafts from the lookup
when the text so far has a match of STRONG tokens or more and the lookup's K
is not 0; otherwise the draft model's K decides, and where that is 0 a
shorter match drafts. The two
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
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..ops.drafter import Draft, Drafter, timed_forwards
from .draft_length import DraftLength
from .costs import Measured
from .policy import SlotView

# Where an emitted token came from (DecoderStats.emit; the API names them stats.SOURCES).
FROM_TARGET, FROM_DRAFT, FROM_LOOKUP = 0, 1, 2
# A lookup whose match is this many tokens or more drafts before the model; a shorter one only
# where the model would not draft (on chat, 2-3 token matches of common phrases took rounds the
# model drafts better; on a first code edit, where the model sits out, the lookup drafts them).
STRONG = 4
REACH = 2  # a match of n tokens drafts at most REACH * n (a common phrase on chat offered 32 tokens)


@dataclass
class Turn:
    """Who drafts the next round, and how many tokens (0: a plain round)."""

    drafter: Drafter
    length: DraftLength  # the K object that chose k and hears how the round went
    k: int
    view: SlotView            # what the policy was shown of the sequence

    @property
    def source(self) -> int:
        """What its accepted tokens count as (:meth:`~specgguf.engine.stats.DecoderStats.emit`)."""
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

    def available(self, context: Sequence[int], view: SlotView) -> Tuple[int, bool]:
        """Tokens the lookup has to draft after ``context`` (0: no match), up to
        what its K object may ask of ``view``'s sequence, and whether its match
        is STRONG (a lookup that does not say how long its match is: it is)."""
        cap = lookup_view(view, self.length.k_max).cap
        if cap <= 0:
            return 0, False
        n = len(self.lookup.propose(context, cap).tokens)
        matched = getattr(self.lookup, "matched", STRONG)
        return min(n, REACH * matched), matched >= STRONG


def choose_turns(contexts: Sequence[Sequence[int]], views: Sequence[SlotView], drafter: Drafter,
                 lengths: Sequence[DraftLength], lookups: Sequence[Optional[LookupFirst]]) -> List[Turn]:
    """Each sequence's :class:`Turn` this round: its lookup's (``lookups[i]``)
    if that has a STRONG match for ``contexts[i]`` and its K object gives K > 0,
    else ``drafter``'s with ``lengths[i]``'s K (within ``views[i].cap``), or
    where that is 0, the lookup's on a shorter match (its acceptance kept
    apart, as regime ``+ " short"``). Each K
    object is asked once and shown the round's whole batch (a policy prices
    it: with a KV stream per slot, a longer draft can cost another pass): a
    lookup's, the sequences it has no match for as plain; the model's, those
    a lookup drafts for too, and it is not asked when the lookups draft for
    every one of its sequences."""
    turns: List[Optional[Turn]] = [None] * len(views)
    got = [(0, False) if look is None or v.cap <= 0 else look.available(c, v)
           for c, v, look in zip(contexts, views, lookups)]
    have, weak = [n for n, _ in got], {}
    found = [i for i, n in enumerate(have) if n]
    for length, idx in _grouped(found, [lookups[i].length for i in found]):
        # Priced in the whole round: the others as plain, so a lookup's draft that costs the
        # target another pass over the weights (a KV stream per slot) is seen to; a K past
        # what the lookup has would draft no more (and a policy weighing 32 Ks per sequence
        # takes a millisecond of a 35 ms round).
        matched = set(idx)
        mine = [replace(lookup_view(v, length.k_max), regime=v.regime + ("" if got[i][1] else " short"))
                if i in matched else replace(v, cap=0, fixed=True) for i, v in enumerate(views)]
        asked = [replace(v, cap=min(v.cap, have[i])) if i in matched else v
                 for i, v in enumerate(mine)]
        for i, k in enumerate(length.choose(asked)):
            if i in matched and k > 0:  # a short match's turn waits for the model's K
                (turns if got[i][1] else weak)[i] = Turn(lookups[i].lookup, length, k, mine[i])
    for length, idx in _grouped(range(len(views)), lengths):
        if all(turns[i] is not None for i in idx):
            continue  # every one of them drafts from its lookup: this K object is not asked
        # Priced over every sequence of the round, those the lookup drafts for too: they are in
        # its batch whoever drafts for them, and a policy shown only the rest would price the
        # round as a smaller one (and a lone sequence's retries would fire inside a full batch).
        for i, k in zip(idx, length.choose([views[i] for i in idx])):
            k = k if views[i].cap > 0 else 0
            if turns[i] is None:
                turns[i] = weak[i] if k == 0 and i in weak else Turn(drafter, length, k, views[i])
    return turns


def _grouped(idx: Sequence[int], objects: Sequence[object]) -> List[Tuple[object, List[int]]]:
    """``idx`` grouped by the object each has (by identity), in first-seen order."""
    groups: Dict[int, Tuple[object, List[int]]] = {}
    for i, o in zip(idx, objects):
        groups.setdefault(id(o), (o, []))[1].append(i)
    return list(groups.values())


def next_turn(context: Sequence[int], view: SlotView, drafter: Drafter, length: DraftLength,
              lookup: Optional[LookupFirst]) -> Turn:
    """:func:`choose_turns` for one sequence."""
    return choose_turns([context], [view], drafter, [length], [lookup])[0]


def measured(turn: Turn, draft: Draft, draft_seconds: float, target_seconds: float, round_seconds: float) -> Measured:
    """What one sequence's round took, for the policies: the target's forward
    over its tokens, each draft forward (:func:`~specgguf.ops.drafter.timed_forwards`),
    and the rest."""
    n = len(draft.tokens)
    forwards = timed_forwards(draft, turn.view.draft_lag, draft_seconds)
    spent = sum(s for _, s in forwards)
    return Measured(turn.view.target_lag + n, target_seconds, [(t, s, 1) for t, s in forwards], n + 1,
                    max(0.0, round_seconds - target_seconds - spent))


def tell(turns: Sequence[Turn], drafts: Sequence[Draft], accepted: Sequence[Optional[int]],
         m: Optional[Measured], lengths: Iterable[DraftLength] = ()) -> None:
    """How a round went, to the K objects: each sequence's verdict
    (``accepted[i]``; None: it failed, no verdict) and its draft's read-back
    of tokens it caught up on to the K object that chose its turn; the
    round's costs (``m``; None: untimed) to every K object in a turn or in
    ``lengths`` (a lookup's that did not draft: it times the target's
    forwards from the model's rounds and plain ones, and counts them as
    rounds it did not draft), each with the tokens it drafted."""
    for t, d, n in zip(turns, drafts, accepted):
        if n is None:
            continue
        if d.catchup:
            t.length.read_back(t.view.regime, float(d.catchup[0]), int(d.catchup[1]))
        t.length.observe(t.view.regime, len(d.tokens), n, t.view.after_miss)
    views, every = [t.view for t in turns], {}
    for length in [t.length for t in turns] + list(lengths):
        every.setdefault(id(length), length)
    for length in every.values():
        length.round_done(views, [len(d.tokens) if t.length is length else 0 for t, d in zip(turns, drafts)], m)


def report(turn: Turn, lookup: Optional[LookupFirst], draft: Draft, accepted: int,
           m: Optional[Measured]) -> None:
    """:func:`tell` for one sequence's round (``lookup``: its lookup, if any)."""
    tell([turn], [draft], [accepted], m, [lookup.length] if lookup is not None else [])
