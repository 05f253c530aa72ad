"""The explicit one-off measurements of ``SpeculativeLlama.calibrate()``: the
draft's acceptance on a fixed text (:func:`measure_acceptance`; stored, a
prior for later runs) and the forward costs of a round's pieces on this
machine (:func:`calibrate`; shown with what they imply, never stored: the
draft policy times its own rounds, and a cost measured in one process is not
a fact about the next, see :mod:`specgguf.engine.policy`). Nothing runs them
unasked.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import numpy as np

from ..llama.adapter import ModelDrafter
from ..llama.model import LlamaModel
from ..ops.sampling import Sampler, rows_agreement


@dataclass
class ForwardCosts:
    """Seconds of a round's forwards: ``draft``, a draft forward within a
    round (``draft_first``: a round's first, a 2-token catch-up on cold
    weights; None: the same); ``target[b - 1]``, a target forward over b
    tokens (longer batches extrapolate linearly); ``draft_prefill``, per
    token the draft catches up on after plain rounds."""

    draft: float
    target: List[float] = field(default_factory=list)
    draft_prefill: float = 0.0
    draft_first: Optional[float] = None

    def draft_cost(self, k: int) -> float:
        first = self.draft if self.draft_first is None else self.draft_first
        return 0.0 if k <= 0 else first + (k - 1) * self.draft

    def target_cost(self, b: int) -> float:
        t = self.target
        return t[b - 1] if b <= len(t) else t[-1] + ((t[-1] - t[-2]) if len(t) > 1 else t[-1]) * (b - len(t))

    def round_cost(self, k: int) -> float:
        """A round at K = k: the draft's k forwards and the target's batch of k + 1."""
        return self.draft_cost(k) + self.target_cost(k + 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ForwardCosts":
        return cls(float(d["draft"]), [float(x) for x in d["target"]], float(d.get("draft_prefill", 0.0)),
                   None if d.get("draft_first") is None else float(d["draft_first"]))


CALIBRATION_TEXT = "Write a short essay about the history of the printing press.\n\n"


def calibrate(target: LlamaModel, draft: Optional[LlamaModel], k_max: int, reps: int = 7) -> ForwardCosts:
    """Time the forwards a round runs on this machine: a greedy 4-token
    drafting round right after a target forward (its first draft forward,
    a 2-token catch-up on cold weights, apart from the 3 after it), the draft
    catching up on skipped tokens, and target batches of 1..k_max+1 tokens
    (medians of ``reps``, interleaved: the policy compares these costs with
    each other, and on a shared machine the load drifts meanwhile). Leaves
    both caches empty."""
    bos = int(target.llm.token_bos())
    ctx = [bos] + [t if 0 <= t < target.model_vocab else 0 for t in (100 + i % 500 for i in range(159))]
    models = [m for m in (target, draft) if m is not None]
    tables = {"target": [[] for _ in range(k_max + 1)], "draft": [], "first": [], "prefill": []}
    drafter = ModelDrafter(draft) if draft is not None else None
    try:
        for m in models:
            m.reset()
            m.eval(ctx, 1)
        for rep in range(reps):
            fill = [8 + rep % 2] * 32  # other than last time's: a real catch-up of 32
            if drafter is not None:
                t0 = time.perf_counter()
                draft.eval(ctx + fill, 1)
                tables["prefill"].append((time.perf_counter() - t0) / 32)
            for b in range(1, k_max + 2):
                t0 = time.perf_counter()
                target.eval(ctx + [7] * b, b)  # cut back to ctx, then one forward of b
                tables["target"][b - 1].append(time.perf_counter() - t0)
            if drafter is not None:  # as a live round after all were accepted: 2, then 3 x 1
                t0 = time.perf_counter()
                first = drafter.propose(ctx + fill + [9, 10], 4).forwards[0][1]
                tables["first"].append(first)
                tables["draft"].append((time.perf_counter() - t0 - first) / 3)
    finally:
        for m in models:
            m.reset()
    med = lambda xs: float(np.median(xs)) if xs else 0.0  # noqa: E731
    if draft is None:  # an n-gram draft: a dictionary lookup
        return ForwardCosts(draft=1e-5 * med(tables["target"][0]), target=[med(t) for t in tables["target"]])
    return ForwardCosts(draft=med(tables["draft"]), target=[med(t) for t in tables["target"]],
                        draft_prefill=med(tables["prefill"]), draft_first=med(tables["first"]))


def measure_acceptance(target: LlamaModel, draft: LlamaModel, n: int = 48) -> dict:
    """The draft's per-token acceptance on a fixed text: the target's own
    greedy continuation (``n`` tokens) of CALIBRATION_TEXT, scored by both
    models in one batch each.

    Returns ``{"greedy": agreement of the two argmaxes, "sampled": mean
    sum(min(p, q)) at temperature 0.8 with the default warps}``: the
    acceptance exact verification has at those settings. Deterministic for
    given files and build. Leaves both caches empty.
    """
    seq = target.llm.tokenize(CALIBRATION_TEXT.encode(), add_bos=True, special=False)
    target.reset()
    draft.reset()
    try:
        for _ in range(n):
            seq.append(int(np.argmax(target.eval(seq, 1)[0])))
        # Row i of each predicts generated token i (the last token itself is never an input).
        t_logits = target.eval(seq[:-1], n)
        d_logits = draft.eval(seq[:-1], n)
    finally:
        target.reset()
        draft.reset()
    sampled = Sampler("exact", (0.8, 40, 0.95, 0.05))  # warp()'s default cuts at 0.8
    return {"greedy": rows_agreement(Sampler("greedy"), t_logits, d_logits),
            "sampled": rows_agreement(sampled, t_logits, d_logits), "temperature": 0.8}
