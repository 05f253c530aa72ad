"""The draft/verify loop, read top to bottom.

Each round: the drafter proposes up to K tokens, the target scores the
prefix plus those K in one call, and the sampler's rule keeps an accepted
prefix plus one correction or bonus token. Any pair of models composes:

    drafter:      a :class:`~specgguf.ops.drafter.Drafter` (propose, lag), or a
                  function draft_step(prefix, k) -> (tokens, probs[, info])
    target_step(prefix, proposed) -> [len(proposed) + 1, V] float array
                  (optionally with lag(prefix): the tokens of prefix it would evaluate)

``prefix`` is the whole sequence so far (prompt plus emitted tokens).
``target_step``'s row i scores the token after ``prefix + proposed[:i]``.
Greedy, the rows may be logits (only the argmax is read) and draft probs may
be None; sampling, both must be the models' warped distributions
(non-negative masses), warped identically.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..checks import check_int, check_p_min
from ..ops.drafter import Draft, Drafter, CallbackDrafter
from .draft_length import FixedK, draft_length
from .lookup_first import FROM_DRAFT, FROM_LOOKUP, FROM_TARGET, LookupFirst, Turn, measured, next_turn, report
from .policy import Policy, SlotView
from ..ops.sampling import Sampler
from ..ops.verify import GeneratorLike

TargetStep = Callable[[List[int], List[int]], np.ndarray]


@dataclass
class DecoderStats:
    """Counts of one ``generate``/``stream`` call.

    ``accepted_hist[n]`` counts rounds that accepted n drafts;
    ``position_drafted[i]`` / ``position_accepted[i]`` count rounds that
    drafted / accepted draft position i (0-based); ``k_hist[k]`` rounds that
    drafted k tokens; ``stop_reasons`` why drafting stopped in rounds that
    asked for tokens; ``from_draft[i]`` whether emitted token i was a draft
    token the target accepted (1), a lookup's (2) or the target's own (0):
    its provenance.
    """

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    finish_reason: Optional[str] = None
    accepted_hist: List[int] = field(default_factory=list)
    position_drafted: List[int] = field(default_factory=list)
    position_accepted: List[int] = field(default_factory=list)
    k_hist: Dict[int, int] = field(default_factory=dict)
    stop_reasons: Dict[str, int] = field(default_factory=dict)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    first_target_seconds: float = 0.0  # the first round's, which also evaluates the prompt
    verify_seconds: float = 0.0
    from_draft: bytearray = field(default_factory=bytearray)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per round."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def position_acceptance(self) -> List[float]:
        """Per draft position: accepted / drafted."""
        return [a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted)]

    def record(self, drafted: int, accepted: int, stop: Optional[str] = None,
               seconds: Tuple[float, float] = (0.0, 0.0)) -> None:
        """Add one round that drafted ``drafted`` and accepted ``accepted``;
        ``stop``: why drafting stopped (rounds that asked for tokens);
        ``seconds``: its draft's and its target's time (the first round's
        target time is also kept apart: it evaluated the prompt too)."""
        if self.rounds == 0:
            self.first_target_seconds = seconds[1]
        self.draft_seconds += seconds[0]
        self.target_seconds += seconds[1]
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        for lst, n in ((self.accepted_hist, accepted + 1), (self.position_drafted, drafted),
                       (self.position_accepted, accepted)):
            if len(lst) < n:
                lst.extend([0] * (n - len(lst)))
        self.accepted_hist[accepted] += 1
        for i in range(drafted):
            self.position_drafted[i] += 1
        for i in range(accepted):
            self.position_accepted[i] += 1
        self.k_hist[drafted] = self.k_hist.get(drafted, 0) + 1
        if stop is not None:
            self.stop_reasons[stop] = self.stop_reasons.get(stop, 0) + 1

    def emit(self, source: int) -> None:
        """Count one emitted token and where it came from (FROM_TARGET, FROM_DRAFT or FROM_LOOKUP)."""
        self.emitted += 1
        self.from_draft.append(int(source))

    def by_source(self) -> Dict[str, int]:
        """Emitted tokens per source: ``{"target": n, "draft": n, "lookup": n}``."""
        return {name: self.from_draft.count(i) for i, name in SOURCES.items()}

    def as_dict(self) -> dict:
        """Plain dict of every count and derived rate (for JSON output;
        provenance goes out per token, as :func:`sources`)."""
        return {
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "emitted": self.emitted, "finish_reason": self.finish_reason,
            "acceptance_rate": self.acceptance_rate, "mean_accepted": self.mean_accepted,
            "accepted_hist": list(self.accepted_hist), "position_acceptance": self.position_acceptance,
            "position_drafted": list(self.position_drafted), "position_accepted": list(self.position_accepted),
            "k_hist": dict(sorted(self.k_hist.items())), "stop_reasons": dict(self.stop_reasons),
            "draft_seconds": self.draft_seconds, "target_seconds": self.target_seconds,
            "first_target_seconds": self.first_target_seconds, "verify_seconds": self.verify_seconds,
            "tokens_by_source": self.by_source(),
        }


SOURCES = {FROM_TARGET: "target", FROM_DRAFT: "draft", FROM_LOOKUP: "lookup"}


def sources(from_draft: bytes) -> List[str]:
    """Provenance as the API shows it: ``"draft"`` for a draft model's token the
    target accepted, ``"lookup"`` for a lookup's, ``"target"`` for one the
    target produced."""
    return [SOURCES[f] for f in from_draft]


def hand_out(stats: DecoderStats, tokens: Sequence[int], n_draft: int, source: int, stops: FrozenSet[int],
             budget: int) -> Iterator[int]:
    """A round's ``tokens`` one by one, each counted in ``stats`` (the first
    ``n_draft`` from ``source``, the last the target's own); ends after a stop
    token (``finish_reason`` "stop") or the ``budget``-th token ("length").
    The decoder and the engine's requests hand out their tokens through it."""
    for i, t in enumerate(tokens):
        stats.emit(source if i < n_draft else FROM_TARGET)
        yield t
        if t in stops:
            stats.finish_reason = "stop"
            return
        if stats.emitted >= budget:
            stats.finish_reason = "length"
            return


