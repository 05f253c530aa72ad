"""The draft/verify loop over user callbacks, read top to bottom.

Each round: the draft proposes up to K tokens, the target scores the prefix
plus those K in one call, and the verifier keeps an accepted prefix plus one
correction or bonus token. Any pair of models composes through two callbacks:

    draft_step(prefix, k)          -> (tokens [<= k] ints, probs [len(tokens), V] or None[, info])
    target_step(prefix, proposed)  -> [len(proposed) + 1, V] float array

``info`` (optional dict): ``"onehot": True`` for point-mass proposals (n-gram
drafts: verified with :func:`~specgguf.accept_onehot`, probs may be None),
``"confidence"``: the draft's probability of each proposed token, ``"stop"``:
why drafting stopped (``"max"``, ``"cutoff"``, ``"end"``). When the decoder
has a confidence cutoff it calls ``draft_step(prefix, k, p_min=...)``.

``prefix`` is the whole sequence so far (prompt plus emitted tokens) as a new
list. ``target_step``'s row i scores the token after ``prefix + proposed[:i]``.
In greedy mode the rows may be logits (only the argmax is read) and the draft
``probs`` may be None; in sampling mode both must be the models' warped
distributions (non-negative masses), warped identically.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .policy import DraftPolicy
from .verify import GeneratorLike, accept, accept_onehot, as_generator, verify_greedy

DraftStep = Callable[..., tuple]
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
    k_hist: Dict[int, int] = field(default_factory=dict)
    stop_reasons: Dict[str, int] = field(default_factory=dict)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    verify_seconds: float = 0.0

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
            "k_hist": dict(sorted(self.k_hist.items())),
            "stop_reasons": dict(self.stop_reasons),
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "verify_seconds": self.verify_seconds,
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
        draft_step: ``(prefix, k) -> (tokens, probs[, info])``.
        target_step: ``(prefix, proposed) -> [len(proposed)+1, V]``.
        k: draft tokens per round (0 = plain target decoding), ``"auto"``
            (a :class:`~specgguf.policy.DraftPolicy` picks K each round to
            maximize expected tokens per second), or a ``DraftPolicy``.
        p_min: draft confidence cutoff passed to ``draft_step``: None, a
            float, or ``"auto"`` (learned by the policy; needs ``k="auto"``
            or a policy).
        greedy: True verifies with :func:`~specgguf.verify_greedy` (output is
            exactly greedy target decoding); False with
            :func:`~specgguf.accept` (output is distributed exactly as
            sampling the target).
        generator: ``numpy.random.Generator``, int seed or None (sampling only).

    After a call, ``stats`` holds that call's :class:`DecoderStats`.
    """

    def __init__(self, draft_step: DraftStep, target_step: TargetStep,
                 k: Union[int, str, DraftPolicy] = 4, greedy: bool = True,
                 generator: GeneratorLike = None, p_min: Union[None, float, str] = None) -> None:
        if not callable(draft_step) or not callable(target_step):
            raise TypeError("draft_step and target_step must be callables")
        self.draft_step = draft_step
        self.target_step = target_step
        self.greedy = bool(greedy)
        self.policy: Optional[DraftPolicy] = None
        if isinstance(k, DraftPolicy):
            self.policy = k
        elif k == "auto":
            # Costs from the clock only where it cannot change the output:
            # greedy, or sampling without a seed (a seed must reproduce).
            self.policy = DraftPolicy(online_costs=self.greedy or generator is None, p_min=p_min)
        elif isinstance(k, str):
            raise ValueError(f"k must be an int >= 0, 'auto' or a DraftPolicy, got {k!r}")
        self.k = self.policy.k_max if self.policy else _check_count("k", k, 0)
        if p_min == "auto" and self.policy is None:
            raise ValueError("p_min='auto' is learned by the draft policy: use it with k='auto'")
        if p_min is not None and p_min != "auto" and not 0.0 <= float(p_min) <= 1.0:
            raise ValueError(f"p_min must be None, 'auto' or in [0, 1], got {p_min!r}")
        self.p_min = p_min
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
        seen = 0  # how much of prefix the draft has evaluated (it catches up on the rest)
        while stats.emitted < max_new:
            # A round emits up to k+1 tokens: never draft past max_new.
            want = (self.policy.choose(max_new - stats.emitted, len(prefix) - seen) if self.policy
                    else self.k)
            k = min(want, max_new - stats.emitted - 1)
            t0 = time.perf_counter()
            tokens, probs, info = self._draft(prefix, k)
            t1 = time.perf_counter()
            target = self.target_step(list(prefix), list(tokens))
            t2 = time.perf_counter()
            self._check_target(target, len(tokens))
            if self.greedy:
                n, nxt = verify_greedy(target, tokens)
            elif info.get("onehot"):
                n, nxt = accept_onehot(target, tokens, self.generator)
            else:
                n, nxt = accept(target, probs, tokens, self.generator)
            stats.draft_seconds += t1 - t0
            stats.target_seconds += t2 - t1
            stats.verify_seconds += time.perf_counter() - t2
            stats.record(len(tokens), n)
            stats.k_hist[len(tokens)] = stats.k_hist.get(len(tokens), 0) + 1
            if k > 0:
                why = info.get("stop") or ("max" if len(tokens) == k else "end")
                if k < want and why == "max":
                    why = "max_new"
                stats.stop_reasons[why] = stats.stop_reasons.get(why, 0) + 1
            if self.policy:
                # The first round also evaluates the prompt: its times are not round costs.
                timed = stats.rounds > 1
                self.policy.update(len(tokens), n, info.get("confidence"),
                                   (t1 - t0) if timed else None, (t2 - t1) if timed else None)
            if k > 0:  # the draft evaluated prefix + tokens[:-1]; what was kept stays valid
                seen = len(prefix) + max(0, min(n, len(tokens) - 1))
            for t in tokens[:n] + [nxt]:
                prefix.append(t)
                stats.emitted += 1
                yield t
                if t in stops:
                    stats.finish_reason = "stop"
                    return
        stats.finish_reason = "length"

    def _draft(self, prefix: List[int], k: int) -> Tuple[List[int], Optional[np.ndarray], Dict[str, Any]]:
        if k == 0:
            return [], None, {}
        p_min = self.policy.p_min() if self.p_min == "auto" else self.p_min
        out = (self.draft_step(list(prefix), k) if p_min is None
               else self.draft_step(list(prefix), k, p_min=float(p_min)))
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise TypeError("draft_step must return a (tokens, probs) or (tokens, probs, info) tuple")
        tokens, probs = out[0], out[1]
        info = out[2] if len(out) == 3 else {}
        if not isinstance(info, dict):
            raise TypeError(f"draft_step's third value must be a dict, got {type(info).__name__}")
        try:
            tokens = [int(t) for t in tokens]
        except (TypeError, ValueError):
            raise TypeError("draft_step returned tokens that are not a sequence of ints") from None
        if len(tokens) > k:
            raise ValueError(f"draft_step returned {len(tokens)} tokens, more than the k = {k} asked for")
        if not self.greedy and tokens and not info.get("onehot"):
            if probs is None:
                raise ValueError("draft_step returned probs=None; sampling (greedy=False) needs "
                                 "the draft's [k, V] distribution")
            if np.ndim(probs) != 2 or np.shape(probs)[0] != len(tokens):
                raise ValueError(f"draft_step returned probs of shape {np.shape(probs)}; "
                                 f"expected ({len(tokens)}, V) for {len(tokens)} tokens")
        return tokens, probs, info

    @staticmethod
    def _check_target(target: object, n_proposed: int) -> None:
        shape = np.shape(target)
        if len(shape) != 2 or shape[0] != n_proposed + 1:
            raise ValueError(f"target_step returned shape {shape}; expected "
                             f"({n_proposed + 1}, V) for {n_proposed} proposed tokens")
