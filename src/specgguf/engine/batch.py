"""Rounds over several sequences at once: what lets one pair serve several users.

Each request gets a slot: one sequence id in both models' KV caches (see
:class:`~specgguf.llama.model.LlamaModel`'s ``slots``). A slot keeps its
tokens after its request ends, so a conversation's next turn, given the
slot that shares the longest prefix with it, is not evaluated again.

One round serves every slot, read top to bottom in :meth:`Engine._round`:

1. K per slot from :class:`~specgguf.engine.batch_policy.BatchPolicy` (0 for a
   slot whose target has a prompt to read: its first token comes at once);
2. the draft proposes for every drafting slot, one batched forward per
   draft position (the first also catches each slot up);
3. the target scores every slot's ``[last token, d_1 .. d_K]`` in ONE
   ``llama_decode``, logits only at those rows;
4. each slot verifies with its own :class:`~specgguf.ops.sampling.Sampler`
   (greedy, exact p/q, or the drafter-invariant race with its own seed).

A sequence's logits do not depend on what else is in the batch beyond
float rounding (llama.cpp tiles a matmul by the batch's size: the same
effect as verifying K+1 tokens at once against decoding them one by one),
so every request's output is what it gets alone: greedy text token for
token; seeded drafter-invariant text up to a race that rounding decides (a
near-tie, or a token at the truncation's edge: at T=0.8 several of eight
48-token texts in the tests, each checked to be one); exact p/q sampling
keeps the target's law. Requests join and leave between
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

from .batch_policy import BatchPolicy, SlotView
from .decoder import DecoderStats
from ..ops.drafter import Draft, common_prefix
from ..llama.model import LlamaModel
from ..ops.sampling import Sampler

_END = object()


class Ticket:
    """One request's progress through the engine, and its caller's view of it.

    Iterating yields the generated token ids as rounds produce them (as
    :meth:`~specgguf.engine.decoder.SpeculativeDecoder.stream` does); leaving the
    loop early or :meth:`close` cancels the request. ``stats`` holds its
    :class:`~specgguf.engine.decoder.DecoderStats`; ``sampler`` its rule.
    """

    def __init__(self, ids: Sequence[int], budget: int, stops: FrozenSet[int], sampler: Sampler,
                 regime: str, k: Optional[int], wake) -> None:
        self.ids, self.budget, self.stops, self.sampler = list(ids), budget, stops, sampler
        self.regime, self.k, self._wake = regime, k, wake
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
    def emit(self, tokens: Sequence[int], n_draft: int) -> bool:
        """Hand ``tokens`` (the first ``n_draft`` accepted drafts) to the
        caller; True when the request is done."""
        for i, t in enumerate(tokens):
            self.ids.append(t)
            self.stats.emit(i < n_draft)
            self.queue.put(t)
            if t in self.stops:
                self.stats.finish_reason = "stop"
                return True
            if self.stats.emitted >= self.budget:
                self.stats.finish_reason = "length"
                return True
        return False


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
        :func:`~specgguf.engine.batch_policy.ubatches`). A conversation's
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
        target: the target's :class:`LlamaModel` with several slots.
        draft: the draft model's, with as many slots; None for none.
        ngram: a prompt-lookup drafter (:class:`~specgguf.ops.ngram.NgramDrafter`),
            used when there is no draft model.
        k_max: the largest K a slot drafts.
    """

    def __init__(self, target: LlamaModel, draft: Optional[LlamaModel] = None, ngram=None, k_max: int = 8) -> None:
        if draft is not None and draft.slots != target.slots:
            raise ValueError(f"the draft has {draft.slots} slots, the target {target.slots}")
        self.target, self.draft, self.ngram = target, draft, ngram
        self.slots = Slots(target)
        self.policy = BatchPolicy(k_max, split=self.slots.split)
        self.cond = threading.Condition()
        self.thread: Optional[threading.Thread] = None

    @property
    def busy(self) -> int:
        """Requests running or waiting."""
        with self.cond:
            return self.slots.busy()

    def submit(self, ids: Sequence[int], budget: int, stops: FrozenSet[int], sampler: Sampler, regime: str,
               k: Optional[int] = None, prior: Optional[float] = None, evidence: Optional[dict] = None) -> Ticket:
        """Queue a request: decode up to ``budget`` tokens after ``ids`` with
        ``sampler``'s rule; ``k``: a fixed K, or None for the policy's; ``prior``
        and ``evidence``: what is known of the draft's acceptance in ``regime``."""
        ticket = Ticket(ids, budget, stops, sampler, regime, k, self.wake)
        with self.cond:
            self.policy.estimate(regime, prior, evidence)
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

    def explain(self, regime: str) -> str:
        """The policy's one line on drafting in ``regime`` (see :meth:`BatchPolicy.explain`)."""
        with self.cond:
            return self.policy.explain(regime)

    def hand_over(self, regime: str) -> dict:
        """The acceptance evidence ``regime``'s requests gathered since the last
        hand-over (:meth:`~specgguf.engine.acceptance.AcceptanceEstimate.hand_over`), for the state store."""
        with self.cond:
            return self.policy.estimate(regime).hand_over()

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

    def _views(self, active: Sequence[Ticket]) -> List[SlotView]:
        views = []
        for t in active:
            t_lag = self.target.lag(t.ids, t.slot)
            d_lag = self.draft.lag(t.ids, t.slot) if self.draft is not None else 0
            can = self.draft is not None or self.ngram is not None
            remaining = t.budget - t.stats.emitted
            cap = 0 if (t_lag > 1 or not can) else min(self.policy.k_max if t.k is None else t.k, remaining - 1)
            views.append(SlotView(t.regime, max(0, cap), t.k is not None, t_lag, d_lag, remaining, t.after_miss,
                                  t.slot))
        return views

    def _round(self, active: Sequence[Ticket]) -> None:
        views = self._views(active)
        ks = self.policy.choose(views)
        t0 = time.perf_counter()
        drafts, forwards = self._draft(active, ks)
        t1 = time.perf_counter()
        work = [(t.slot, t.ids + d.tokens, len(d.tokens) + 1) for t, d in zip(active, drafts)]
        logits = self.target.eval_many(work)
        t2 = time.perf_counter()
        with self.cond:
            for t, d, rows in zip(active, drafts, logits):
                try:  # a request's own rules (a grammar with no way on) fail that request only
                    n, nxt = t.sampler.verify(t.sampler.target_rows(rows, t.ids + d.tokens), d, t.stats.emitted)
                except ValueError as e:
                    self.slots.free(t, e)
                    continue
                t.stats.record(len(d.tokens), n, d.stop if d.tokens else None, seconds=(t1 - t0, t2 - t1))
                self.policy.observe(t.regime, len(d.tokens), n, t.after_miss)
                t.after_miss = n < len(d.tokens)  # a plain round ends a run of misses (as DraftPolicy)
                if t.emit(d.tokens[:n] + [nxt], n) and self.slots.holds(t):
                    self.slots.free(t, _END)
        t3 = time.perf_counter()
        target_tokens = sum(v.target_lag + len(d.tokens) for v, d in zip(views, drafts))
        rest = (t3 - t0) - (t2 - t1) - sum(f[1] for f in forwards)
        rows = sum(len(d.tokens) + 1 for d in drafts)
        self.policy.costs.observe_round(target_tokens, t2 - t1, forwards, rows, rest,
                                        prompt=any(v.target_lag > 1 for v in views),
                                        passes=self.policy.costs.passes(views, [len(d.tokens) for d in drafts]))
        self.policy.round_done({t.regime for t, d in zip(active, drafts) if d.tokens})

    def _draft(self, active: Sequence[Ticket], ks: Sequence[int]) -> tuple:
        """Each slot's :class:`~specgguf.ops.drafter.Draft` of up to its K tokens,
        and the draft forwards run ``[(tokens, seconds, sequences)]``."""
        drafts = [Draft(confidence=[]) for _ in active]
        if self.draft is None:
            return [self.ngram.propose(t.ids, k) if k > 0 else d for t, k, d in zip(active, ks, drafts)], []
        forwards, probs = [], [[] for _ in active]
        seqs = {i: list(t.ids) for i, (t, k) in enumerate(zip(active, ks)) if k > 0}
        while seqs:
            tokens = sum(self.draft.lag(s, active[i].slot) for i, s in seqs.items())
            t0 = time.perf_counter()
            rows = self.draft.eval_many([(active[i].slot, s, 1) for i, s in seqs.items()])
            forwards.append((tokens, time.perf_counter() - t0, len(seqs)))
            for (i, seq), row in zip(list(seqs.items()), rows):
                try:
                    tok, conf, q = active[i].sampler.pick(row[-1], seq)
                except ValueError:  # the draft found no token the rules allow: the target decides
                    del seqs[i]
                    continue
                drafts[i].tokens.append(tok)
                drafts[i].confidence.append(conf)
                if q is not None:
                    probs[i].append(q)
                seq.append(tok)
                if len(drafts[i].tokens) >= ks[i]:
                    del seqs[i]
        for d, p in zip(drafts, probs):
            d.probs = np.stack(p) if p else None
        return drafts, forwards