class SpeculativeDecoder:
    """Speculative decoding over a drafter and a target callback (module docstring).

    Args:
        drafter: a :class:`~specgguf.ops.drafter.Drafter`, or a ``draft_step`` function.
        target_step: ``(prefix, proposed) -> [len(proposed)+1, V]``.
        k: draft tokens per round (0 = plain target decoding), ``"auto"``
            (a :class:`~specgguf.engine.policy.Policy` picks K each round), or
            a K object (a ``Policy`` shared with other runs: what it learns
            carries over; see :mod:`~specgguf.engine.draft_length`).
        greedy: True verifies with :func:`~specgguf.verify_greedy` (output is
            exactly greedy target decoding); False with :func:`~specgguf.accept`
            (output distributed exactly as sampling the target).
        generator: ``numpy.random.Generator``, int seed or None (sampling only).
        p_min: draft confidence cutoff: None, a float, or ``"auto"`` (the
            policy's: what one more draft token costs; needs ``k="auto"`` or a policy).
        sampler: a :class:`~specgguf.ops.sampling.Sampler` (its rule replaces
            ``greedy`` and ``generator``; the drafter-invariant race needs one).
        plain_first: decode the first round without drafting, so the first
            token comes as soon as the target has read the prompt (the draft
            catches up on it in the second round).
        lookup: an n-gram lookup tried before ``drafter`` each round, with
            its own K (see :mod:`specgguf.engine.lookup_first`).
        regime: the name the policy pools this run's acceptance under (the
            sampling regime: :attr:`~specgguf.config.GenerationConfig.regime`;
            default: the sampler's rule).

    After a call, ``stats`` holds that call's :class:`DecoderStats`.
    """

    def __init__(self, drafter: Union[Drafter, Callable[..., tuple]], target_step: TargetStep,
                 k: Union[int, str, Policy, FixedK] = 4, greedy: bool = True, generator: GeneratorLike = None,
                 p_min: Union[None, float, str] = None, sampler: Optional[Sampler] = None,
                 plain_first: bool = False, lookup: Optional[LookupFirst] = None,
                 regime: Optional[str] = None) -> None:
        if not callable(target_step):
            raise TypeError("target_step must be callable")
        self.drafter = drafter if isinstance(drafter, Drafter) else CallbackDrafter(drafter)
        self.target_step = target_step
        self.sampler = sampler or Sampler("greedy" if greedy else "exact", generator=generator)
        # Costs from the clock only where it cannot change the output.
        self.length = draft_length(k, lambda: Policy(clock=self.sampler.rule != "exact" or generator is None))
        self.p_min = check_p_min(p_min)
        if p_min == "auto" and not self.length.auto:
            raise ValueError("p_min='auto' is set by the draft policy's costs: use it with k='auto'")
        self.plain_first = plain_first
        self.lookup = lookup
        self.regime = regime or self.sampler.rule
        self.stats = DecoderStats()

    def generate(self, prompt_ids: Sequence[int], max_new: int = 128,
                 stop_tokens: Sequence[int] = ()) -> List[int]:
        """Decode up to ``max_new`` new tokens after ``prompt_ids``.

        Returns the new token ids (a stop token, if hit, is included last).
        """
        return list(self.stream(prompt_ids, max_new, stop_tokens))

    def stream(self, prompt_ids: Sequence[int], max_new: int = 128,
               stop_tokens: Sequence[int] = ()) -> Iterator[int]:
        """Like :meth:`generate`, yielding each token as its round completes.
        Arguments are checked at the call, before the first token is asked for."""
        prefix = [int(t) for t in prompt_ids]
        if not prefix:
            raise ValueError("prompt_ids must hold at least one token")
        max_new = check_int("max_new", max_new, 0)
        self.stats = DecoderStats()
        self.sampler.restart()  # a grammar starts over with each text
        return self._rounds(prefix, max_new, frozenset(int(t) for t in stop_tokens))

    def _rounds(self, prefix: List[int], max_new: int, stops: frozenset) -> Iterator[int]:
        stats, after_miss = self.stats, False
        while stats.emitted < max_new:
            turn = self._turn(prefix, max_new - stats.emitted, after_miss)
            t0 = time.perf_counter()
            draft = self._draft(turn, prefix)
            t1 = time.perf_counter()
            target = self.target_step(list(prefix), list(draft.tokens))
            t2 = time.perf_counter()
            self._check_target(target, len(draft.tokens))
            n, nxt = self.sampler.verify(target, draft, stats.emitted)
            t3 = time.perf_counter()
            stats.verify_seconds += t3 - t2
            capped = turn.k == turn.view.cap < self.length.k_max  # the tokens left, not the drafter, ended it
            stop = None if turn.k == 0 else ("max_new" if capped and draft.stop == "max" else draft.stop)
            stats.record(len(draft.tokens), n, stop, seconds=(t1 - t0, t2 - t1))
            report(turn, self.lookup, draft, n, measured(turn, draft, t1 - t0, t2 - t1, t3 - t0))
            after_miss = n < len(draft.tokens)
            for t in hand_out(stats, draft.tokens[:n] + [nxt], n, turn.source, stops, max_new):
                prefix.append(t)
                yield t
            if stats.finish_reason is not None:
                return
        stats.finish_reason = "length"

    def _turn(self, prefix: List[int], remaining: int, after_miss: bool) -> Turn:
        """Who drafts the next round, and how many: at most ``remaining - 1``
        (a round emits up to K + 1: never past max_new), none in a first round
        that is to give its token at once (``plain_first``)."""
        first = self.stats.rounds == 0
        cap = 0 if first and self.plain_first else min(self.length.k_max, remaining - 1)
        lag = self.drafter.lag(prefix) if self.length.auto else 1  # O(context): only a policy weighs it
        # A first round reads the prompt, or nothing when the target holds it with the row after it
        # (the prompt's measurement left it so): a round that ran no forward times none.
        t_lag = getattr(self.target_step, "lag", lambda p: len(p))(prefix) if first else 1
        view = SlotView(self.regime, cap, False, t_lag, lag, remaining, after_miss)
        return next_turn(prefix, view, self.drafter, self.length, self.lookup)

    def _draft(self, turn: Turn, prefix: List[int]) -> Draft:
        k = turn.k
        if k == 0:
            return Draft(forwards=[])
        p_min = self.p_min
        if p_min == "auto":  # from the costs of the policy that chose this round's drafter
            p_min = turn.length.p_min(self.regime)
        draft = turn.drafter.propose(prefix, k, None if p_min is None else float(p_min))
        if len(draft.tokens) > k:
            raise ValueError(f"the drafter returned {len(draft.tokens)} tokens, more than the k = {k} asked for")
        if self.sampler.rule == "exact" and draft.tokens and not draft.onehot:
            if draft.probs is None:
                raise ValueError("draft_step returned probs=None; sampling (greedy=False) needs "
                                 "the draft's [k, V] distribution")
            if np.ndim(draft.probs) != 2 or np.shape(draft.probs)[0] != len(draft.tokens):
                raise ValueError(f"draft_step returned probs of shape {np.shape(draft.probs)}; "
                                 f"expected ({len(draft.tokens)}, V) for {len(draft.tokens)} tokens")
        return draft

    @staticmethod
    def _check_target(target: object, n_proposed: int) -> None:
        shape = np.shape(target)
        if len(shape) != 2 or shape[0] != n_proposed + 1:
            raise ValueError(f"target_step returned shape {shape}; expected "
                             f"({n_proposed + 1}, V) for {n_proposed} proposed tokens")
