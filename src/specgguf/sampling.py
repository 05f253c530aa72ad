"""Choosing tokens: the warp applied identically to both models, and the
:class:`Sampler` that holds the one rule a generation verifies drafts by.

Warp order as llama-cpp-python's default sampler chain: top-k, then top-p and
min-p on the softmax of the (untempered) survivors, then temperature on what
is left. Temperature 0 means greedy and never reaches the warp.
"""

from __future__ import annotations

import numbers
import secrets
from typing import Optional, Tuple

import numpy as np

from . import _core
from .drafter import Draft
from .verify import GeneratorLike, accept, accept_invariant, accept_onehot, as_generator, race_pick, verify_greedy

RULES = ("greedy", "exact", "invariant")


def warp(logits: np.ndarray, temperature: float, top_k: int = 40, top_p: float = 0.95,
         min_p: float = 0.05) -> np.ndarray:
    """Warp logits into sampling probabilities (compiled: ``cpp/warp.cpp``).

    Args:
        logits: ``[n, V]`` float32 (``-inf`` allowed: padding/masked tokens).
        temperature: > 0.
        top_k: keep the k largest logits, ties to the lower index (0 or >= V: all).
        top_p: keep the smallest prefix (by probability) whose mass reaches top_p.
        min_p: keep tokens with probability >= min_p * the top probability.

    Returns:
        ``[n, V]`` float32 probabilities, zero outside each row's kept set.

    Raises:
        TypeError: a setting of the wrong type.
        ValueError: bad settings, or a row with NaN/+inf or no finite logit.
    """
    if not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return _core.warp(logits, float(temperature), int(top_k), float(top_p), float(min_p))


class Sampler:
    """The rule by which one generation picks and verifies tokens.

    Args:
        rule: ``"greedy"`` (argmax; rows may be logits), ``"exact"`` (the
            min(1, p/q) rule of Leviathan et al., with ``generator``) or
            ``"invariant"`` (the shared-noise race with ``seed``: the output
            is plain seeded sampling's, whatever the draft).
        warping: ``(temperature, top_k, top_p, min_p)``; unused when greedy.
        generator: the verifier's random source (exact rule).
        draft_generator: the draft's own random source (exact rule).
        seed: the race's seed (invariant rule; None: fresh entropy).
        origin: the prompt's length; output position = context length - origin.
    """

    def __init__(self, rule: str = "greedy", warping: Tuple[float, int, float, float] = (1.0, 0, 1.0, 0.0), *,
                 generator: GeneratorLike = None, draft_generator: GeneratorLike = None,
                 seed: Optional[int] = None, origin: int = 0) -> None:
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
        self.rule = rule
        self.warping = warping
        self.generator = as_generator(generator)
        self.draft_generator = as_generator(draft_generator)
        self.seed = secrets.randbits(64) if seed is None and rule == "invariant" else seed
        self.origin = origin

    @classmethod
    def from_config(cls, config, origin: int = 0) -> "Sampler":
        """The sampler a :class:`~specgguf.config.GenerationConfig` asks for.
        With the exact rule and a seed, the verifier draws from ``seed`` and
        the draft from ``seed + 1`` (two independent streams)."""
        seed = config.seed
        return cls(config.verification, (config.temperature, config.top_k, config.top_p, config.min_p),
                   generator=seed, draft_generator=None if seed is None else (seed + 1) % 2**64,
                   seed=seed, origin=origin)

    @property
    def greedy(self) -> bool:
        return self.rule == "greedy"

    def warp(self, logits: np.ndarray) -> np.ndarray:
        """``[n, V]`` logits to what the verifier reads: the logits themselves
        when greedy, else the warped probabilities."""
        return logits if self.greedy else warp(logits, *self.warping)

    def pick(self, logits: np.ndarray, context_len: int) -> Tuple[int, float, Optional[np.ndarray]]:
        """The draft's token after a context of ``context_len`` tokens, from its
        ``[V]`` logits: ``(token, confidence, q)``; q (``[V]`` float32) only
        for the exact rule, which verifies against it."""
        if self.greedy:
            tok = int(np.argmax(logits))
            return tok, float(1.0 / np.exp(logits - logits[tok]).sum()), None
        q = warp(logits[None, :], *self.warping)[0]
        if self.rule == "invariant":
            tok = int(race_pick(q[None, :], self.seed, context_len - self.origin)[0])
            return tok, float(q[tok]), None
        cum = np.cumsum(q, dtype=np.float64)
        tok = int(min(np.searchsorted(cum, self.draft_generator.random() * cum[-1], side="right"), len(q) - 1))
        return tok, float(q[tok]), q

    def verify(self, target: np.ndarray, draft: Draft, position: int) -> Tuple[int, int]:
        """``(n_accepted, next_token)`` for target rows ``[len(draft.tokens)+1, V]``
        at output ``position`` (tokens generated before this round)."""
        if self.rule == "greedy":
            return verify_greedy(target, draft.tokens)
        if self.rule == "invariant":
            return accept_invariant(target, draft.tokens, self.seed, position)
        if draft.onehot:
            return accept_onehot(target, draft.tokens, self.generator)
        return accept(target, draft.probs, draft.tokens, self.generator)
