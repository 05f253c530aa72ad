"""Two llama.cpp models as the decoder's target and drafter.

The target scores ``[last emitted token, d_1 .. d_K]`` in ONE ``llama_decode``
with logits at those K+1 positions only (:class:`LlamaTarget`); the model
drafter proposes token by token from its own KV cache and owns its lag
behind the accepted text (:class:`ModelDrafter`). Both go through
:class:`~specgguf.llama.model.LlamaModel`, which evaluates only what each
cache lacks. Both warp with the same :class:`~specgguf.ops.sampling.Sampler`,
which is what keeps sampling exact.

"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from ..ops.drafter import Draft, Proposal
from .model import LlamaModel
from ..ops.sampling import Sampler, agreement


class LlamaTarget:
    """``target_step`` over a :class:`LlamaModel`: ``[len(proposed)+1, V]``
    float32 rows, logits when greedy, else warped probabilities."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.sampler = Sampler()
        self.warp_seconds = 0.0

    def __call__(self, prefix: Sequence[int], proposed: Sequence[int]) -> np.ndarray:
        context = list(prefix) + list(proposed)
        logits = self.model.eval(context, len(proposed) + 1)
        t0 = time.perf_counter()
        rows = self.sampler.target_rows(logits, context)
        self.warp_seconds += time.perf_counter() - t0
        return rows


class ModelDrafter:
    """A :class:`~specgguf.ops.drafter.Drafter` over a GGUF draft model.

    Each token is picked by the shared :class:`~specgguf.ops.sampling.Sampler`:
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
        out = Proposal(time.perf_counter())
        checked, catchup = self._checked(seq), None
        for _ in range(k):
            # Catching up on tokens it skipped, the first forward also scores the
            # last of them (up to CHECK_ROWS; they are evaluated anyway, and the
            # extra output rows cost a fraction of the catch-up): a probe then
            # learns the draft's acceptance on all of them, not only on the few
            # tokens it drafts.
            first = out.first is None
            rows = self.model.eval(seq, 1 + (checked if first else 0))
            if first and checked:
                catchup = agreement(self.sampler, rows[:-1], seq, len(seq) - checked)
            out.forwarded()  # the read-back is part of the catch-up's cost
            tok, c, q = self.sampler.pick(rows[-1], seq)
            if out.refuses(c, p_min):
                break
            out.add(tok, c, q)
            seq.append(tok)
        return out.draft(catchup)

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
    (:attr:`~specgguf.ops.drafter.Draft.catchup`)."""
    n = min(m, len(ids) - 2, target.lag(ids[:-1]))
    if n < 4:
        return None
    t_rows, d_rows = target.eval(ids[:-1], n), draft.eval(ids[:-1], n)
    if sampler.greedy:
        return float(np.mean(np.argmax(t_rows, axis=1) == np.argmax(d_rows, axis=1))), n
    overlap = np.minimum(sampler.warp(t_rows), sampler.warp(d_rows)).sum(axis=1, dtype=np.float64)
    return float(np.mean(overlap if sampler.rule == "exact" else overlap / (2.0 - overlap))), n
