"""Drafting for a target whose tokenizer is not the draft's.

Most targets have no small sibling with their tokenizer. The draft can still
propose *text*: what matters to verification is only that proposals are
target tokens, and any proposal leaves the output exact (the verifier decides
on the target's rows alone, or on ``min(1, p/q)`` with q the distribution the
proposal was drawn from). How the proposals are made (after Timor et al.,
ICML 2025, arXiv 2502.05202):

* **Greedy, by text** (:meth:`CrossDrafter._by_text`): the draft continues
  its own tokenization of the accepted text by greedy steps; the text it adds
  is tokenized by the target, together with the last ``WINDOW`` target
  tokens so that a token straddling the boundary merges as the target's
  tokenizer merges it, and the target tokens that are complete become the
  proposals. Output is the target's greedy output whatever is proposed.
* **Sampling, by shared tokens** (:meth:`CrossDrafter._by_token`): the
  draft's row is restricted to the tokens whose strings are also single
  target tokens (:class:`VocabMap`) and laid out in the target's vocabulary
  (``-inf`` elsewhere); the generation's own sampler (rules, warp) turns it
  into q over the target's vocabulary and draws the proposal from q. Then q
  is a distribution over target tokens and the proposal is drawn from it,
  which is all the min(1, p/q) rule of Leviathan et al. needs for the output
  to follow p exactly: for any token x, P(emit x) = q(x) min(1, p(x)/q(x)) +
  P(reject) r(x) with r the normalized residual (p - q)+, which sums to p(x)
  (their Theorem 1; nothing in it asks q to come from a model with p's
  vocabulary, only that q be supported on it). The drafter-invariant race
  reads the target's rows and the shared noise only, so it stays invariant.

Either way the draft's own tokens follow the accepted text
(:meth:`CrossDrafter._sync`): its tokens are kept while the text they spell
agrees with the text accepted, and the rest of the text is tokenized by the
draft from there (backing off up to ``LOOKBEHIND`` tokens where that would
cut a word, so the word is tokenized whole, as the draft would have). The drafter owns this lag, as every
drafter does (:class:`~specgguf.ops.drafter.Drafter`).

Nothing here touches llama.cpp: a draft model is anything with ``eval(seq,
n_logits) -> [n_logits, V_draft]`` and ``lag(seq)``, and a vocabulary is a
:class:`Vocab` (:func:`specgguf.llama.vocab.vocab_of` makes one from a GGUF).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .drafter import Draft, Proposal, common_prefix
from .sampling import Sampler


@dataclass
class Vocab:
    """One tokenizer, as the cross-tokenizer drafter needs it.

    Attributes:
        pieces: ``[V]`` the bytes each token spells in ordinary text (b"" for
            control tokens: BOS, end-of-turn markers, unused ids).
        tokenize: ``text bytes -> token ids``, no BOS added, control-token
            names read as plain text.
        bos: the token a sequence starts with (None: none is added).
        shown: how control tokens read when a context is rendered as text
            for the other model (e.g. ``<start_of_turn>``); others: ``pieces``.
    """

    pieces: Sequence[bytes]
    tokenize: Callable[[bytes], List[int]]
    bos: Optional[int] = None
    shown: Dict[int, bytes] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pieces)

    def render(self, token: int) -> bytes:
        return self.shown.get(token, self.pieces[token])


class VocabMap:
    """The tokens two vocabularies share: same bytes, one token each.

    A string several ids spell (byte-fallback twins) maps to the id the
    owner's tokenizer gives that string alone. ``d2t[d]`` is the target id
    of draft token d, or -1; ``t2d`` the reverse.
    """

    def __init__(self, target: Vocab, draft: Vocab) -> None:
        index = self._index(target)
        d_index = self._index(draft)
        self.d2t = np.full(len(draft), -1, dtype=np.int64)
        self.t2d = np.full(len(target), -1, dtype=np.int64)
        for piece, d in d_index.items():
            t = index.get(piece)
            if t is not None:
                self.d2t[d], self.t2d[t] = t, d
        self.d_shared = np.flatnonzero(self.d2t >= 0)
        self.t_shared = self.d2t[self.d_shared]
        self.n_target = len(target)

    @staticmethod
    def _index(vocab: Vocab) -> Dict[bytes, int]:
        ids: Dict[bytes, List[int]] = {}
        for t, piece in enumerate(vocab.pieces):
            if piece:
                ids.setdefault(bytes(piece), []).append(t)
        out = {}
        for piece, ts in ids.items():
            if len(ts) > 1:
                alone = vocab.tokenize(piece)
                ts = alone if len(alone) == 1 and alone[0] in ts else ts
            out[piece] = ts[0]
        return out

    @property
    def shared(self) -> int:
        """How many draft tokens have a target twin."""
        return len(self.d_shared)

    def to_target(self, rows: np.ndarray) -> np.ndarray:
        """Draft logits ``[n, V_draft]`` float32 to target-width ``[n, V_target]``
        float32: each shared token's logit at its target id, ``-inf`` (no
        mass) at every other id."""
        out = np.full((rows.shape[0], self.n_target), -np.inf, dtype=np.float32)
        out[:, self.t_shared] = rows[:, self.d_shared]
        return out


class CrossDrafter:
    """A :class:`~specgguf.ops.drafter.Drafter` over a draft model with its own tokenizer.

    Args:
        model: the draft: ``eval(seq, n) -> [n, V_draft]`` float32 logits of
            its last n positions, ``lag(seq)`` (a
            :class:`~specgguf.llama.model.LlamaModel`).
        target, draft: the two vocabularies.
        vmap: their shared tokens (made here if None).

    ``sampler`` is the generation's (a copy bound to it per run, as for
    :class:`~specgguf.llama.adapter.ModelDrafter`): greedy drafts by text,
    every other rule by shared tokens (module docstring).
    """

    LOOKBEHIND = 2  # draft tokens of a word the text goes on with, tokenized again with the rest
    WINDOW = 2      # target tokens tokenized again with the draft's text (boundary merges)

    def __init__(self, model, target: Vocab, draft: Vocab, vmap: Optional[VocabMap] = None) -> None:
        self.model, self.target, self.draft = model, target, draft
        self.vmap = vmap or VocabMap(target, draft)
        self.sampler = Sampler()
        self.t_ids: List[int] = []    # the target context last rendered
        self.t_ends: List[int] = []   # its text's length after each token
        self.text = bytearray()       # its text
        self.d_ids: List[int] = []    # the draft's tokens for a prefix of some text
        self.d_ends: List[int] = []   # the text's length after each of them
        self.d_text = bytearray()     # the text they spell

    def lag(self, context: Sequence[int]) -> int:
        return self.model.lag(self._sync(context))

    def propose(self, context: Sequence[int], k: int, p_min: Optional[float] = None) -> Draft:
        seq = self._sync(context)
        t0 = time.perf_counter()
        if self.sampler.greedy:
            return self._by_text(list(context), seq, k, p_min, t0)
        return self._by_token(list(context), seq, k, p_min, t0)

    # -- the draft's tokens for the target's context ---------------------------------

    def _sync(self, context: Sequence[int]) -> List[int]:
        """The draft's tokens for ``context``'s text: the ones it has, while
        their text agrees, then the draft's tokenization of the rest."""
        c = common_prefix(self.t_ids, context)
        del self.t_ids[c:], self.t_ends[c:]
        del self.text[self.t_ends[-1] if self.t_ends else 0:]
        for t in context[c:]:
            self.t_ids.append(int(t))
            self.text += self.target.render(int(t))
            self.t_ends.append(len(self.text))
        if not self.d_ids and self.draft.bos is not None:
            self._extend_draft([self.draft.bos])  # spells nothing: always agrees
        agree = _common_bytes(self.d_text, self.text)
        keep = 0
        while keep < len(self.d_ids) and self.d_ends[keep] <= agree:
            keep += 1
        floor = 0 if self.draft.bos is None else 1
        for _ in range(self.LOOKBEHIND):  # a word cut where they part: tokenize it whole
            if keep <= floor or not _inside_word(self.text, self.d_ends[keep - 1]):
                break
            keep -= 1
        self._cut_draft(keep)
        if len(self.d_text) < len(self.text):
            self._extend_draft(self.draft.tokenize(bytes(self.text[len(self.d_text):])))
        return list(self.d_ids)

    def _cut_draft(self, keep: int) -> None:
        del self.d_ids[keep:], self.d_ends[keep:]
        del self.d_text[self.d_ends[-1] if self.d_ends else 0:]

    def _extend_draft(self, ids: Sequence[int]) -> None:
        for t in ids:
            self.d_ids.append(int(t))
            self.d_text += self.draft.pieces[int(t)]
            self.d_ends.append(len(self.d_text))

    # -- proposals -------------------------------------------------------------------

    def _by_text(self, context: List[int], seq: List[int], k: int, p_min: Optional[float], t0: float) -> Draft:
        """Greedy: the draft writes on, the target tokenizes what it wrote."""
        window = context[-self.WINDOW:]
        before = b"".join(self.target.render(t) for t in window)
        added = bytearray()
        ids: List[int] = []
        ends, sure = [], []  # after each draft token: the text's length, the draft's confidence in all of it
        out = Proposal(t0)
        for _ in range(2 * k + 2):  # the draft's tokens are often shorter than the target's
            lag = self.model.lag(seq)
            row = self.model.eval(seq, 1)[-1]
            out.forwarded(lag)
            tok = int(np.argmax(row))
            c = float(1.0 / np.exp(row - row[tok]).sum())
            piece = self.draft.pieces[tok]
            if not piece:  # an end of text, or a control token: the draft would stop here
                out.stop = "end"
                break
            if out.refuses(c, p_min):
                break
            seq.append(tok)
            added += piece
            ends.append(len(added))
            sure.append(c * (sure[-1] if sure else 1.0))
            ids = self._target_tokens(window, before, bytes(added))
            if len(ids) > k:  # the (k+1)-th began: the first k are complete
                break
        # Unless the draft ended its text, the last target token may still grow.
        ids = ids[:k] if out.stop == "end" else ids[:min(k, len(ids) - 1)]
        self._extend_draft(seq[len(self.d_ids):])
        return Draft(ids, None, False, out.stop if ids else "end", self._confidence(ids, ends, sure), out.forwards)

    def _confidence(self, ids: List[int], ends: List[int], sure: List[float]) -> List[float]:
        """Each target token's confidence: the draft's in all the text up to its end."""
        out, end, j = [], 0, 0
        for t in ids:
            end += len(self.target.pieces[t])
            while j < len(ends) - 1 and ends[j] < end:
                j += 1
            out.append(sure[j])
        return out

    def _target_tokens(self, window: List[int], before: bytes, added: bytes) -> List[int]:
        """The target's tokens for ``added`` after ``window``: tokenized with
        the window's text when the window comes back as it was, else alone."""
        ids = self.target.tokenize(before + added)
        if ids[:len(window)] == window:
            return ids[len(window):]
        return self.target.tokenize(added)

    def _by_token(self, context: List[int], seq: List[int], k: int, p_min: Optional[float], t0: float) -> Draft:
        """Sampling: one shared token per draft step, drawn by the
        generation's sampler from the draft's row in target space."""
        out = Proposal(t0)
        for _ in range(k):
            lag = self.model.lag(seq)
            row = self.vmap.to_target(self.model.eval(seq, 1)[-1:])[0]
            out.forwarded(lag)
            try:
                tok, c, q = self.sampler.pick(row, context)
            except ValueError:  # the generation's rules (a grammar) left no shared token
                out.stop = "end"
                break
            if out.refuses(c, p_min):
                break
            out.add(tok, c, q)
            context.append(tok)
            seq.append(int(self.vmap.t2d[tok]))  # a shared token: rows are -inf elsewhere
        self._extend_draft(seq[len(self.d_ids):])
        return out.draft()


def _inside_word(text: bytearray, i: int) -> bool:
    """Offset ``i`` cuts a word of ``text`` (letters or digits on both sides)."""
    return 0 < i < len(text) and text[i - 1:i].isalnum() and text[i:i + 1].isalnum()


def _common_bytes(a: bytearray, b: bytearray) -> int:
    """Length of the common prefix of two byte strings."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.frombuffer(bytes(a[:n]), dtype=np.uint8)
    y = np.frombuffer(bytes(b[:n]), dtype=np.uint8)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n
