"""Speculative decoding of one sequence over any pair of models.

Each round (:meth:`~specgguf.engine.rounds.Rounds.play`, the loop the
engine runs over several sequences too): the drafter proposes up to K
tokens, the target scores the prefix plus those K in one call, and the
sampler's rule keeps an accepted prefix plus one correction or bonus token.
Any pair of models composes:

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

from typing import Callable, Iterator, List, Optional, Sequence, Union

import numpy as np

from ..checks import check_int, check_p_min
from ..ops.drafter import Drafter, CallbackDrafter, EachDrafter
from ..ops.sampling import Sampler
from ..ops.verify import GeneratorLike
from .draft_length import FixedK, draft_length
from .lookup_first import LookupFirst
from .policy import Policy
from .rounds import Request, Rounds, one_sequence
from .stats import DecoderStats

TargetStep = Callable[[List[int], List[int]], np.ndarray]


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
        self.length = draft_length(k, lambda: Policy(clock=self.sampler.rule != "exact" or generator is None),
                                   p_min=p_min)
        self.p_min = check_p_min(p_min)
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
        self.sampler.restart()  # a grammar starts over with each text
        lookup = self.lookup
        req = Request(prefix, max_new, frozenset(int(t) for t in stop_tokens), self.sampler, self.regime,
                      self.length, lookup.length if lookup else None, self.p_min, self.plain_first)
        self.stats = req.stats
        rounds = Rounds(StepTarget(self.target_step), EachDrafter(self.drafter), [lookup.lookup] if lookup else None)
        return one_sequence(rounds, req)


class StepTarget:
    """A ``target_step(prefix, proposed)`` as the rounds' target (one
    sequence): its rows are what the verifier reads (``warped``), checked
    for shape; what it lags by, its ``lag(prefix)`` in the first round (a
    step without one: the whole prompt), then the last token."""

    warped = True

    def __init__(self, step: TargetStep) -> None:
        self.step, self.first = step, True

    def lag(self, seq: Sequence[int], slot: int = 0) -> int:
        return getattr(self.step, "lag", len)(seq) if self.first else 1

    def eval_many(self, work: Sequence[tuple]) -> List[np.ndarray]:
        (_, seq, _, n_proposed), = work
        cut = len(seq) - n_proposed
        rows = self.step(list(seq[:cut]), list(seq[cut:]))
        shape = np.shape(rows)
        if len(shape) != 2 or shape[0] != n_proposed + 1:
            raise ValueError(f"target_step returned shape {shape}; expected "
                             f"({n_proposed + 1}, V) for {n_proposed} proposed tokens")
        self.first = False
        return [rows]
