"""Rounds over several sequences at once: what lets one pair serve several users.

Each request gets a slot: one sequence id in both models' KV caches (see
:class:`~specgguf.llama.model.LlamaModel`'s ``slots``). A slot keeps its
tokens after its request ends, so a conversation's next turn, given the
slot that shares the longest prefix with it, is not evaluated again.

Each round serves every slot: :meth:`~specgguf.engine.rounds.Rounds.play`,
the loop the one-sequence decoder runs too (K per slot from its K object,
the drafts for every drafting slot in one batched forward per position, the
target's ``[last token, d_1 .. d_K]`` for every slot in ONE ``llama_decode``
under the batch-invariance bound, each slot's own verification).

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
from collections import deque
from typing import Callable, Deque, FrozenSet, List, Optional, Sequence

from ..llama.model import LlamaModel
from ..llama.stash import Stash
from ..ops.drafter import EachDrafter, common_prefix
from ..llama.adapter import SlotDrafter
from ..ops.sampling import Sampler
from .draft_length import draft_length
from .policy import Policy
from .rounds import Request, Rounds

_END = object()


class Ticket(Request):
    """One request's progress through the engine, and its caller's view of it.

    Iterating yields the generated token ids as rounds produce them (as
    :meth:`~specgguf.engine.decoder.SpeculativeDecoder.stream` does); leaving the
    loop early or :meth:`close` cancels the request. Its state across rounds
    is the :class:`~specgguf.engine.rounds.Request`'s (``stats``, ``sampler``,
    ``length``: its K object, a fixed K or the engine's policy).
    """

    def __init__(self, *args, wake=lambda: None, **kwargs) -> None:
        self.queue: "queue.SimpleQueue" = queue.SimpleQueue()
        super().__init__(*args, put=self.queue.put, **kwargs)
        self._wake = wake
        self.cancelled = False
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


class Slots:
    """Which request runs in which slot, and the requests waiting for one.

    Not locked itself: the :class:`Engine` calls it under its condition.

    Args:
        target: the target's :class:`LlamaModel`; its slot count, and its
            caches, which decide where a waiting request goes.
        stash: where a slot's caches are copied before a request cuts them,
            and loaded back from for a request that shares more with a copy
            (:class:`~specgguf.llama.stash.Stash`); None: none kept.
    """

    RUN_TOKENS = 256  # a run's pass (about a target token's time, every round) against prompt tokens kept

    def __init__(self, target: LlamaModel, stash: Optional[Stash] = None) -> None:
        self.target, self.stash = target, stash
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
            if self.stash is not None:
                self.stash.before_taking(t.slot, t.ids)
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
        stash: evicted slots' caches in host memory (see :class:`Slots`).
    """

    def __init__(self, target: LlamaModel, draft: Optional[LlamaModel] = None, ngram=None,
                 policy: Optional[Policy] = None, lookups: Optional[Sequence] = None,
                 lookup_policy: Optional[Policy] = None, stash: Optional[Stash] = None) -> None:
        if draft is not None and draft.slots != target.slots:
            raise ValueError(f"the draft has {draft.slots} slots, the target {target.slots}")
        self.target, self.draft = target, draft
        # every target forward is the engine's: the draft's may take the stock kernels (SlotDrafter)
        drafter = (SlotDrafter(draft, stock=True) if draft is not None else
                   EachDrafter(ngram) if ngram is not None else None)
        self.slots = Slots(target, stash)
        self.policy = policy or Policy(free_draft=draft is None)
        self.lookups, self.lookup_policy = lookups, lookup_policy if lookups else None
        listeners = [self.policy] + ([self.lookup_policy] if self.lookup_policy is not None else [])
        self.rounds = Rounds(target, drafter, lookups, listeners)
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
        # A fixed K's rounds teach the engine's policies too: they measure the same draft.
        ticket = Ticket(ids, budget, stops, sampler, regime, draft_length(k, lambda: self.policy, self.policy),
                        draft_length(k, lambda: self.lookup_policy, self.lookup_policy) if self.lookups else None,
                        p_min, wake=self.wake)
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

    def store(self, keep: Callable[[], None]) -> None:
        """``keep()`` (what stores the policies' timings) between the engine's rounds."""
        with self.cond:
            keep()

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
        ended = self.rounds.play(active, self.cond)
        with self.cond:
            for t, error in ended:  # a request's own rules (a grammar with no way on) fail that request only
                if error is not None or self.slots.holds(t):
                    self.slots.free(t, _END if error is None else error)
