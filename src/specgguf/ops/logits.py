"""What plain decoding does to a row of logits before the warp, as one rule per position.

llama-cpp-python's sampler chain (``Llama._init_sampler``) applies, in this
order: ``logit_bias`` (added to the logits), the repetition penalties over
the last ``penalty_last_n`` generated tokens (llama.cpp's
``llama_sampler_penalties``), and the grammar (llama.cpp's own engine:
``llama_sampler_init_grammar``, which sets a forbidden token's logit to
-inf); then top-k/top-p/min-p/temperature, or the argmax. Every one of them
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

import ctypes
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


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


class Grammar:
    """A GBNF grammar compiled by llama.cpp for one generation, and its states.

    Args:
        vocab: the target's ``llama_vocab *`` (``Llama._model.vocab``).
        n_vocab: its size (ids at or past it are never offered to the grammar).
        text: the grammar, GBNF; ``root``: its start rule.

    The state after the committed (emitted) tokens is kept; states after
    draft tokens on top of it are cloned and cached until the next commit.
    A token is accepted into a state only after the state allows it:
    llama.cpp aborts the process on a forbidden token. Nothing is accepted
    after an end-of-generation token: the text ends there (a round may
    emit tokens past it, which are dropped).

    Raises:
        ValueError: the grammar does not parse (llama.cpp prints why on stderr).
    """

    CHUNK = 64  # candidates checked at a time, best first: a full row costs ~10 ms at V=49152

    def __init__(self, vocab, n_vocab: int, text: str, root: str = "root") -> None:
        import llama_cpp
        self._lib = llama_cpp
        self.vocab, self.n_vocab = vocab, n_vocab
        self.base = None
        self.cache: Dict[Tuple[int, ...], Optional[object]] = {}
        # Allowed sets found by a full pass, by the same key as the states: the
        # target's rows are at the contexts the draft's rows were, so a
        # restrictive state is scanned once per round, not twice.
        self.allowed: Dict[Tuple[int, ...], np.ndarray] = {}
        self.initial = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"), root.encode("utf-8"))
        if not self.initial:
            self.initial = None
            raise ValueError("grammar: llama.cpp could not parse it (its message is on stderr)")
        self.restart()

    def restart(self) -> None:
        """Back to the start of a text (a new generation)."""
        self._free_states()
        self.base = self._lib.llama_sampler_clone(self.initial)
        self.committed: List[int] = []
        self.ended = False  # an end-of-generation token was emitted

    def _drop_cache(self, emitted: Tuple[int, ...] = ()) -> None:
        """Free the draft-path states; keep the allowed sets past ``emitted``, re-keyed."""
        for h in self.cache.values():
            if h:
                self._lib.llama_sampler_free(h)
        self.cache = {}
        n = len(emitted)
        self.allowed = {k[n:]: v for k, v in self.allowed.items() if n and k[:n] == emitted}

    def _free_states(self) -> None:
        self._drop_cache()
        if self.base:
            self._lib.llama_sampler_free(self.base)
        self.base = None

    def close(self) -> None:
        self._free_states()
        if self.initial:
            self._lib.llama_sampler_free(self.initial)
        self.initial = None

    def __del__(self) -> None:
        if getattr(self, "initial", None) is not None:
            self.close()

    def _check(self, handle, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the state allows: bool ``[len(ids)]``."""
        arr = np.empty(len(ids), dtype=_TOKEN_DATA)
        arr["id"], arr["logit"], arr["p"] = ids, np.where(np.isfinite(logits), logits, 0.0), 0.0
        cur = self._lib.llama_token_data_array(
            data=arr.ctypes.data_as(ctypes.POINTER(self._lib.llama_token_data)), size=len(ids), selected=-1,
            sorted=False)
        self._lib.llama_sampler_apply(handle, ctypes.byref(cur))
        return np.isfinite(arr["logit"])

    def allows(self, handle, token: int) -> bool:
        return 0 <= token < self.n_vocab and bool(self._check(handle, np.array([token]), np.zeros(1))[0])

    def _accept(self, handle, token: int) -> Optional[object]:
        """A new state: ``handle`` after ``token``; None if the grammar forbids
        it or it follows the end of generation (nothing to mask after it)."""
        if handle is None or not self.allows(handle, token) or self._lib.llama_vocab_is_eog(self.vocab, token):
            return None
        new = self._lib.llama_sampler_clone(handle)
        self._lib.llama_sampler_accept(new, int(token))
        return new

    def state(self, generated: Sequence[int]):
        """The state after ``generated`` (committed tokens first); None: a
        forbidden token on the way (the row will be rejected anyway)."""
        n = len(self.committed)
        if self.ended:
            return None
        if list(generated[:n]) != self.committed:
            raise RuntimeError("grammar: the sequence does not extend the emitted tokens")
        extra = tuple(int(t) for t in generated[n:])
        known = len(extra)
        while known and extra[:known] not in self.cache:
            known -= 1
        handle = self.cache[extra[:known]] if known else self.base
        for i in range(known, len(extra)):
            handle = self._accept(handle, extra[i])
            self.cache[extra[:i + 1]] = handle
        return handle

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance the base state along emitted tokens."""
        for t in tokens:
            if self.ended:
                break
            if self._lib.llama_vocab_is_eog(self.vocab, int(t)):
                self.ended = True
                break
            new = self._accept(self.base, t)
            if new is None:
                raise RuntimeError(f"grammar: emitted token {t} is not allowed (a masking bug)")
            self._lib.llama_sampler_free(self.base)
            self.base = new
            self.committed.append(int(t))
        self._drop_cache(tuple(int(t) for t in tokens) if not self.ended else ())

    def key(self, generated: Sequence[int]) -> Tuple[int, ...]:
        """What identifies ``generated``'s state until the next commit."""
        return tuple(int(t) for t in generated[len(self.committed):])

    def mask(self, row: np.ndarray, handle, need: int, key: Optional[Tuple[int, ...]] = None) -> None:
        """Set forbidden tokens of ``row`` (``[V]`` float32, in place) to -inf,
        checking candidates best first until ``need`` allowed ones are found
        (0: every token). The tokens left unchecked rank below ``need``
        allowed ones (ties to the lower id, as the argmax and top-k break
        them), so the argmax (need 1) and a top-k cut (need k) are exactly
        those of the fully masked row, at a fraction of the cost. ``key``
        (see :meth:`key`) reuses a full pass made for the same state."""
        if handle is None:
            return
        head = row[:self.n_vocab]
        row[self.n_vocab:] = -np.inf
        if key is not None and key in self.allowed:
            head[~self.allowed[key]] = -np.inf
            return
        if need == 1:  # greedy: the argmax is allowed most of the time
            best = int(np.argmax(head))
            if self._check(handle, np.array([best]), head[best:best + 1])[0]:
                return
        finite = np.flatnonzero(np.isfinite(head))
        values = head[finite]  # the order to check in: before any is masked
        size = self.CHUNK if 0 < need < len(finite) else len(finite)
        done, found = 0, 0
        while done < len(finite):
            if size >= len(finite):
                pick = np.arange(len(finite))
            else:
                cut = np.partition(values, len(finite) - size)[len(finite) - size]
                pick = np.flatnonzero(values >= cut)  # ties at the cut included
            pick = pick[np.lexsort((finite[pick], -values[pick]))][done:]
            ids = finite[pick]
            ok = self._check(handle, ids, values[pick])
            head[ids[~ok]] = -np.inf
            found += int(ok.sum())
            done += len(ids)
            if need and found >= need:
                break
            size *= 8
        if done == len(finite) and key is not None and len(finite) == self.n_vocab:
            self.allowed[key] = np.isfinite(head)
        if found == 0:
            raise ValueError("grammar: no token is allowed here (the grammar cannot continue)")


