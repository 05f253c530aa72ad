"""Two llama.cpp models as the decoder's target and drafter, and the engine's drafter.

The target scores ``[last emitted token, d_1 .. d_K]`` in ONE ``llama_decode``
with logits at those K+1 positions only (:class:`LlamaTarget`); the model
drafter proposes token by token from its own KV cache and owns its lag
behind the accepted text, for one slot or several at once, one batched
forward per draft position (:class:`SlotDrafter`; :class:`ModelDrafter`
is its one-sequence face). Both go through
:class:`~specgguf.llama.model.LlamaModel`, which evaluates only what each
cache lacks. Both warp with the same :class:`~specgguf.ops.sampling.Sampler`,
which is what keeps sampling exact.

"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import llama_cpp
import numpy as np

from ..ops.drafter import Ask, Draft
from .model import LlamaModel
from ..ops.sampling import Sampler, agreement, rows_agreement


class LlamaTarget:
    """``target_step`` over a :class:`LlamaModel`: ``[len(proposed)+1, V]``
    float32 rows, logits when greedy, else warped probabilities."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.sampler = Sampler()

    def lag(self, prefix: Sequence[int]) -> int:
        """Tokens of ``prefix`` a call evaluates besides the proposals: those the cache
        lacks, and at least the last (its row scores the first proposal)."""
        return self.model.lag(prefix)

    def __call__(self, prefix: Sequence[int], proposed: Sequence[int]) -> np.ndarray:
        context = list(prefix) + list(proposed)
        logits = self.model.eval(context, len(proposed) + 1, proposed=len(proposed))
        return self.sampler.target_rows(logits, context)


class SlotDrafter:
    """A GGUF draft model as the rounds' drafter, for one slot or several: one
    batched ``llama_decode`` per draft position across the slots still
    drafting, the first also catching each one up; each slot picks its
    tokens with its own sampler (the argmax when greedy, a sample of the
    warped q for exact verification, the race winner for drafter-invariant
    verification) and stops at its own K or cutoff. The lag is what the
    model's KV cache lacks of the context. ``stock``: its forwards take
    llama.cpp's stock kernels where they are the faster for its weights
    (:func:`~specgguf.llama.model.stock_pays`) unless a sequence in them
    reads the draft's bits (:attr:`~specgguf.ops.sampling.Sampler.reads_draft_bits`);
    only where every target forward of the process is specgguf's, which take
    turns with it (:func:`~specgguf.llama.invariance.kernels`)."""

    CHECK_ROWS = 32  # tokens skipped that a catch-up reads the draft's rows back for

    def __init__(self, model: LlamaModel, stock: bool = False) -> None:
        self.model, self.stock = model, stock

    def _eval(self, work: Sequence[tuple], samplers) -> list:
        """The model's ``eval_many(work)`` for sequences of these ``samplers``,
        with the stock kernels where they may be used (a model on rpc workers,
        or any without ``stock_pays``, keeps its own)."""
        if self.stock and getattr(self.model, "stock_pays", False) and not any(s.reads_draft_bits for s in samplers):
            return self.model.eval_many(work, row_invariant=False)
        return self.model.eval_many(work)

    def lag(self, context: Sequence[int], slot: int = 0) -> int:
        return self.model.lag(context, slot)

    def propose(self, asks: Sequence[Ask]) -> tuple:
        """Each :class:`~specgguf.ops.drafter.Ask`'s (k 0: none; p_min None:
        no cutoff) :class:`~specgguf.ops.drafter.Draft` and the forwards run,
        ``[(tokens, seconds, sequences)]``."""
        drafts = [Draft(confidence=[], forwards=[]) for _ in asks]
        forwards, probs = [], [[] for _ in asks]
        seqs = {i: list(a.context) for i, a in enumerate(asks) if a.k > 0}
        # Catching up on tokens it skipped, the first forward also scores the last of them (up to
        # CHECK_ROWS; they are evaluated anyway, and the extra output rows cost a fraction of the
        # catch-up): a probe then learns the draft's acceptance on all of them, not only on the few
        # tokens it drafts.
        checked = {i: self._checked(seq, asks[i]) for i, seq in seqs.items()}
        while seqs:
            tokens = sum(self.model.lag(seq, asks[i].slot) for i, seq in seqs.items())
            t0 = time.perf_counter()
            rows = self._eval([(asks[i].slot, seq, 1 + checked.pop(i, 0)) for i, seq in seqs.items()],
                              [asks[i].sampler for i in seqs])
            forwards.append((tokens, time.perf_counter() - t0, len(seqs)))
            for (i, seq), row in zip(list(seqs.items()), rows):
                a, d = asks[i], drafts[i]
                if len(row) > 1:
                    d.catchup = agreement(a.sampler, row[:-1], seq, len(seq) - len(row) + 1)
                try:
                    tok, conf, q = a.sampler.pick(row[-1], seq)
                except ValueError:  # the draft found no token the rules allow: the target decides
                    d.stop = "end"
                    del seqs[i]
                    continue
                if a.p_min is not None and conf < a.p_min:
                    d.stop = "cutoff"
                    del seqs[i]
                    continue
                d.tokens.append(tok)
                d.confidence.append(conf)
                if q is not None:
                    probs[i].append(q)
                seq.append(tok)
                if len(d.tokens) >= a.k:
                    del seqs[i]
        for d, p in zip(drafts, probs):
            d.probs = np.stack(p) if p else None
        return drafts, forwards

    def _checked(self, seq: Sequence[int], ask: Ask) -> int:
        """Skipped tokens to score on the first forward: none after an
        ordinary round (it skips at most the correction, or the last draft
        token and the bonus, which follow a fully accepted round and would
        flatter the draft), else the last emitted ones, up to CHECK_ROWS."""
        lag = self.model.lag(seq, ask.slot)
        if lag <= 2:
            return 0
        return max(0, min(self.CHECK_ROWS, lag - 1, len(seq) - ask.sampler.origin))

    def read_head(self, slot: int, ids: Sequence[int], counts: Sequence[int], sampler: Sampler) -> list:
        """Time the draft's batches: it reads ``ids`` past what its cache holds
        in forwards of ``counts`` tokens, while they end before the last token
        (left to the round), for a sequence of ``sampler``. The tokens stay in
        the cache: the start of a catch-up. Returns ``[(tokens, seconds)]`` per
        forward run."""
        out, end = [], len(ids) - self.model.lag(ids, slot)
        for n in counts:
            if end + n >= len(ids):
                break
            end += n
            t0 = time.perf_counter()
            self._eval([(slot, ids[:end], 1)], [sampler])
            out.append((n, time.perf_counter() - t0))
        return out

    def agreement(self, work: Sequence[tuple]) -> tuple:
        """``work``: ``(slot, prompt ids, sampler, the target's rows [n, V] for
        its positions before the last)``: the draft catches up on each prompt
        (but its last token), scoring the same positions in one forward.
        Returns each one's ``(acceptance, positions)`` over its text's rows
        (:func:`text_agreement`; None: too few) and the forward run,
        ``(tokens, seconds, sequences)``."""
        tokens = sum(self.model.lag(ids[:-1], slot, len(t_rows)) for slot, ids, _, t_rows in work)
        t0 = time.perf_counter()
        rows = self._eval([(slot, ids[:-1], len(t_rows)) for slot, ids, _, t_rows in work],
                          [sampler for _, _, sampler, _ in work])
        forward = (tokens, time.perf_counter() - t0, len(work))
        return [text_agreement(self.model, ids, sampler, t_rows, d)
                for (_, ids, sampler, t_rows), d in zip(work, rows)], forward


