"""Rounds over several sequences at once: what lets one pair serve several users.

Each request gets a slot: one sequence id in both models' KV caches (see
:class:`~specgguf.llama.model.LlamaModel`'s ``slots``). A slot keeps its
tokens after its request ends, so a conversation's next turn, given the
slot that shares the longest prefix with it, is not evaluated again.

One round serves every slot, read top to bottom in :meth:`Engine._round`:

1. K per slot from the :class:`~specgguf.engine.policy.Policy` (0 for a
   slot whose target has a prompt to read: its first token comes at once,
   and while the policy has seen too little of the draft in its regime,
   both models score the prompt's last positions to measure it, as the
   decoder's first run does);
2. the draft proposes for every drafting slot, one batched forward per
   draft position (the first also catches each slot up), a slot stopping
   where its draft's confidence falls below its ``p_min``;
3. the target scores every slot's ``[last token, d_1 .. d_K]`` in ONE
   ``llama_decode`` (more only past the batch-invariance bound, 64 tokens:
   :func:`~specgguf.llama.model.forwards`), logits only at those rows;
4. each slot verifies with its own :class:`~specgguf.ops.sampling.Sampler`
   (greedy, exact p/q, or the drafter-invariant race with its own seed).

A sequence's logits do not depend on what else is in the batch: each
round's forwards stay under llama.cpp's batch-invariance bound (see
:mod:`specgguf.llama.invariance`), where every row is computed as a
one-token forward computes it. So every request's output is what it gets
alone, bit for bit: greedy and seeded drafter-invariant text token for
token; exact p/q sampling keeps the target's law. Requests join and leave between
rounds; a cancelled request (a closed stream, a disconnected client) frees
its slot at the next round.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Deque, FrozenSet, List, Optional, Sequence

import numpy as np

from .decoder import DecoderStats, hand_out
from .draft_length import DraftLength, draft_length
from .lookup_first import FROM_DRAFT, FROM_LOOKUP, lookup_view
from .costs import Measured
from .policy import Policy, SlotView
from ..ops.drafter import Draft, common_prefix
from ..llama.adapter import SlotDrafter, prompt_rows
from ..llama.model import LlamaModel
from ..ops.sampling import Sampler

_END = object()


class Ticket:
    """One request's progress through the engine, and its caller's view of it.

    Iterating yields the generated token ids as rounds produce them (as
    :meth:`~specgguf.engine.decoder.SpeculativeDecoder.stream` does); leaving the
    loop early or :meth:`close` cancels the request. ``stats`` holds its
    :class:`~specgguf.engine.decoder.DecoderStats`; ``sampler`` its rule;
    ``length`` its K object (a fixed K, or the engine's policy).
    """

    def __init__(self, ids: Sequence[int], budget: int, stops: FrozenSet[int], sampler: Sampler,
                 regime: str, length: DraftLength, wake, p_min=None) -> None:
        self.ids, self.budget, self.stops, self.sampler = list(ids), budget, stops, sampler
        self.regime, self.length, self.p_min, self._wake = regime, length, p_min, wake
        self.stats = DecoderStats()
        self.queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self.cancelled = False
        self.after_miss = False
        self.slot: Optional[int] = None
        self.cached = 0  # prompt tokens its slot held already (evaluated for an earlier request)

    def __iter__(self):
        try:
            while True:
                item = self.queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Cancel the request (nothing happens if it has finished)."""
        if not self.cancelled:
            self.cancelled = True
            self._wake()

    # -- the engine's side --------------------------------------------------
    def view(self, target: LlamaModel, draft: Optional[LlamaModel], can: bool) -> SlotView:
        """What the policy needs of the request this round: it drafts up to its
        K object's ``k_max`` (a fixed K: exactly that, as ``fixed`` tells the
        policy), none while its prompt is read or when nothing can draft (``can``)."""
        t_lag, remaining = target.lag(self.ids, self.slot), self.budget - self.stats.emitted
        cap = 0 if t_lag > 1 or not can else min(self.length.k_max, remaining - 1)
        d_lag = draft.lag(self.ids, self.slot) if draft is not None else 0
        return SlotView(self.regime, max(0, cap), not self.length.auto, t_lag, d_lag, remaining, self.after_miss,
                        self.slot)

    def emit(self, tokens: Sequence[int], n_draft: int, source: int = FROM_DRAFT) -> bool:
        """Hand ``tokens`` (the first ``n_draft`` accepted drafts, from ``source``:
        FROM_DRAFT or FROM_LOOKUP) to the caller; True when the request is done."""
        for t in hand_out(self.stats, tokens, n_draft, source, self.stops, self.budget):
            self.ids.append(t)
            self.queue.put(t)
        return self.stats.finish_reason is not None


class Slots:
    """Which request runs in which slot, and the requests waiting for one.

    Not locked itself: the :class:`Engine` calls it under its condition.

    Args:
        target: the target's :class:`LlamaModel`; its slot count, and its
            caches, which decide where a waiting request goes.
    """

    RUN_TOKENS = 256  # a run's pass (about a target token's time, every round) against prompt tokens kept

    def __init__(self, target: LlamaModel) -> None:
        self.target = target
        self.split = not target.unified  # a KV stream per slot: each run of busy slots is a pass
        self.running: List[Optional[Ticket]] = [None] * target.slots
        self.waiting: Deque[Ticket] = deque()

    def add(self, t: Ticket) -> None:
        """Queue ``t`` for the next free slot (:meth:`update`)."""
        self.waiting.append(t)

    def busy(self) -> int:
        """Requests running or waiting."""
        return len(self.waiting) + sum(t is not None for t in self.running)

    def active(self) -> List[Ticket]:
        return [t for t in self.running if t is not None]

    def holds(self, t: Ticket) -> bool:
        return t.slot is not None and self.running[t.slot] is t

    def free(self, t: Ticket, last) -> None:
        """End ``t`` with ``last`` (the end marker or an error) and free its slot."""
        if self.holds(t):
            self.running[t.slot] = None
        t.queue.put(last)

    def update(self) -> None:
        """Free the slots of cancelled requests, then admit waiting ones."""
        for t in self.running:
            if t is not None and t.cancelled:
                t.stats.finish_reason = t.stats.finish_reason or "stop"
                self.free(t, _END)
        self._admit()

    def _admit(self) -> None:
        """Waiting requests into free slots (:meth:`_place`)."""
        while self.waiting:
            free = [i for i, t in enumerate(self.running) if t is None]
            if not free:
                return
            t = self.waiting.popleft()
            if t.cancelled:
                t.queue.put(_END)
                continue
            t.slot = self._place(t, free)
            t.cached = max(0, len(t.ids) - self.target.lag(t.ids, t.slot))
            self.running[t.slot] = t

    def _place(self, t: Ticket, free: List[int]) -> int:
        """The free slot whose cache shares most with ``t``'s prompt, less
        RUN_TOKENS for each run of consecutive busy slots it leaves (a split
        target cache makes a pass per run, every round: see
        :func:`~specgguf.llama.model.ubatches`). A conversation's
        next turn shares far more with its slot than RUN_TOKENS and goes
        back to it; a new request, which shares the chat template's few
        tokens with any slot, fills a gap between busy slots instead."""
        busy = [i for i, x in enumerate(self.running) if x is not None]

        def runs(i: int) -> int:
            s = sorted(busy + [i])
            return 1 + sum(b != a + 1 for a, b in zip(s, s[1:]))
        cost = self.RUN_TOKENS if self.split else 0
        return max(free, key=lambda i: common_prefix(self.target.cache[i], t.ids) - cost * runs(i))


class Engine:
    """Decoding rounds over up to ``target.slots`` requests at once, in a thread of its own.

    Args:
        target: the target's :class:`LlamaModel` with several slots, or any
            model with the part of its protocol the engine uses: ``slots``,
            ``unified``, ``cache`` (per slot, the tokens its KV holds),
            ``lag(seq, slot, n_logits)``, ``eval_many([(slot, seq, n_logits,
            proposed)]) -> [[n_logits, V] float32]`` and ``reset()``
            (``tests/test_engine_protocol.py`` drives it with a table).
        draft: the draft model's, with as many slots; None for none.
        ngram: a prompt-lookup drafter (:class:`~specgguf.ops.ngram.NgramDrafter`),
            used when there is no draft model.
        policy: the :class:`~specgguf.engine.policy.Policy` that picks each
            slot's K (its ``passes`` must count the target's: with a stream per
            slot, :func:`~specgguf.llama.model.ubatches`), under the engine's lock.
        lookups: a lookup per slot (:class:`~specgguf.ops.suffix.SuffixDrafter`),
            tried before the draft model each round, with ``lookup_policy``'s K
            (as :mod:`~specgguf.engine.lookup_first` does for one sequence).
    """

    def __init__(self, target: LlamaModel, draft: Optional[LlamaModel] = None, ngram=None,
                 policy: Optional[Policy] = None, lookups: Optional[Sequence] = None,
                 lookup_policy: Optional[Policy] = None) -> None:
        if draft is not None and draft.slots != target.slots:
            raise ValueError(f"the draft has {draft.slots} slots, the target {target.slots}")
        self.target, self.draft, self.ngram = target, draft, ngram
        self.drafter = SlotDrafter(draft) if draft is not None else None
        self.slots = Slots(target)
        self.policy = policy or Policy(free_draft=draft is None)
        self.lookups, self.lookup_policy = lookups, lookup_policy if lookups else None
        self.cond = threading.Condition()
        self.thread: Optional[threading.Thread] = None

    @property
    def busy(self) -> int:
        """Requests running or waiting."""
        with self.cond:
            return self.slots.busy()

    def submit(self, ids: Sequence[int], budget: int, stops: FrozenSet[int], sampler: Sampler, regime: str,
               k="auto", p_min=None, start=None) -> Ticket:
        """Queue a request: decode up to ``budget`` tokens after ``ids`` with
        ``sampler``'s rule, its acceptance pooled under ``regime``; ``k``: a
        fixed K or "auto" (the engine's policy: :func:`~specgguf.engine.draft_length.draft_length`);
        ``p_min``: its draft confidence cutoff
        (None, a float, or "auto": the policy's); ``start()``: run under the
        engine's lock first (where the caller readies the policy's regime: the
        engine's thread reads the policy meanwhile)."""
        ticket = Ticket(ids, budget, stops, sampler, regime, draft_length(k, lambda: self.policy), self.wake, p_min)
        with self.cond:
            if start is not None:
                start()
            if budget <= 0:
                ticket.stats.finish_reason = "length"
                ticket.queue.put(_END)
                return ticket
            self.slots.add(ticket)
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="specgguf-engine", daemon=True)
                self.thread.start()
            self.cond.notify()
        return ticket

    def explain(self, ticket: Ticket) -> Optional[str]:
        """``ticket``'s K object's one line on drafting in its regime (see
        :meth:`Policy.explain`; a fixed K: None)."""
        with self.cond:
            return ticket.length.explain(ticket.regime)

    def record(self, regime: str) -> Optional[dict]:
        """What the policy knows of the draft's acceptance in ``regime``, for the state store."""
        with self.cond:
            return self.policy.record(regime)

    def wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.slots.update()
                while not self.slots.active():
                    self.cond.wait()
                    self.slots.update()
                active = self.slots.active()
            try:
                self._round(active)
            except BaseException as e:  # the models' state is unknown: every running request gets the error
                for m in (self.target, self.draft):
                    if m is not None:
                        m.reset()
                with self.cond:
                    for t in active:
                        self.slots.free(t, e)

    def _round(self, active: Sequence[Ticket]) -> None:
        can = self.draft is not None or self.ngram is not None
        views = [t.view(self.target, self.draft, can) for t in active]
        with self.cond:  # the policy is shared with submit's callers
            looked = self._looked(active, views)  # {index: K}: the slots a lookup drafts for this round
            ks = [0 if i in looked else k for i, k in enumerate(self.policy.choose(views))]
            cutoffs = [self.policy.p_min(t.regime) if t.p_min == "auto" else t.p_min for t in active]
            measure = to_measure(active, views, self.policy) if self.drafter is not None else {}
        t0 = time.perf_counter()
        drafts, forwards = self._draft(active, ks, cutoffs)
        for i, k in looked.items():
            drafts[i] = self.lookups[active[i].slot].propose(active[i].ids, k)
        t1 = time.perf_counter()
        work = [(t.slot, t.ids + d.tokens, len(d.tokens) + 1 + measure.get(i, 0), len(d.tokens))
                for i, (t, d) in enumerate(zip(active, drafts))]
        logits = self.target.eval_many(work)
        t2 = time.perf_counter()
        measured = self._measure(active, logits, measure, forwards)
        with self.cond:
            for i, (t, d, rows) in enumerate(zip(active, drafts, logits)):
                if measured.get(i) is not None:
                    self.policy.measured(t.regime, *measured[i])
                rows = rows[measure.get(i, 0):]
                try:  # a request's own rules (a grammar with no way on) fail that request only
                    n, nxt = t.sampler.verify(t.sampler.target_rows(rows, t.ids + d.tokens), d, t.stats.emitted)
                except ValueError as e:
                    self.slots.free(t, e)
                    continue
                t.stats.record(len(d.tokens), n, d.stop if d.tokens else None, seconds=(t1 - t0, t2 - t1))
                (self.lookup_policy if i in looked else self.policy).observe(t.regime, len(d.tokens), n, t.after_miss)
                t.after_miss = n < len(d.tokens)  # a plain round ends a run of misses
                source = FROM_LOOKUP if i in looked or self.drafter is None else FROM_DRAFT
                if t.emit(d.tokens[:n] + [nxt], n, source) and self.slots.holds(t):
                    self.slots.free(t, _END)
            drafted = [len(d.tokens) for d in drafts]
            rest = (time.perf_counter() - t0) - (t2 - t1) - sum(f[1] for f in forwards)
            m = Measured(sum(v.target_lag for v in views) + sum(drafted), t2 - t1, forwards, sum(drafted) + len(drafts),
                         rest)
            self.policy.round_done(views, [0 if i in looked else n for i, n in enumerate(drafted)], m)
            if self.lookup_policy is not None:
                self.lookup_policy.round_done(views, [n if i in looked else 0 for i, n in enumerate(drafted)], m)

    def _looked(self, active: Sequence[Ticket], views: Sequence[SlotView]) -> dict:
        """``{index: K}``: the slots whose lookup finds the end of their text
        earlier and whose lookup K (``lookup_policy``'s, or their fixed K) is
        not 0; these draft from the lookup this round, the others from the model."""
        if self.lookups is None:
            return {}
        found = [i for i, (t, v) in enumerate(zip(active, views))
                 if v.cap > 0 and self.lookups[t.slot].propose(t.ids, 1).tokens]
        mine = [lookup_view(views[i], views[i].cap if views[i].fixed else self.lookup_policy.k_max) for i in found]
        return {i: k for i, k in zip(found, self.lookup_policy.choose(mine) if mine else []) if k > 0}

    def _measure(self, active: Sequence[Ticket], logits: List[np.ndarray], measure: dict, forwards: list) -> dict:
        """The draft's acceptance on each measured prompt (``{index: (acceptance,
        positions) or None}``, :func:`~specgguf.llama.adapter.text_agreement`):
        the draft catches up on it, scoring the positions the target's first
        rows did; the catch-up counts among the round's forwards."""
        if not measure:
            return {}
        got, forward = self.drafter.agreement([(active[i].slot, active[i].ids, active[i].sampler, logits[i][:n])
                                               for i, n in measure.items()])
        forwards.append(forward)
        return dict(zip(measure, got))

    def _draft(self, active: Sequence[Ticket], ks: Sequence[int], cutoffs: Sequence[Optional[float]]) -> tuple:
        """Each slot's :class:`~specgguf.ops.drafter.Draft` of up to its K tokens
        (fewer where the draft's confidence falls below its cutoff), and the
        draft forwards run ``[(tokens, seconds, sequences)]``."""
        if self.drafter is None:
            return [self.ngram.propose(t.ids, k) if k > 0 else Draft(confidence=[]) for t, k in zip(active, ks)], []
        return self.drafter.propose([(t.slot, t.ids, t.sampler, k, c) for t, k, c in zip(active, ks, cutoffs)])


def to_measure(active: Sequence[Ticket], views: Sequence[SlotView], policy: Policy) -> dict:
    """``{index: positions}``: the requests whose prompt round also measures
    the draft on the prompt (:func:`~specgguf.llama.adapter.prompt_rows`),
    one per regime the policy has seen too little of in this process and
    where drafting could pay (:meth:`~specgguf.engine.policy.Policy.worth_measuring`),
    as the decoder's first run does: a stored record is a prior, and a probe
    into a poor draft pays its whole catch-up to learn three tokens."""
    out, regimes = {}, set()
    for i, (t, v) in enumerate(zip(active, views)):
        if t.length is policy and v.target_lag > 1 and t.regime not in regimes and policy.worth_measuring(v):
            n = prompt_rows(t.ids, v.target_lag)
            if n:
                out[i] = n
                regimes.add(t.regime)
    return out
