"""K, the draft length, as one object built once from the settings.

A run asks its K object how many tokens each sequence drafts next round and
tells it how the round went; it never asks which kind of K it holds. Two
kinds answer the same calls:

* :class:`FixedK`: the caller's K, every round (within what a sequence may
  still emit); it learns nothing.
* :class:`~specgguf.engine.policy.Policy` (``k="auto"``): the K with the most
  expected tokens per second, from what it has measured.

:func:`draft_length` turns a setting (an int, ``"auto"`` or a policy) into
one of them.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Union

from ..checks import check_int
from .costs import Measured
from .policy import Policy, SlotView


class FixedK:
    """The caller's K: each sequence drafts ``min(k, its cap)`` (its cap: what
    it may still emit, less the round's own token). It learns nothing; what
    its rounds show of the draft goes on to ``teach`` if given (the engine's
    policy, which learns the draft from every request)."""

    fixed = True  # what a view of its sequence tells a policy pricing the round (SlotView.fixed)
    cold = False  # its K does not depend on what the caches hold

    def __init__(self, k: int, teach: Optional[Policy] = None) -> None:
        self.k_max, self.teach = check_int("k", k, 0), teach

    def begin(self, regime: str, prior: Optional[float] = None, record: Optional[dict] = None) -> None:
        pass

    def draft_lag(self, lag: Callable[[], int]) -> int:
        """1, a steady round's: nothing weighs it, and ``lag()`` costs O(context)."""
        return 1

    def choose(self, views: Sequence[SlotView]) -> List[int]:
        return [min(self.k_max, v.cap) for v in views]

    def observe(self, regime: str, drafted: int, accepted: int, after_miss: bool = False) -> None:
        if self.teach is not None:
            self.teach.observe(regime, drafted, accepted, after_miss)

    def read_back(self, regime: str, accepted: float, positions: int) -> None:
        if self.teach is not None:
            self.teach.read_back(regime, accepted, positions)

    def round_done(self, views: Sequence[SlotView], ks: Sequence[int], m: Optional[Measured]) -> None:
        pass

    def ended(self, emitted: int, at_budget: bool) -> None:
        pass

    def batches_to_time(self, v: SlotView) -> tuple:
        return ()

    def worth_measuring(self, v: SlotView, others: Sequence[SlotView] = ()) -> bool:
        return False

    def record(self, regime: str) -> Optional[dict]:
        return None

    def p_min(self, regime: str) -> Optional[float]:
        """No confidence cutoff of its own (``p_min="auto"`` needs ``k="auto"``)."""
        return None

    def explain(self, regime: str) -> Optional[str]:
        return None


DraftLength = Union[FixedK, Policy]


def draft_length(k: Union[int, str, Policy, FixedK], policy: Callable[[], Policy] = Policy,
                 teach: Optional[Policy] = None, p_min=None) -> DraftLength:
    """The K object for setting ``k``: a :class:`FixedK` for an int (teaching
    ``teach``), ``policy()`` for ``"auto"``, and a K object as it is (shared:
    what a policy learns carries over). ``p_min="auto"`` needs a policy: its
    cutoff comes from the policy's costs."""
    if isinstance(k, (Policy, FixedK)):
        length = k
    elif k == "auto":
        length = policy()
    elif isinstance(k, str):
        raise ValueError(f"k must be an int >= 0, 'auto' or a Policy, got {k!r}")
    else:
        length = FixedK(k, teach)
    if p_min == "auto" and length.fixed:
        raise ValueError("p_min='auto' is set by the draft policy's costs: use it with k='auto'")
    return length
