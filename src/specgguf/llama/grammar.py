"""A GBNF grammar compiled by llama.cpp's own engine, for one generation at a time.

Through llama-cpp-python's ctypes bindings (``llama_sampler_init_grammar``,
``llama_sampler_apply``, ``llama_sampler_accept``, ``llama_sampler_clone``):
the grammar a request gives (or a JSON schema converted as llama.cpp
converts it) is the one llama-cpp-python's ``Llama`` and llama-server would
apply. :class:`~specgguf.ops.logits.LogitRules` applies it to each row.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


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

    def mask(self, row: np.ndarray, handle, cut, key: Optional[Tuple[int, ...]] = None) -> None:
        """Set forbidden tokens of ``row`` (``[V]`` float32, in place) to -inf,
        as far as ``cut`` (a :class:`~specgguf.ops.logits.Cut`: what the warp
        reads) needs (:func:`mask_best_first`): the warp's output is the fully
        masked row's, at a fraction of the cost. ``key`` (see :meth:`key`)
        reuses a full pass made for the same state."""
        if handle is None:
            return
        head = row[:self.n_vocab]
        row[self.n_vocab:] = -np.inf
        if key is not None and key in self.allowed:
            head[~self.allowed[key]] = -np.inf
            return
        if cut.top_k == 1:  # greedy: the argmax is allowed most of the time
            best = int(np.argmax(head))
            if self._check(handle, np.array([best]), head[best:best + 1])[0]:
                return
        whole = mask_best_first(head, lambda ids, values: self._check(handle, ids, values), cut, self.CHUNK)
        if whole and key is not None:
            self.allowed[key] = np.isfinite(head)


def mask_best_first(head: np.ndarray, check: Callable, cut, chunk: int) -> bool:
    """Set the tokens of ``head`` (``[V]`` float32 logits, in place) that
    ``check(ids, logits) -> bool [n]`` forbids to -inf, checking candidates
    best first, ``chunk`` at a time (each round eight times the last), until
    ``cut`` is settled. Stopped past ``top_k`` allowed tokens, the unchecked
    ones rank below them (ties to the lower id, as the argmax and top-k break
    them) and are left as they are; stopped earlier (min-p and top-p settled
    it), they are set to -inf, which changes nothing the warp keeps. True
    when every token of the vocabulary was checked.

    Raises:
        ValueError: no token is allowed.
    """
    finite = np.flatnonzero(np.isfinite(head))
    values = head[finite]  # the order to check in: before any is masked
    size, done, kept = chunk, 0, []
    while done < len(finite):
        if size >= len(finite):
            pick, below = np.arange(len(finite)), -np.inf
        else:
            below = np.partition(values, len(finite) - size)[len(finite) - size]
            pick = np.flatnonzero(values >= below)  # ties at the cut included
        pick = pick[np.lexsort((finite[pick], -values[pick]))][done:]
        ids = finite[pick]
        ok = check(ids, values[pick])
        head[ids[~ok]] = -np.inf
        kept.append(values[pick][ok])
        done += len(ids)
        allowed = np.concatenate(kept)
        if cut.top_k and len(allowed) >= cut.top_k:
            break
        if done < len(finite) and cut.settled(allowed, float(below), len(finite) - done):
            head[finite[values < below]] = -np.inf
            break
        size *= 8
    if not any(len(k) for k in kept):
        raise ValueError("grammar: no token is allowed here (the grammar cannot continue)")
    return done == len(finite) == len(head)
