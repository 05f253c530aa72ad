"""One round over one or several sequences: the loop every path runs.

:class:`~specgguf.engine.decoder.SpeculativeDecoder` plays it over one
sequence, inline; the :class:`~specgguf.engine.batch.Engine` over every
request in its slots, in a thread of its own. One round, read top to bottom
in :meth:`Rounds.play`:

1. each sequence's turn (:func:`~specgguf.engine.lookup_first.choose_turns`):
   its lookup's, when that has a long enough match and its K is not 0, else
   the draft's with its K object's K (a lookup's shorter match where that is
   0); none while the target has the prompt to read (``plain_first``: the
   first token comes at once). A prompt read while the policy knows too
   little of the draft also measures the draft on it (:func:`to_measure`);
   before a long catch-up is first priced, a few draft batches are timed
   (:meth:`Rounds._time_batches`);
2. the drafter proposes for every drafting sequence at once (a GGUF model:
   one batched forward per draft position, the first also catching each one
   up), each lookup for its own;
3. the target scores every sequence's ``[last token, d_1 .. d_K]`` in one call;
4. each sequence verifies with its own :class:`~specgguf.ops.sampling.Sampler`
   and hands out its tokens; its K objects hear how the round went.

The models are reached through two small protocols. The target: ``lag(seq,
slot, n_logits=1)`` (tokens of ``seq`` its cache lacks, at least the last)
and ``eval_many([(slot, seq, n_logits, proposed)]) -> [[n_logits, V]]``
(:class:`~specgguf.llama.model.LlamaModel`; rows are logits, warped here by
each sequence's sampler, unless the target says ``warped = True``: the
decoder's ``target_step``). The drafter: ``lag(context, slot)`` and
``propose([Ask]) -> (drafts, forwards)``, and for measuring prompts
``agreement`` (:class:`~specgguf.llama.adapter.SlotDrafter`;
:class:`~specgguf.ops.drafter.EachDrafter` for any one-sequence drafter).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..ops.drafter import Ask, Draft, prompt_rows
from ..ops.sampling import Sampler
from .costs import Measured
from .stats import DecoderStats, hand_out
from .draft_length import DraftLength
from .lookup_first import LookupFirst, Turn, choose_turns, tell
from .policy import SlotView


class Request:
    """One sequence's state across rounds: its tokens so far, its rules and
    budget, its K objects and its counts (``stats``).

    Args:
        ids: the prompt's token ids (emitted tokens are appended).
        budget: tokens it may emit; ``stops``: token ids that end it.
        sampler: its verification rule; ``regime``: the name its acceptance is pooled under.
        length: its K object (:mod:`~specgguf.engine.draft_length`); ``lookup_length``:
            its lookup's (None: no lookup).
        p_min: draft confidence cutoff: None, a float, or ``"auto"`` (its K object's).
        plain_first: no draft while the target has the prompt to read, nor in its first round.
        put: called with each emitted token.
    """

    def __init__(self, ids: Sequence[int], budget: int, stops: FrozenSet[int], sampler: Sampler, regime: str,
                 length: DraftLength, lookup_length: Optional[DraftLength] = None, p_min=None,
                 plain_first: bool = True, put: Callable[[int], None] = lambda t: None) -> None:
        self.ids, self.budget, self.stops, self.sampler = list(ids), budget, stops, sampler
        self.regime, self.length, self.lookup_length, self.p_min = regime, length, lookup_length, p_min
        self.plain_first, self.put = plain_first, put
        self.stats = DecoderStats()
        self.after_miss = False  # its last round rejected a draft token
        self.slot = 0

    def view(self, target, drafter) -> SlotView:
        """What the K objects see of it this round: it drafts up to its K
        object's ``k_max`` within what it may still emit, less the round's own
        token (a fixed K: exactly that, as ``fixed`` tells a policy); none
        without a drafter or while ``plain_first`` holds."""
        t_lag, remaining = target.lag(self.ids, self.slot), self.budget - self.stats.emitted
        first = self.plain_first and (t_lag > 1 or self.stats.rounds == 0)
        cap = 0 if drafter is None or first else min(self.length.k_max, remaining - 1)
        d_lag = 0 if drafter is None else self.length.draft_lag(lambda: drafter.lag(self.ids, self.slot))
        return SlotView(self.regime, max(0, cap), self.length.fixed, t_lag, d_lag, remaining, self.after_miss,
                        self.slot, self.stats.emitted)

    def emit(self, tokens: Sequence[int], n_draft: int, source: int) -> bool:
        """Hand out a round's ``tokens`` (the first ``n_draft`` accepted drafts,
        from ``source``); True when the request is done."""
        for t in hand_out(self.stats, tokens, n_draft, source, self.stops, self.budget):
            self.ids.append(t)
            self.put(t)
        return self.stats.finish_reason is not None


class Rounds:
    """Plays rounds over requests with one target, one drafter and a lookup per slot.

    Args:
        target: the target (module docstring's protocol).
        drafter: the batched drafter, or None (plain decoding).
        lookups: per slot, a lookup tried before the drafter
            (:class:`~specgguf.ops.suffix.SuffixDrafter`), or None.
        listeners: K objects that hear every round's costs besides the requests'
            (the engine's policies learn from fixed-K requests' rounds too).
    """

    def __init__(self, target, drafter=None, lookups: Optional[Sequence] = None,
                 listeners: Sequence[DraftLength] = ()) -> None:
        self.target, self.drafter, self.lookups, self.listeners = target, drafter, lookups, list(listeners)
        self.warp = not getattr(target, "warped", False)

    def play(self, reqs: Sequence[Request], lock=None) -> List[Tuple[Request, Optional[BaseException]]]:
        """One round for ``reqs``; ``lock`` is held while K objects are read or
        told (they may be shared with other threads). Returns the requests
        that ended, each with None or the error that ended it (its own rules:
        a grammar with no way on). The models' errors propagate."""
        lock = nullcontext() if lock is None else lock
        views = [r.view(self.target, self.drafter) for r in reqs]
        with lock:
            views = self._time_batches(reqs, views)
            turns = choose_turns([r.ids for r in reqs], views, self.drafter, [r.length for r in reqs],
                                 [self._lookup(r) for r in reqs])
            cutoffs = [t.length.p_min(r.regime) if r.p_min == "auto" else r.p_min for r, t in zip(reqs, turns)]
            measure = to_measure(reqs, views) if hasattr(self.drafter, "agreement") else {}
        t0 = time.perf_counter()
        drafts, forwards = self._draft(reqs, turns, cutoffs)
        t1 = time.perf_counter()
        logits = self.target.eval_many([(r.slot, r.ids + d.tokens, len(d.tokens) + 1 + measure.get(i, 0),
                                         len(d.tokens)) for i, (r, d) in enumerate(zip(reqs, drafts))])
        t2 = time.perf_counter()
        found = self._measure(reqs, logits, measure, forwards)
        ended, accepted = [], []
        with lock:
            for i, (r, turn, d, rows) in enumerate(zip(reqs, turns, drafts, logits)):
                if found.get(i) is not None:
                    r.length.measured(r.regime, *found[i])
                got = self._verify(r, d, rows[measure.get(i, 0):], (t1 - t0, t2 - t1), turn)
                accepted.append(None if isinstance(got, ValueError) else got[0])
                if isinstance(got, ValueError):
                    ended.append((r, got))
                elif r.emit(d.tokens[:got[0]] + [got[1]], got[0], turn.source):
                    ended.append((r, None))
                    r.length.ended(r.stats.emitted, r.stats.finish_reason == "length")
            drafted = sum(len(d.tokens) for d in drafts)
            rest = (time.perf_counter() - t0) - (t2 - t1) - sum(f[1] for f in forwards)
            m = Measured(sum(v.target_lag for v in views) + drafted, t2 - t1, forwards, drafted + len(drafts), rest)
            lookups = [r.lookup_length for r in reqs if r.lookup_length is not None]
            tell(turns, drafts, accepted, m, lookups + self.listeners)
        return ended

    def _time_batches(self, reqs: Sequence[Request], views: List[SlotView]) -> List[SlotView]:
        """Before a long prompt's catch-up is first priced, a few of the draft's
        batches timed on its head (:meth:`~specgguf.engine.policy.Policy.batches_to_time`),
        which the draft keeps; the views as they are then."""
        for i, (r, v) in enumerate(zip(reqs, views)):
            counts = r.length.batches_to_time(v) if hasattr(self.drafter, "read_head") else ()
            if counts:
                t0 = time.perf_counter()
                r.length.timed_draft(self.drafter.read_head(r.slot, r.ids, counts, r.sampler))
                r.stats.measure_seconds += time.perf_counter() - t0
                views[i] = r.view(self.target, self.drafter)
        return views

    def _lookup(self, r: Request) -> Optional[LookupFirst]:
        if self.lookups is None or r.lookup_length is None:
            return None
        return LookupFirst(self.lookups[r.slot], r.lookup_length)

    def _draft(self, reqs: Sequence[Request], turns: Sequence[Turn], cutoffs: list) -> tuple:
        """Each request's :class:`~specgguf.ops.drafter.Draft` of up to its
        turn's K (the drafter's together, each lookup's alone) and the draft
        forwards run, ``[(tokens, seconds, sequences)]``."""
        drafts: List[Draft] = [Draft(forwards=[]) for _ in reqs]
        forwards: list = []
        model = [i for i, t in enumerate(turns) if t.k > 0 and t.drafter is self.drafter]
        if model:
            asks = [Ask(reqs[i].slot, reqs[i].ids, reqs[i].sampler, turns[i].k, cutoffs[i], turns[i].view.draft_lag)
                    for i in model]
            got, forwards = self.drafter.propose(asks)
            for i, d in zip(model, got):
                drafts[i] = d
        for i, t in enumerate(turns):
            if t.k > 0 and t.drafter is not self.drafter:
                drafts[i] = t.drafter.propose(reqs[i].ids, t.k, cutoffs[i])
        for d, t, r in zip(drafts, turns, reqs):
            check_draft(d, t.k, r.sampler.rule)
        return drafts, forwards

    def _verify(self, r: Request, d: Draft, rows: np.ndarray, seconds: Tuple[float, float], turn: Turn):
        """``r``'s verdict on its draft, ``(accepted, next token)``, counted in
        its stats; or the ValueError its own rules raised."""
        t0 = time.perf_counter()
        try:
            if self.warp:
                rows = r.sampler.target_rows(rows, r.ids + d.tokens)
            t1 = time.perf_counter()
            n, nxt = r.sampler.verify(rows, d, r.stats.emitted)
        except ValueError as e:
            return e
        r.stats.warp_seconds += t1 - t0
        r.stats.verify_seconds += time.perf_counter() - t1
        capped = turn.k == turn.view.cap < turn.length.k_max  # the tokens left, not the drafter, ended it
        stop = None if turn.k == 0 else "max_new" if capped and d.stop == "max" else d.stop
        r.stats.record(len(d.tokens), n, stop, seconds=seconds)
        r.after_miss = n < len(d.tokens)
        return n, nxt

    def _measure(self, reqs: Sequence[Request], logits: list, measure: Dict[int, int], forwards: list) -> dict:
        """The draft's acceptance on each measured prompt (``{index: (acceptance,
        positions) or None}``, :func:`~specgguf.llama.adapter.text_agreement`):
        the draft catches up on it, scoring the positions the target's first
        rows did; the catch-up counts among the round's forwards."""
        if not measure:
            return {}
        got, forward = self.drafter.agreement([(reqs[i].slot, reqs[i].ids, reqs[i].sampler, logits[i][:n])
                                               for i, n in measure.items()])
        forwards.append(forward)
        for i in measure:
            reqs[i].stats.measure_seconds += forward[1] / len(measure)
        return dict(zip(measure, got))


def one_sequence(rounds: Rounds, req: Request) -> Iterator[int]:
    """The rounds of one request, inline: each round's tokens as it ends
    (the request's ``put`` is replaced). A request's own error (a grammar with
    no way on) raises here, after the tokens before it."""
    out: List[int] = []
    req.put = out.append
    if req.budget == 0:
        req.stats.finish_reason = "length"
    while req.stats.finish_reason is None:
        ended = rounds.play([req])
        yield from out
        out.clear()
        for _, error in ended:
            if error is not None:
                raise error


def check_draft(draft: Draft, k: int, rule: str) -> None:
    """A drafter's answer is usable: at most ``k`` tokens, and for exact
    sampling (``rule`` "exact") a ``[n, V]`` distribution unless one-hot."""
    if len(draft.tokens) > k:
        raise ValueError(f"the drafter returned {len(draft.tokens)} tokens, more than the k = {k} asked for")
    if rule == "exact" and draft.tokens and not draft.onehot:
        if draft.probs is None:
            raise ValueError("draft_step returned probs=None; sampling (greedy=False) needs "
                             "the draft's [k, V] distribution")
        if np.ndim(draft.probs) != 2 or np.shape(draft.probs)[0] != len(draft.tokens):
            raise ValueError(f"draft_step returned probs of shape {np.shape(draft.probs)}; "
                             f"expected ({len(draft.tokens)}, V) for {len(draft.tokens)} tokens")


def to_measure(reqs: Sequence[Request], views: Sequence[SlotView]) -> Dict[int, int]:
    """``{index: positions}``: the requests whose prompt round also measures
    the draft on the prompt (:func:`~specgguf.ops.drafter.prompt_rows`):
    one per regime its policy has seen too little of in this process and
    where drafting could pay beside the others (:meth:`~specgguf.engine.policy.Policy.worth_measuring`).
    A stored record is a prior; a probe into a poor draft pays its whole
    catch-up to learn three tokens."""
    out, regimes = {}, set()
    for i, (r, v) in enumerate(zip(reqs, views)):
        if v.target_lag > 1 and r.regime not in regimes and r.length.worth_measuring(v, views[:i] + views[i + 1:]):
            n = prompt_rows(r.ids, v.target_lag)
            if n:
                out[i] = n
                regimes.add(r.regime)
    return out
