"""A GBNF grammar compiled by llama.cpp's own engine, for one generation at a time.

Through llama-cpp-python's ctypes bindings (``llama_sampler_init_grammar``,
``llama_sampler_apply``, ``llama_sampler_accept``, ``llama_sampler_clone``):
the grammar a request gives (or a JSON schema converted as llama.cpp
converts it) is the one llama-cpp-python's ``Llama`` and llama-server would
apply. :class:`~specgguf.ops.logits.LogitRules` applies it to each row.

A grammar may start lazily (:class:`LazyStart`): the text is free until a
trigger appears in it (a tool call's ``<tool_call>``), and from the
trigger's first byte on the grammar holds. llama.cpp has lazy grammars
too, but its sampler throws through the C API (and the process aborts)
when the token that completes the trigger carries text the grammar
refuses; here such tokens are masked before they can be picked.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


def pieces(vocab, ids: Iterable[int], special: bool = True) -> List[bytes]:
    """The bytes of tokens ``ids``, as llama.cpp's grammar engine reads them
    (``special``: special tokens spelled out) or as text shows them."""
    import llama_cpp
    buf = ctypes.create_string_buffer(512)
    out = []
    for t in ids:
        got = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, special)
        out.append(buf.raw[:got] if got > 0 else b"")
    return out


class LazyStart:
    """Where a lazy grammar starts: the text is free until ``trigger``
    appears in it; from the trigger's first byte on, the grammar (whose root
    matches the trigger and what follows it) holds.

    The free text is followed by a string matcher (Knuth-Morris-Pratt over
    the trigger's bytes): its state is how many of the trigger's bytes the
    text ends with. Built once per vocabulary and trigger (a pass over every
    token's bytes, about 0.1 s at 49k tokens) and shared by the grammars of
    every request: ``ends[(state, token)]`` is, for each token that
    completes the trigger from that state, the text from the trigger's
    first byte to the token's end (what the grammar must accept).

    Args:
        pieces: every token's bytes (:func:`pieces` of ``range(n_vocab)``).
        trigger: the text that starts the grammar (not empty).
    """

    def __init__(self, pieces: Sequence[bytes], trigger: str) -> None:
        t = trigger.encode("utf-8")
        if not t:
            raise ValueError("a lazy grammar's trigger must not be empty")
        self.trigger, self.pieces = t, pieces
        self.fail = [0] * len(t)  # the longest proper prefix of t[:i+1] that is also its suffix
        j = 0
        for i in range(1, len(t)):
            while j and t[i] != t[j]:
                j = self.fail[j - 1]
            j += t[i] == t[j]
            self.fail[i] = j
        last = t[-1]
        self.ends: Dict[Tuple[int, int], bytes] = {}
        for token, piece in enumerate(pieces):
            if last in piece:  # only a token holding the trigger's last byte can complete it
                for state in range(len(t)):
                    j, at = self.advance(state, token)
                    if at is not None:
                        self.ends[state, token] = t + piece[at:]

    def advance(self, state: int, token: int) -> Tuple[int, Optional[int]]:
        """``(state after token, None)``, or ``(len(trigger), i)`` when the
        trigger completes at the token's byte ``i - 1``."""
        t, j = self.trigger, state
        for i, b in enumerate(self.pieces[token]):
            while j and b != t[j]:
                j = self.fail[j - 1]
            j += b == t[j]
            if j == len(t):
                return j, i + 1
        return j, None


class Free(NamedTuple):
    """A lazy grammar's state before its trigger: the matcher's state."""
    matched: int


class Grammar:
    """A GBNF grammar compiled by llama.cpp for one generation, and its states.

    Args:
        vocab: the target's ``llama_vocab *`` (``Llama._model.vocab``).
        n_vocab: its size (ids at or past it are never offered to the grammar).
        text: the grammar, GBNF; ``root``: its start rule.
        lazy: a :class:`LazyStart`: the grammar holds from its trigger on
            (``text`` then matches the trigger and what follows). A state
            before the trigger is a :class:`Free`: every token is allowed
            but those completing the trigger with text the grammar refuses.

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

    def __init__(self, vocab, n_vocab: int, text: str, root: str = "root", lazy: Optional[LazyStart] = None) -> None:
        import llama_cpp
        self._lib = llama_cpp
        self.vocab, self.n_vocab, self.lazy = vocab, n_vocab, lazy
        self.started: Dict[Tuple[int, int], object] = {}  # (Free state, token) -> the state it starts
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
        self.forbidden: List[np.ndarray] = []  # per Free state: the tokens whose trigger the grammar refuses
        if lazy is not None:
            self._start_table(lazy)
        self.restart()

    def _start_table(self, lazy: LazyStart) -> None:
        """The state each trigger-completing token starts (its text from the
        trigger on accepted, token by token as the tokenizer cuts it: the
        grammar reads characters, so any cut gives the same state), and the
        tokens the grammar refuses there."""
        by_text: Dict[bytes, Optional[object]] = {}
        bad: List[List[int]] = [[] for _ in lazy.trigger]
        for (state, token), text in lazy.ends.items():
            if text not in by_text:
                by_text[text] = self._accept_text(text)
            if by_text[text] is None:
                bad[state].append(token)
            else:
                self.started[state, token] = by_text[text]
        self.forbidden = [np.array(sorted(b), dtype=np.int64) for b in bad]

    def _accept_text(self, text: bytes):
        ids = (ctypes.c_int32 * (len(text) + 8))()
        n = self._lib.llama_tokenize(self.vocab, text, len(text), ids, len(ids), False, True)
        handle = self._lib.llama_sampler_clone(self.initial)
        for t in ids[:max(n, 0)]:
            if not self.allows(handle, t):
                self._lib.llama_sampler_free(handle)
                return None
            self._lib.llama_sampler_accept(handle, int(t))
        return handle

    def restart(self) -> None:
        """Back to the start of a text (a new generation)."""
        self._free_states()
        self.base = Free(0) if self.lazy is not None else self._lib.llama_sampler_clone(self.initial)
        self.committed: List[int] = []
        self.ended = False  # an end-of-generation token was emitted

    def _drop_cache(self, emitted: Tuple[int, ...] = ()) -> None:
        """Free the draft-path states; keep the allowed sets past ``emitted``, re-keyed."""
        for h in self.cache.values():
            self._free(h)
        self.cache = {}
        n = len(emitted)
        self.allowed = {k[n:]: v for k, v in self.allowed.items() if n and k[:n] == emitted}

    def _free(self, handle) -> None:
        if handle is not None and not isinstance(handle, Free):
            self._lib.llama_sampler_free(handle)

    def _free_states(self) -> None:
        self._drop_cache()
        self._free(self.base)
        self.base = None

    def close(self) -> None:
        self._free_states()
        for h in {id(h): h for h in self.started.values()}.values():  # tokens of one text share a state
            self._free(h)
        self.started = {}
        if self.initial:
            self._lib.llama_sampler_free(self.initial)
        self.initial = None

    def __del__(self) -> None:
        if getattr(self, "initial", None) is not None:
            self.close()

    def check(self, handle, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Which of ``ids`` (int ``[n]``, below ``n_vocab``) the state ``handle``
        (:meth:`state`) allows: bool ``[n]``. ``logits`` (float32 ``[n]``)
        go with them to llama.cpp's sampler, which reads only the ids."""
        if isinstance(handle, Free):
            return (ids < self.n_vocab) & ~np.isin(ids, self.forbidden[handle.matched])
        arr = np.empty(len(ids), dtype=_TOKEN_DATA)
        arr["id"], arr["logit"], arr["p"] = ids, np.where(np.isfinite(logits), logits, 0.0), 0.0
        cur = self._lib.llama_token_data_array(
            data=arr.ctypes.data_as(ctypes.POINTER(self._lib.llama_token_data)), size=len(ids), selected=-1,
            sorted=False)
        self._lib.llama_sampler_apply(handle, ctypes.byref(cur))
        return np.isfinite(arr["logit"])

    def allows(self, handle, token: int) -> bool:
        return 0 <= token < self.n_vocab and bool(self.check(handle, np.array([token]), np.zeros(1))[0])

    def _accept(self, handle, token: int) -> Optional[object]:
        """A new state: ``handle`` after ``token``; None if the grammar forbids
        it or it follows the end of generation (nothing to mask after it)."""
        if handle is None or not self.allows(handle, token) or self._lib.llama_vocab_is_eog(self.vocab, token):
            return None
        if isinstance(handle, Free):
            matched, at = self.lazy.advance(handle.matched, int(token))
            if at is None:
                return Free(matched)
            return self._lib.llama_sampler_clone(self.started[handle.matched, int(token)])
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
            self._free(self.base)
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
        if isinstance(handle, Free):  # free text: only the refused trigger-completing tokens go
            head[self.forbidden[handle.matched]] = -np.inf
            if not np.isfinite(head).any():
                raise ValueError("grammar: no token is allowed here (the grammar cannot continue)")
            return
        if key is not None and key in self.allowed:
            head[~self.allowed[key]] = -np.inf
            return
        if cut.top_k == 1:  # greedy: the argmax is allowed most of the time
            best = int(np.argmax(head))
            if self.check(handle, np.array([best]), head[best:best + 1])[0]:
                return
        whole = mask_best_first(head, lambda ids, values: self.check(handle, ids, values), cut, self.CHUNK)
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
