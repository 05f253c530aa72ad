"""What a drafter is: the small interface every draft source implements.

A drafter proposes up to K tokens after the accepted text and says how far
behind that text it is (as llama.cpp's ``common_speculative`` does, it owns
its own lag: the decoder never tracks what the draft has evaluated).

Drafters in specgguf: :class:`~specgguf.llama.adapter.ModelDrafter` (a GGUF
draft model), :class:`~specgguf.ops.ngram.NgramDrafter` (prompt lookup),
and :class:`CallbackDrafter`, which wraps a plain ``draft_step`` function.
A lookup tried before a model drafter, each with its own K, is
:mod:`specgguf.engine.lookup_first`.

The rounds (:mod:`specgguf.engine.rounds`) draft for one or several
sequences at once through a batched drafter: ``propose([Ask]) -> (drafts,
forwards)`` and ``lag(context, slot)``. A GGUF model over several slots is one
(:class:`~specgguf.llama.adapter.SlotDrafter`: one forward per draft position
for every sequence); :class:`EachDrafter` makes any drafter one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, NamedTuple, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np

STOP_REASONS = ("max", "cutoff", "end")


@dataclass
class Draft:
    """One round's proposal.

    Attributes:
        tokens: ``[n]`` proposed token ids, n <= the k asked for.
        probs: ``[n, V]`` float32, the draft's warped distributions the tokens
            were sampled from (exact p/q verification needs them); None when
            greedy, one-hot or verified by the drafter-invariant race.
        onehot: the draft was certain of each token (an n-gram lookup): q is
            a point mass, verified without draft rows.
        stop: why drafting stopped: ``"max"`` (k reached), ``"cutoff"`` (the
            draft's confidence fell below p_min) or ``"end"`` (nothing more
            to propose).
        confidence: the draft's probability of each proposed token, or None.
        forwards: ``(tokens, seconds)`` of each draft forward, for drafters
            that time them (the first evaluates what the draft had skipped:
            its catch-up); the policy prices rounds from them (see
            :mod:`specgguf.engine.policy`). ``[]``: no forward (a lookup);
            None: not timed.
        catchup: ``(acceptances, positions)``: how the draft's rows for
            emitted tokens it had skipped agree with them under the
            verification rule (:func:`~specgguf.ops.sampling.agreement`),
            for drafters that read them back while catching up; None otherwise.
    """

    tokens: List[int] = field(default_factory=list)
    probs: Optional[np.ndarray] = None
    onehot: bool = False
    stop: str = "max"
    confidence: Optional[List[float]] = None
    forwards: Optional[List[Tuple[int, float]]] = None
    catchup: Optional[Tuple[float, int]] = None


class Proposal:
    """A :class:`Draft` built one token at a time: what a model drafter's
    loop fills (the model's own, and across tokenizers).

    Args:
        t0: ``time.perf_counter()`` when proposing began (the first forward's
            time, catch-up included, is measured from it).
    """

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.tokens: List[int] = []
        self.probs: List[np.ndarray] = []
        self.confidence: List[float] = []
        self.stop = "max"
        self.forwards: List[Tuple[int, float]] = []

    def forwarded(self, tokens: int) -> None:
        """A forward over ``tokens`` finished: its time since the last one is kept."""
        now = time.perf_counter()
        self.forwards.append((tokens, now - self.t0))
        self.t0 = now

    def refuses(self, confidence: float, p_min: Optional[float]) -> bool:
        """The next token's confidence is below the cutoff: drafting stops ("cutoff")."""
        if p_min is not None and confidence < p_min:
            self.stop = "cutoff"
            return True
        return False

    def add(self, token: int, confidence: float, q: Optional[np.ndarray]) -> None:
        """One proposed token, its confidence, and the ``[V]`` q it was drawn from (exact rule)."""
        self.tokens.append(token)
        self.confidence.append(confidence)
        if q is not None:
            self.probs.append(q)

    def draft(self, catchup: Optional[Tuple[float, int]] = None) -> Draft:
        return Draft(self.tokens, np.stack(self.probs) if self.probs else None, False, self.stop,
                     self.confidence, self.forwards, catchup)


@runtime_checkable
class Drafter(Protocol):
    """The draft side of speculative decoding."""

    def propose(self, context: Sequence[int], k: int, p_min: Optional[float] = None) -> Draft:
        """Up to ``k`` tokens to follow ``context`` (the prompt and every
        accepted token), stopping before a token whose confidence is below
        ``p_min`` (None: no cutoff)."""
        ...

    def lag(self, context: Sequence[int]) -> int:
        """How many tokens of ``context`` the drafter has not evaluated: what
        proposing now would first catch up on (0 for a lookup)."""
        ...


class Ask(NamedTuple):
    """One sequence's request to a batched drafter in a round."""

    slot: int                # its slot in the models' caches
    context: Sequence[int]   # the prompt and every accepted token
    sampler: Any             # its :class:`~specgguf.ops.sampling.Sampler` (picks each draft token)
    k: int                   # tokens to draft (0: none)
    p_min: Optional[float]   # confidence cutoff (None: none)
    lag: int                 # what the round's view said the drafter lags by (for untimed drafters)


def timed_forwards(draft: Draft, lag: int, seconds: float) -> List[Tuple[int, float]]:
    """``draft``'s forwards as ``(tokens, seconds)``: its own timings, or for a
    drafter that does not time them, ``seconds`` shared among its tokens (the
    first forward over the ``lag`` it caught up on)."""
    if draft.forwards is not None:
        return list(draft.forwards)
    n = len(draft.tokens)
    return [(max(1, lag) if i == 0 else 1, seconds / n) for i in range(n)]


class EachDrafter:
    """A one-sequence :class:`Drafter` as the rounds' batched drafter: it
    proposes for each drafting sequence in turn (the sampler it was bound
    to picks the tokens; the ``Ask``'s is not used)."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.model_free = getattr(drafter, "model_free", False)  # a lookup's tokens (the API's sources)

    def lag(self, context: Sequence[int], slot: int = 0) -> int:
        return self.drafter.lag(context)

    def propose(self, asks: Sequence[Ask]) -> tuple:
        """Each ask's :class:`Draft` and the forwards run, ``[(tokens, seconds, sequences)]``."""
        drafts, forwards = [], []
        for a in asks:
            if a.k <= 0:
                drafts.append(Draft(forwards=[]))
                continue
            t0 = time.perf_counter()
            d = self.drafter.propose(a.context, a.k, a.p_min)
            forwards += [(n, s, 1) for n, s in timed_forwards(d, a.lag, time.perf_counter() - t0)]
            drafts.append(d)
        return drafts, forwards


def common_prefix(a: Sequence[int], b: Sequence[int], limit: Optional[int] = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (at most ``limit``)."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CallbackDrafter:
    """A ``draft_step`` function as a :class:`Drafter`.

    ``draft_step(prefix, k) -> (tokens, probs[, info])``, called as
    ``draft_step(prefix, k, p_min=x)`` when a cutoff is set; ``info`` may hold
    ``"onehot"``, ``"confidence"`` and ``"stop"`` (see :class:`Draft`). The
    lag assumes what a model draft does: it evaluated the prefix and every
    proposed token but the last.
    """

    def __init__(self, draft_step: Callable[..., tuple]) -> None:
        if not callable(draft_step):
            raise TypeError("draft_step must be callable")
        self.draft_step = draft_step
        self.evaluated: List[int] = []

    def lag(self, context: Sequence[int]) -> int:
        return len(context) - common_prefix(self.evaluated, context)

    def propose(self, context: Sequence[int], k: int, p_min: Optional[float] = None) -> Draft:
        prefix = list(context)
        out = self.draft_step(prefix, k) if p_min is None else self.draft_step(prefix, k, p_min=p_min)
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise TypeError("draft_step must return a (tokens, probs) or (tokens, probs, info) tuple")
        info = out[2] if len(out) == 3 else {}
        if not isinstance(info, dict):
            raise TypeError(f"draft_step's third value must be a dict, got {type(info).__name__}")
        try:
            tokens = [int(t) for t in out[0]]
        except (TypeError, ValueError):
            raise TypeError("draft_step returned tokens that are not a sequence of ints") from None
        if len(tokens) > k:
            raise ValueError(f"draft_step returned {len(tokens)} tokens, more than the k = {k} asked for")
        self.evaluated = prefix + tokens[:-1]
        stop = info.get("stop") or ("max" if len(tokens) == k else "end")
        return Draft(tokens, out[1], bool(info.get("onehot")), stop, info.get("confidence"))


MEASURE_ROWS = 32  # prompt positions a first run's measurement scores


def prompt_rows(ids: Sequence[int], lag: int) -> int:
    """How many positions of a prompt ``ids`` to measure the draft on, when
    the target's cache lacks ``lag`` of them: the last MEASURE_ROWS, less the
    last token (left to the first round: no work is done twice) and those the
    target holds already (scored again, they cost a first call on a cached
    prompt 0.46 s here); 0 for too few to say anything."""
    n = min(MEASURE_ROWS, len(ids) - 2, lag - 1)
    return n if n >= 4 else 0