class LogitRules:
    """Everything applied to a row of logits before the warp, for one generation.

    Args:
        bias: ``{token id: added logit}``.
        penalties: :class:`Penalties`.
        grammar: a :class:`Grammar` or None.
    """

    def __init__(self, bias: Optional[Dict[int, float]] = None, penalties: Penalties = Penalties(),
                 grammar: Optional[Grammar] = None) -> None:
        self.bias_ids = np.array(sorted(bias or {}), dtype=np.int64)
        self.bias_values = np.array([bias[i] for i in self.bias_ids], dtype=np.float32) if bias else None
        self.penalties, self.grammar = penalties, grammar

    @property
    def active(self) -> bool:
        return len(self.bias_ids) > 0 or self.penalties.active or self.grammar is not None

    def apply(self, logits: np.ndarray, context: Sequence[int], origin: int, need: int,
              grammar: bool = True) -> np.ndarray:
        """The rows plain decoding would sample from.

        Args:
            logits: ``[n, V]`` float32; row i scores the token after
                ``context[:len(context) - n + 1 + i]``.
            context: prompt and tokens after it (``origin``: the prompt's length).
            need: how many of the best tokens the warp reads (1 greedy, top_k,
                0 all): the grammar checks only as many as that takes.
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
                self.grammar.mask(row, self.grammar.state(generated), need, self.grammar.key(generated))
        return rows

    def race_mask(self, probs: np.ndarray, context: Sequence[int], origin: int, seed: int) -> None:
        """Zero, in ``probs`` (``[n, V]`` warped rows, in place), the tokens the
        grammar forbids that would win a row's race (see
        :func:`~specgguf.ops.verify.accept_invariant`), until an allowed one
        wins: the winner over all allowed tokens, which is all the race reads
        (the normaliser does not change it). Usually the first winner is
        allowed (one one-token check); else candidates are checked in race
        order, a chunk at a time, instead of a full pass over the vocabulary
        (~10 ms at V=49152). The race itself has the last word: the loop
        ends only when :func:`race_pick` names an allowed token."""
        from .verify import race_pick
        first = len(context) - len(probs) + 1
        for i, row in enumerate(probs):
            generated = context[origin:first + i]
            state = self.grammar.state(generated)
            if state is None:
                continue
            win = int(race_pick(row[None, :], seed, len(generated))[0])
            if self.grammar.allows(state, win):
                continue
            self._race_order_mask(row, state, seed, len(generated))
            while True:
                win = int(race_pick(row[None, :], seed, len(generated))[0])
                if self.grammar.allows(state, win):
                    break
                row[win] = 0.0  # a near-tie the key order below placed differently
                if not row.any():
                    raise ValueError("grammar: no token is allowed here (the grammar cannot continue)")

    def _race_order_mask(self, row: np.ndarray, state, seed: int, position: int) -> None:
        """Zero forbidden tokens in race order (smallest E/p first) up to the first allowed one."""
        from .verify import race_uniforms
        live = np.flatnonzero(row[:self.grammar.n_vocab] > 0)
        keys = -np.log(race_uniforms(seed, position, live)) / row[live].astype(np.float64)
        size, done = min(256, len(live)), 0
        while done < len(live):
            part = np.argpartition(keys, size - 1)[:size] if size < len(live) else np.arange(len(live))
            order = live[part[np.argsort(keys[part], kind="stable")]][done:]
            for at in range(0, len(order), Grammar.CHUNK):
                chunk = order[at:at + Grammar.CHUNK]
                ok = self.grammar._check(state, chunk, np.zeros(len(chunk), np.float32))
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