class ModelDrafter:
    """A :class:`~specgguf.ops.drafter.Drafter` over a GGUF draft model: the
    :class:`SlotDrafter` for one sequence, its tokens picked by ``sampler``
    (:meth:`~specgguf.llama.pair.ModelPair.bound` gives each run a copy bound
    to its own); what :class:`~specgguf.api.draft_model.DraftModel` and
    calibration draft with."""

    CHECK_ROWS = SlotDrafter.CHECK_ROWS

    def __init__(self, model: LlamaModel) -> None:
        # row-invariant kernels: beside DraftModel the target's forwards are the Llama's, not specgguf's,
        # and do not take turns with the draft's (the pair's rounds use a SlotDrafter of their own)
        self.model, self.slots = model, SlotDrafter(model)
        self.sampler = Sampler()

    def lag(self, context: Sequence[int]) -> int:
        return self.model.lag(context)

    def propose(self, context: Sequence[int], k: int, p_min: Optional[float] = None) -> Draft:
        (draft,), forwards = self.slots.propose([Ask(0, context, self.sampler, k, p_min, 0)])
        draft.forwards = [(n, seconds) for n, seconds, _ in forwards]
        return draft


def text_rows(model: LlamaModel, ids: Sequence[int], n: int) -> np.ndarray:
    """Which of the rows for the last ``n`` positions before a prompt's last
    token (row i predicts ``ids[len(ids) - n + i]``) score text, as bool
    ``[n]``: not a row predicting a control token (the end of a turn) nor one
    whose last three tokens hold one (a turn's header: its role's name, the
    newline after it). Any two models agree on a chat template's tokens:
    with them, a Q2_K draft that accepts 0.5 of its answers measured 0.68 on
    its prompts and drafted at a loss."""
    start, size = len(ids) - n - 3, model.model_vocab  # ids past the vocabulary (a padded row): text
    control = [False] * max(0, -start) + [0 <= int(t) < size and bool(llama_cpp.llama_vocab_is_control(
        model.vocab, int(t))) for t in ids[max(0, start):]]
    # control[i + 3] is the token row i predicts; control[i:i + 3], the last three it reads
    return np.array([not any(control[i:i + 4]) for i in range(n)], dtype=bool)


def text_agreement(model: LlamaModel, ids: Sequence[int], sampler: Sampler, t_rows: np.ndarray,
                   d_rows: np.ndarray) -> Optional[tuple]:
    """``(acceptance, positions)`` of the draft over the rows of a prompt's
    text (:func:`text_rows`, by ``model``'s vocabulary) among paired rows
    ``[n, V]`` for its last positions before the last token; None for fewer
    than 4 such rows."""
    keep = text_rows(model, ids, len(t_rows))
    if keep.sum() < 4:
        return None
    return rows_agreement(sampler, t_rows[keep], d_rows[keep]), int(keep.sum())
