"""The draft/verify loop over user callbacks, read top to bottom.

Each round: the draft proposes up to K tokens, the target scores the prefix
plus those K in one call, and the verifier keeps an accepted prefix plus one
correction or bonus token. Any pair of models composes through two callbacks:

    draft_step(prefix, k)          -> (tokens [<= k] ints, probs [len(tokens), V] or None)
    target_step(prefix, proposed)  -> [len(proposed) + 1, V] float array

``prefix`` is the whole sequence so far (prompt plus emitted tokens) as a new
list. ``target_step``'s row i scores the token after ``prefix + proposed[:i]``.
In greedy mode the rows may be logits (only the argmax is read) and the draft
``probs`` may be None; in sampling mode both must be the models' warped
distributions (non-negative masses), warped identically.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .verify import GeneratorLike, accept, as_generator, verify_greedy

DraftStep = Callable[[List[int], int], Tuple[Sequence[int], Optional[np.ndarray]]]
TargetStep = Callable[[List[int], List[int]], np.ndarray]


@dataclass
class DecoderStats:
    """Counts of one ``generate``/``stream`` call.

    ``accepted_hist[n]`` counts rounds that accepted n drafts;
    ``position_drafted[i]`` / ``position_accepted[i]`` count rounds that
    drafted / accepted draft position i (0-based).
    """

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    finish_reason: Optional[str] = None
    accepted_hist: List[int] = field(default_factory=list)
    position_drafted: List[int] = field(default_factory=list)
    position_accepted: List[int] = field(default_factory=list)

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

    def record(self, drafted: int, accepted: int) -> None:
        """Add one verification round that drafted ``drafted`` and accepted ``accepted``."""
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

    def as_dict(self) -> dict:
        """Plain dict of every count and derived rate (for JSON output)."""
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "finish_reason": self.finish_reason,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted": self.mean_accepted,
            "accepted_hist": list(self.accepted_hist),
            "position_acceptance": self.position_acceptance,
        }


def _check_count(name: str, value: object, low: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


class SpeculativeDecoder:
    """Speculative decoding over two callbacks (see the module docstring).

    Args:
        draft_step: ``(prefix, k) -> (tokens, probs)``.
        target_step: ``(prefix, proposed) -> [len(proposed)+1, V]``.
        k: maximum draft tokens per round (0 = plain target decoding).
        greedy: True verifies with :func:`~specgguf.verify_greedy` (output is
            exactly greedy target decoding); False with
            :func:`~specgguf.accept` (output is distributed exactly as
            sampling the target).
        generator: ``numpy.random.Generator``, int seed or None (sampling only).

    After a call, ``stats`` holds that call's :class:`DecoderStats`.
    """

    def __init__(self, draft_step: DraftStep, target_step: TargetStep, k: int = 4,
                 greedy: bool = True, generator: GeneratorLike = None) -> None:
        if not callable(draft_step) or not callable(target_step):
            raise TypeError("draft_step and target_step must be callables")
        self.draft_step = draft_step
        self.target_step = target_step
        self.k = _check_count("k", k, 0)
        self.greedy = bool(greedy)
        self.generator = as_generator(generator)
        self.stats = DecoderStats()

    def generate(self, prompt_ids: Sequence[int], max_new: int = 128,
                 stop_tokens: Sequence[int] = ()) -> List[int]:
        """Decode up to ``max_new`` new tokens after ``prompt_ids``.

        Returns the new token ids (a stop token, if hit, is included last).
        """
        return list(self.stream(prompt_ids, max_new, stop_tokens))

    def stream(self, prompt_ids: Sequence[int], max_new: int = 128,
               stop_tokens: Sequence[int] = ()) -> Iterator[int]:
        """Like :meth:`generate`, yielding each token as its round completes."""
        prefix = [int(t) for t in prompt_ids]
        if not prefix:
            raise ValueError("prompt_ids must hold at least one token")
        max_new = _check_count("max_new", max_new, 0)
        stops = frozenset(int(t) for t in stop_tokens)
        self.stats = stats = DecoderStats()
        while stats.emitted < max_new:
            # A round emits up to k+1 tokens: never draft past max_new.
            k = min(self.k, max_new - stats.emitted - 1)
            tokens, probs = self._draft(prefix, k)
            target = self.target_step(list(prefix), list(tokens))
            self._check_target(target, len(tokens))
            if self.greedy:
                n, nxt = verify_greedy(target, tokens)
            else:
                n, nxt = accept(target, probs, tokens, self.generator)
            stats.record(len(tokens), n)
            for t in tokens[:n] + [nxt]:
                prefix.append(t)
                stats.emitted += 1
                yield t
                if t in stops:
                    stats.finish_reason = "stop"
                    return
        stats.finish_reason = "length"

    def _draft(self, prefix: List[int], k: int) -> Tuple[List[int], Optional[np.ndarray]]:
        if k == 0:
            return [], None
        out = self.draft_step(list(prefix), k)
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError("draft_step must return a (tokens, probs) tuple")
        tokens, probs = out
        try:
            tokens = [int(t) for t in tokens]
        except (TypeError, ValueError):
            raise TypeError("draft_step returned tokens that are not a sequence of ints") from None
        if len(tokens) > k:
            raise ValueError(f"draft_step returned {len(tokens)} tokens, more than the k = {k} asked for")
        if not self.greedy and tokens:
            if probs is None:
                raise ValueError("draft_step returned probs=None; sampling (greedy=False) needs "
                                 "the draft's [k, V] distribution")
            if np.ndim(probs) != 2 or np.shape(probs)[0] != len(tokens):
                raise ValueError(f"draft_step returned probs of shape {np.shape(probs)}; "
                                 f"expected ({len(tokens)}, V) for {len(tokens)} tokens")
        return tokens, probs

    @staticmethod
    def _check_target(target: object, n_proposed: int) -> None:
        shape = np.shape(target)
        if len(shape) != 2 or shape[0] != n_proposed + 1:
            raise ValueError(f"target_step returned shape {shape}; expected "
                             f"({n_proposed + 1}, V) for {n_proposed} proposed tokens")
