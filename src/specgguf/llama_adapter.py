"""Two llama.cpp models as the decoder's target and drafter.

The target scores ``[last emitted token, d_1 .. d_K]`` in ONE ``llama_decode``
with logits at those K+1 positions only (:class:`LlamaTarget`); the model
drafter proposes token by token from its own KV cache and owns its lag
behind the accepted text (:class:`ModelDrafter`). Both go through
:class:`~specgguf.llama_model.LlamaModel`, which evaluates only what each
cache lacks. Both warp with the same :class:`~specgguf.sampling.Sampler`,
which is what keeps sampling exact.

Also here: the explicit one-off measurements (:func:`calibrate`,
:func:`measure_acceptance`) that ``SpeculativeLlama.calibrate()`` stores.
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

import numpy as np

from .drafter import Draft
from .llama_model import LlamaModel
from .policy import CostModel
from .sampling import Sampler, warp


class LlamaTarget:
    """``target_step`` over a :class:`LlamaModel`: ``[len(proposed)+1, V]``
    float32 rows, logits when greedy, else warped probabilities."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.sampler = Sampler()
        self.warp_seconds = 0.0

    def __call__(self, prefix: Sequence[int], proposed: Sequence[int]) -> np.ndarray:
        logits = self.model.eval(list(prefix) + list(proposed), len(proposed) + 1)
        t0 = time.perf_counter()
        rows = self.sampler.warp(logits)
        self.warp_seconds += time.perf_counter() - t0
        return rows


class ModelDrafter:
    """A :class:`~specgguf.drafter.Drafter` over a GGUF draft model.

    Each token is picked by the shared :class:`~specgguf.sampling.Sampler`:
    the argmax when greedy, a sample of the warped q for exact verification,
    the race winner for drafter-invariant verification. The lag is what the
    model's KV cache lacks of the context.
    """

    CHECK_ROWS = 32  # tokens skipped that a catch-up reads the draft's rows back for

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.sampler = Sampler()

    def lag(self, context: Sequence[int]) -> int:
        return self.model.lag(context)

    def propose(self, context: Sequence[int], k: int, p_min: Optional[float] = None) -> Draft:
        seq = list(context)
        tokens: List[int] = []
        probs, conf = [], []
        stop = "max"
        first, t0 = None, time.perf_counter()
        checked, catchup = self._checked(seq), None
        for _ in range(k):
            # Catching up on tokens it skipped, the first forward also scores the
            # last of them (up to CHECK_ROWS; they are evaluated anyway, and the
            # extra output rows cost a fraction of the catch-up): a probe then
            # learns the draft's acceptance on all of them, not only on the few
            # tokens it drafts.
            rows = self.model.eval(seq, 1 + (checked if first is None else 0))
            if first is None:  # the read-back is part of the catch-up's cost
                if checked:
                    catchup = self.sampler.agreement(rows[:-1], seq, len(seq) - checked)
                first = time.perf_counter() - t0
            row = rows[-1]
            tok, c, q = self.sampler.pick(row, len(seq))
            if p_min is not None and c < p_min:
                stop = "cutoff"
                break
            tokens.append(tok)
            conf.append(c)
            if q is not None:
                probs.append(q)
            seq.append(tok)
        return Draft(tokens, np.stack(probs) if probs else None, False, stop, conf, first, catchup)

    def _checked(self, seq: Sequence[int]) -> int:
        """Skipped tokens to score on the first forward: none after an
        ordinary round (it skips at most the correction, or the last draft
        token and the bonus, which follow a fully accepted round and would
        flatter the draft), else the last emitted ones, up to CHECK_ROWS."""
        lag = self.model.lag(seq)
        if lag <= 2:
            return 0
        return max(0, min(self.CHECK_ROWS, lag - 1, len(seq) - self.sampler.origin))


def prompt_agreement(target: LlamaModel, draft: LlamaModel, ids: Sequence[int], sampler: Sampler,
                     m: int = 32) -> Optional[tuple]:
    """The draft's acceptance on the prompt itself, measured on the way into
    a first generation: both models score the prompt's last ``m`` positions
    (the target evaluates the prompt anyway; the draft catches up on it, as it
    would before its first proposal), and the rows are compared as the
    sampler's rule would: argmax agreement (greedy), sum(min(p, q)) (exact),
    or the race's lower bound s / (2 - s) (drafter-invariant). Returns
    ``(acceptance, positions measured)``; None for a prompt too short to say.
    The last prompt token is left to the first round, so the target does no
    work twice; positions the target holds already (a prompt seen before,
    a conversation's earlier turns) are not measured: scoring them again
    cost a first call on a cached prompt 0.46 s here, 5% of four calls. The
    draft's read-back of what it catches up on measures them instead
    (:attr:`~specgguf.drafter.Draft.catchup`)."""
    n = min(m, len(ids) - 2, target.lag(ids[:-1]))
    if n < 4:
        return None
    t_rows, d_rows = target.eval(ids[:-1], n), draft.eval(ids[:-1], n)
    if sampler.greedy:
        return float(np.mean(np.argmax(t_rows, axis=1) == np.argmax(d_rows, axis=1))), n
    overlap = np.minimum(sampler.warp(t_rows), sampler.warp(d_rows)).sum(axis=1, dtype=np.float64)
    return float(np.mean(overlap if sampler.rule == "exact" else overlap / (2.0 - overlap))), n


CALIBRATION_TEXT = "Write a short essay about the history of the printing press.\n\n"


def calibrate(target: LlamaModel, draft: Optional[LlamaModel], k_max: int, reps: int = 7) -> CostModel:
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
                first = drafter.propose(ctx + fill + [9, 10], 4).first_seconds
                tables["first"].append(first)
                tables["draft"].append((time.perf_counter() - t0 - first) / 3)
    finally:
        for m in models:
            m.reset()
    med = lambda xs: float(np.median(xs)) if xs else 0.0  # noqa: E731
    if draft is None:  # an n-gram draft: a dictionary lookup
        return CostModel(draft=1e-5 * med(tables["target"][0]), target=[med(t) for t in tables["target"]],
                         seconds=True, draft_prefill=0.0)
    return CostModel(draft=med(tables["draft"]), target=[med(t) for t in tables["target"]], seconds=True,
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
    greedy = float(np.mean(np.argmax(t_logits, axis=1) == np.argmax(d_logits, axis=1)))
    p, q = warp(t_logits, 0.8), warp(d_logits, 0.8)
    return {"greedy": greedy, "sampled": float(np.mean(np.minimum(p, q).sum(axis=1))),
            "temperature": 0.8}
