"""What plain decoding does to a row of logits before the warp, as one rule per position.

llama-cpp-python's sampler chain (``Llama._init_sampler``) applies, in this
order: ``logit_bias`` (added to the logits), the repetition penalties over
the last ``penalty_last_n`` generated tokens (llama.cpp's
``llama_sampler_penalties``), and the grammar (llama.cpp's own engine:
``llama_sampler_init_grammar``, which sets a forbidden token's logit to
-inf; :class:`~specgguf.llama.grammar.Grammar`); then top-k/top-p/min-p/temperature, or the argmax. Every one of them
is a function of the tokens generated before the position, so speculative
decoding applies the same :class:`LogitRules` to each of the K+1 rows it
verifies (row i given the history plus the draft tokens before it), and to
the draft's own rows: verification then compares the very distributions
plain decoding samples, and the output's law is plain decoding's with the
same settings.

:class:`Logprobs` keeps what the API reports for each emitted token: the
log-softmax of the target's raw logits at its position (as
llama-cpp-python's ``logprobs`` and llama-server's pre-sampling
probabilities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class Penalties:
    """llama.cpp's repetition penalties (``llama_sampler_init_penalties``).

    For each token seen ``c > 0`` times among the last ``last_n`` generated
    tokens (the prompt is not counted, as in llama-cpp-python), in float32:
    ``logit = logit * repeat if logit <= 0 else logit / repeat``, then
    ``logit -= c * frequency + presence``.
    """

    repeat: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    last_n: int = 64

    @property
    def active(self) -> bool:
        return self.last_n != 0 and (self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0)

    def apply(self, row: np.ndarray, generated: Sequence[int]) -> None:
        """Penalise ``row`` (``[V]`` float32, in place) after ``generated``."""
        window = generated[-self.last_n:] if self.last_n > 0 else generated
        if not self.active or len(window) == 0:
            return
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        keep = ids < len(row)
        ids, counts = ids[keep], counts[keep].astype(np.float32)
        logit = row[ids]
        logit = np.where(logit <= 0, logit * np.float32(self.repeat), logit / np.float32(self.repeat))
        row[ids] = logit - (counts * np.float32(self.frequency) + np.float32(self.presence))


@dataclass(frozen=True)
class Cut:
    """What of a row the warp reads (:func:`~specgguf.ops.sampling.warp`'s
    truncation; ``top_k=1``: greedy's argmax), so that a grammar checks only
    the candidates that decide it.

    Checked best first, a grammar may stop once the tokens it has not
    checked (every logit below the last checked one) cannot change what the
    warp keeps, whichever of them it would allow: past ``top_k`` allowed
    ones; or, when fewer are allowed (a JSON state allows a handful of the
    49152 tokens), once min-p drops every unchecked token and top-p's cut,
    at any total mass the unchecked could add, keeps the same checked
    tokens. Without this a state allowing fewer than ``top_k`` tokens cost
    a full pass (~10 ms at V=49152) per row.
    """

    top_k: int = 0      # 0: no top-k
    top_p: float = 1.0
    min_p: float = 0.0

    SLACK = 1e-4  # relative: the warp sums float32 in its own order; a decision this close is not taken

    def settled(self, allowed: np.ndarray, below: float, unchecked: int) -> bool:
        """Whether the warp keeps the same tokens whatever the grammar says of
        ``unchecked`` more tokens, each with a logit under ``below``, given
        the logits of the checked tokens it allows (``allowed``, best first)."""
        n = len(allowed)
        if n == 0:
            return False
        if unchecked == 0 or (self.top_k and n >= self.top_k):
            return True
        m = np.exp(np.asarray(allowed, dtype=np.float64) - float(allowed[0]))  # masses at temperature 1
        m_below = math.exp(min(0.0, below - float(allowed[0]))) * (1.0 + self.SLACK)
        dropped = m_below < self.min_p  # min-p drops every unchecked token
        if self.top_p >= 1.0:
            return dropped
        extra = unchecked if not self.top_k else min(unchecked, self.top_k - n)
        cum = np.cumsum(m)
        lo = int(np.searchsorted(cum, self.top_p * cum[-1] * (1.0 - self.SLACK))) + 1
        hi = int(np.searchsorted(cum, self.top_p * (cum[-1] + extra * m_below) * (1.0 + self.SLACK))) + 1
        if hi > n and not dropped:
            return False  # top-p's cut may fall among the unchecked
        # Checked tokens top-p keeps at one total and not at another must be min-p's to drop.
        return not bool((m[lo:min(hi, n)] >= self.min_p * (1.0 - self.SLACK)).any())


class LogitRules:
    """Everything applied to a row of logits before the warp, for one generation.

    Args:
        bias: ``{token id: added logit}``.
        penalties: :class:`Penalties`.
        grammar: a :class:`~specgguf.llama.grammar.Grammar` (compiled for the
            target's vocabulary) or None.
    """

    def __init__(self, bias: Optional[Dict[int, float]] = None, penalties: Penalties = Penalties(),
                 grammar=None) -> None:
        self.bias_ids = np.array(sorted(bias or {}), dtype=np.int64)
        self.bias_values = np.array([bias[i] for i in self.bias_ids], dtype=np.float32) if bias else None
        self.penalties, self.grammar = penalties, grammar

    @property
    def active(self) -> bool:
        return len(self.bias_ids) > 0 or self.penalties.active or self.grammar is not None

    def apply(self, logits: np.ndarray, context: Sequence[int], origin: int, cut: Cut,
              grammar: bool = True) -> np.ndarray:
        """The rows plain decoding would sample from.

        Args:
            logits: ``[n, V]`` float32; row i scores the token after
                ``context[:len(context) - n + 1 + i]``.
            context: prompt and tokens after it (``origin``: the prompt's length).
            cut: what of a row the warp reads: the grammar checks only the
                candidates that decide it.
            grammar: False leaves the grammar to the caller (:meth:`race_mask`).

        Returns:
            ``[n, V]`` float32, a new array.
        """
        rows = np.array(logits, dtype=np.float32, copy=True)
        first = len(context) - len(rows) + 1
        for i, row in enumerate(rows):
            generated = context[origin:first + i]
            if len(self.bias_ids):
                ok = self.bias_ids < len(row)
                row[self.bias_ids[ok]] += self.bias_values[ok]
            self.penalties.apply(row, generated)
            if self.grammar is not None and grammar:
                self.grammar.mask(row, self.grammar.state(generated), cut, self.grammar.key(generated))
        return rows

    def race_mask(self, probs: np.ndarray, context: Sequence[int], origin: int, seed: int) -> List[int]:
        """Zero, in ``probs`` (``[n, V]`` warped rows, in place), the tokens the
        grammar forbids that would win a row's race (see
        :func:`~specgguf.ops.verify.accept_invariant`), until an allowed one
        wins: the winner over all allowed tokens, which is all the race reads
        (the normaliser does not change it). Usually the first winner is
        allowed (one one-token check); else candidates are checked in race
        order, a chunk at a time, instead of a full pass over the vocabulary
        (~10 ms at V=49152). The race itself has the last word: the loop
        ends only when :func:`race_pick` names an allowed token.

        Returns:
            each row's race winner (what a draft proposes there).
        """
        from .verify import race_pick
        first = len(context) - len(probs) + 1
        wins = []
        for i, row in enumerate(probs):
            generated = context[origin:first + i]
            state = self.grammar.state(generated)
            win = int(race_pick(row[None, :], seed, len(generated))[0])
            if state is not None and not self.grammar.allows(state, win):
                self._race_order_mask(row, state, seed, len(generated))
                while True:
                    win = int(race_pick(row[None, :], seed, len(generated))[0])
                    if self.grammar.allows(state, win):
                        break
                    row[win] = 0.0  # a near-tie the key order below placed differently
                    if not row.any():
                        raise ValueError("grammar: no token is allowed here (the grammar cannot continue)")
            wins.append(win)
        return wins

    def _race_order_mask(self, row: np.ndarray, state, seed: int, position: int) -> None:
        """Zero forbidden tokens in race order (smallest E/p first) up to the first allowed one."""
        from .verify import race_uniforms
        live = np.flatnonzero(row[:self.grammar.n_vocab] > 0)
        keys = -np.log(race_uniforms(seed, position, live)) / row[live].astype(np.float64)
        size, done = min(256, len(live)), 0
        while done < len(live):
            part = np.argpartition(keys, size - 1)[:size] if size < len(live) else np.arange(len(live))
            order = live[part[np.argsort(keys[part], kind="stable")]][done:]
            for at in range(0, len(order), self.grammar.CHUNK):
                chunk = order[at:at + self.grammar.CHUNK]
                ok = self.grammar.check(state, chunk, np.zeros(len(chunk), np.float32))
                if ok.any():
                    row[chunk[:int(np.argmax(ok))]] = 0.0
                    return
                row[chunk] = 0.0
            done, size = done + len(order), min(len(live), size * 8)
        raise ValueError("grammar: no token is allowed here (the grammar cannot continue)")

    def commit(self, tokens: Sequence[int]) -> None:
        """Tokens emitted: the grammar's base state moves on."""
        if self.grammar is not None:
            self.grammar.commit(tokens)

    def restart(self) -> None:
        """A new text: the grammar starts over."""
        if self.grammar is not None:
            self.grammar.restart()

    def close(self) -> None:
        if self.grammar is not None:
            self.grammar.close()


class Logprobs:
    """Log-probabilities of the emitted tokens under the target's raw logits.

    Args:
        top: how many alternatives per position (0..20).

    ``entries[i]`` is ``(token, logprob, [(id, logprob)] * top)`` for the
    i-th generated token.
    """

    def __init__(self, top: int = 0) -> None:
        self.top = top
        self.restart()

    def restart(self) -> None:
        self.rows: Dict[int, np.ndarray] = {}
        self.entries: List[Tuple[int, float, List[Tuple[int, float]]]] = []

    def record(self, logits: np.ndarray, first: int) -> None:
        """Target rows ``[n, V]``; row i is generated position ``first + i``."""
        self.rows = {first + i: row for i, row in enumerate(np.asarray(logits))}

    def emit(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            row = self.rows.get(len(self.entries))
            if row is None:
                raise RuntimeError(f"logprobs: no target row for position {len(self.entries)}")
            finite = np.isfinite(row)
            m = float(row[finite].max())
            lse = m + float(np.log(np.exp(row[finite].astype(np.float64) - m).sum()))
            top = []
            if self.top:
                ids = np.argpartition(-row, self.top - 1)[:self.top]
                ids = ids[np.lexsort((ids, -row[ids]))]
                top = [(int(i), float(row[i]) - lse) for i in ids]
            self.entries.append((int(t), float(row[t]) - lse, top))
