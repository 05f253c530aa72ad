"""One llama.cpp model as specgguf uses it: loading, the KV cache's
bookkeeping, and the model's identity (the vocabulary check is in
:mod:`specgguf.llama.vocab`).

Bookkeeping (as in llama.cpp's speculative examples): a :class:`LlamaModel`
remembers which tokens its KV cache holds. A call evaluates only what the
cache lacks, after cutting the cache back to the longest common prefix with
``llama_memory_seq_rm``, so no token is ever evaluated twice. Logits are
flagged only at the positions asked for and read row by row with
``llama_get_logits_ith``: memory stays at the model + KV cache + O(K x V),
never llama-cpp-python's ``logits_all`` ``n_ctx x V`` buffer. The adapter
(target and model drafter) and :class:`~specgguf.DraftModel` share it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path
from typing import FrozenSet, List, Optional, Sequence, Tuple, Union

import llama_cpp
import numpy as np

from ..ops.drafter import common_prefix
from .invariance import batch_invariance, kernels

MIN_CTX = 256         # llama.cpp raises smaller context windows to this

ModelLike = Union[str, os.PathLike, "llama_cpp.Llama"]


def check_gguf(path: Path) -> None:
    """Refuse what llama.cpp would crash or hang on, before it sees it: a
    missing file, a non-GGUF file, or a truncated header."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    if len(head) < 24:
        raise ValueError(f"{path} is a truncated GGUF file ({len(head)} bytes)")
    from .gguf_check import check_header  # a bounded read of the header's counts
    check_header(path)


_LOG_ERROR, _LOG_CONT = 4, 5  # ggml_log_level in the llama.cpp llama-cpp-python 0.3.x vendors
_log_state = {"verbose": False, "last_shown": False}


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data) -> None:
    shown = _log_state["verbose"] or level == _LOG_ERROR or (level == _LOG_CONT and _log_state["last_shown"])
    if level != _LOG_CONT:
        _log_state["last_shown"] = shown
    if shown:
        sys.stderr.write(text.decode("utf-8", "replace"))
        sys.stderr.flush()


def set_llama_logs(verbose: bool) -> None:
    """llama.cpp's own log lines: all of them with ``verbose``, else its
    errors only. llama-cpp-python's filter maps ggml's levels from an older
    enum (its WARN reads as ERROR), so with ``verbose=False`` warnings such
    as ``n_ctx_seq (100096) > n_ctx_train (8192)`` were printed, once per
    model, and llama.cpp's errors were not."""
    _log_state["verbose"] = bool(verbose)
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def load_llama(path: Path, n_ctx: int = 2048, n_threads: Optional[int] = None, verbose: bool = False,
               flash_attn: bool = True, **params) -> "llama_cpp.Llama":
    """A ``Llama`` for ``path`` with specgguf's defaults: every core (llama-cpp-python
    defaults to half; decoding on a board wants them all), no ``logits_all``,
    and flash attention, as llama-server's ``-fa auto`` gives on a CPU
    (llama-cpp-python turns it off): 5% less time per token here, the whole
    gap to llama-server's plain decoding. It changes llama.cpp's arithmetic
    slightly, so greedy text can differ in rare near-ties from a ``Llama``
    made without it; ``flash_attn=False`` matches that one."""
    if n_ctx < MIN_CTX:
        raise ValueError(f"the context window must be at least {MIN_CTX} tokens (llama.cpp raises "
                         f"smaller ones to {MIN_CTX}), got {n_ctx}")
    check_gguf(path)
    set_llama_logs(verbose)
    threads = n_threads or os.cpu_count() or 1
    try:
        return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                               verbose=verbose, logits_all=False, flash_attn=flash_attn, **params)
    except ValueError as e:  # llama-cpp-python's "Failed to load model from file"
        raise ValueError(f"llama.cpp could not load {path}: {e} (a damaged or unsupported GGUF?)") from None


def eog_tokens(llm: "llama_cpp.Llama") -> FrozenSet[int]:
    """The model's end-of-generation tokens (EOS, EOT, ...)."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    return frozenset(t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t))


def slot_context(llm: "llama_cpp.Llama", slots: int, slot_ctx: int, unified: bool = True):
    """A llama.cpp context over ``llm``'s weights with room for ``slots``
    sequences of ``slot_ctx`` tokens each. Settings (threads, flash
    attention, batch size) are ``llm``'s own.

    ``unified``: one KV cache for every sequence (llama-server's default
    with automatic slots): a batch of the sequences' tokens, a different
    number per sequence, runs as one ubatch, but each token's attention
    walks every cached cell, other sequences' too (a slot's text is kept
    for its conversation's next turn). Not unified: a KV stream per
    sequence (llama-server's with ``-np N``): attention reads a sequence's
    own cells only, and llama.cpp cuts a batch into ubatches of equal
    counts over runs of consecutive sequence ids
    (:func:`ubatches`), one
    pass over the weights each."""
    params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
    params.n_ctx = slots * slot_ctx
    params.n_seq_max = slots
    params.kv_unified = unified
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    if not ctx:
        raise MemoryError(f"llama.cpp could not make a context for {slots} sequences of {slot_ctx} tokens "
                          "(out of memory? use fewer slots, e.g. a smaller --parallel, or a smaller context)")
    return ctx


def ubatches(counts: Sequence[Tuple[int, int]]) -> int:
    """How many ubatches (passes over the weights) a split KV cache's
    ``llama_decode`` makes of a batch with ``counts``: ``(sequence id,
    tokens)`` in the batch's order, ids increasing. As llama.cpp's
    ``split_equal`` (sequential): each ubatch takes the run of consecutive
    ids from the first sequence with tokens left, the same number of tokens
    from each (the fewest any has left). Equal counts over consecutive ids:
    one; a sequence left out or one with more tokens: another."""
    left = [(s, n) for s, n in counts if n > 0]
    passes = 0
    while left:
        run = 1
        while run < len(left) and left[run][0] == left[run - 1][0] + 1:
            run += 1
        m = min(n for _, n in left[:run])
        left = [(s, n - m) for s, n in left[:run] if n > m] + left[run:]
        passes += 1
    return passes


def kv_bytes_per_token(llm: "llama_cpp.Llama") -> int:
    """Bytes one token takes in the KV cache (keys and values, every layer, f16)."""
    m = llm.model
    n_embd, n_head = llama_cpp.llama_model_n_embd(m), max(1, llama_cpp.llama_model_n_head(m))
    kv = llama_cpp.llama_model_n_head_kv(m) * (n_embd // n_head)
    return int(llama_cpp.llama_model_n_layer(m)) * 2 * int(kv) * 2


def check_slot_memory(llms: Sequence["llama_cpp.Llama"], slots: int, slot_ctx: int) -> int:
    """Raise ValueError, naming ``--parallel``, when ``slots`` sequences of
    ``slot_ctx`` tokens in every model's KV cache would not fit in the
    memory available now (with a fifth to spare for the compute buffers).
    Returns the bytes it estimated."""
    need = sum(kv_bytes_per_token(m) for m in llms) * slots * slot_ctx
    avail = available_memory()
    if avail is not None and need * 1.25 > avail:
        raise ValueError(f"{slots} slots (--parallel {slots}) of {slot_ctx} tokens need about {need >> 20} MiB "
                         f"of KV cache, more than the {avail >> 20} MiB available with room to spare: use a "
                         "smaller --parallel or a smaller context (--ctx)")
    return need


def available_memory() -> Optional[int]:
    """Bytes of memory available to a new allocation (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Saved:
    """One slot's KV cache copied to host memory (:meth:`LlamaModel.save`):
    the ``tokens`` it holds, llama.cpp's bytes of it, the logits row kept
    after its last token (or None)."""

    __slots__ = ("tokens", "data", "last", "stock_from")

    def __init__(self, tokens: List[int], data, last: Optional[np.ndarray], stock_from: Optional[int] = None) -> None:
        self.tokens, self.data, self.last, self.stock_from = tokens, data, last, stock_from

    @property
    def nbytes(self) -> int:
        return len(self.data) + (0 if self.last is None else self.last.nbytes) + 8 * len(self.tokens)


class LlamaModel:
    """One model's KV-cache bookkeeping over the llama.cpp C API, for one
    sequence or several (slots, each with its own KV range).

    Args:
        llm: a loaded ``llama_cpp.Llama`` (its settings are kept).
        n_vocab: width of the logit rows returned (>= the model's own vocab;
            columns past it are -inf, i.e. zero mass).
        slots: sequences held at once; above 1 the model gets a context of
            its own (:func:`slot_context`) and ``llm``'s stays unused.
        slot_ctx: tokens per sequence (slots > 1; default ``llm``'s n_ctx).
        unified: one KV cache for every slot, or a stream per slot (see
            :func:`slot_context`; with one slot they are the same).
    """

    def __init__(self, llm: "llama_cpp.Llama", n_vocab: Optional[int] = None, slots: int = 1,
                 slot_ctx: Optional[int] = None, unified: bool = True) -> None:
        self.llm = llm
        self.unified = unified or slots == 1
        self.own_ctx = slot_context(llm, slots, slot_ctx or llm.n_ctx(), unified) if slots > 1 else None
        self.ctx = self.own_ctx or llm.ctx
        self.vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self.model_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_vocab = n_vocab or self.model_vocab
        self.slots = slots
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx)) // slots  # per sequence
        self.n_batch = max(1, int(llama_cpp.llama_n_batch(self.ctx)))
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.cache: List[List[int]] = [[] for _ in range(slots)]  # what each sequence's KV holds, in order
        # each sequence's logits after its last cached token, while the cache ends there: a round
        # after the prompt then evaluates only its drafts, and the prompt's last token is not read
        # again in a smaller forward (whose arithmetic would differ from plain decoding's)
        self.last: List[Optional[np.ndarray]] = [None] * slots
        self.invariant = batch_invariance()  # forwards under this many tokens are row-invariant
        # per slot, the first position computed with the stock kernels (eval_many's row_invariant=False)
        self.stock_from: List[Optional[int]] = [None] * slots
        self.stock_pays = stock_pays(llm)
        self.seconds = 0.0  # time spent in llama_decode and reading logits
        self.reset()

    def __del__(self) -> None:
        batch = getattr(self, "batch", None)
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
            self.batch = None
        if getattr(self, "own_ctx", None) is not None:
            llama_cpp.llama_free(self.own_ctx)
            self.own_ctx = None

    @property
    def tokens(self) -> List[int]:
        """What sequence 0's KV cache holds."""
        return self.cache[0]

    def reset(self) -> None:
        """Empty the KV cache (every sequence); the ``Llama`` object re-evaluates from scratch next time."""
        llama_cpp.llama_memory_clear(self.mem, True)
        self.cache = [[] for _ in range(self.slots)]
        self.last = [None] * self.slots
        self.stock_from = [None] * self.slots
        if self.own_ctx is None:
            self.llm.n_tokens = 0  # keep Llama's own prefix cache honest

    def held(self) -> bool:
        """Whether the KV cache still holds what this object left in it, for a
        ``Llama`` the caller may have run on its own since. Its own use moves
        ``n_tokens`` off 0 (kept at 0 here, so that its next call evaluates
        from scratch) and writes its tokens into ``input_ids`` (where this
        object writes what it evaluates); loading a saved state does both; and
        the cache's last position must be this object's last."""
        if self.own_ctx is not None:
            return True  # a context of its own: nothing else runs in it
        n, ids = len(self.cache[0]), getattr(self.llm, "input_ids", None)
        if ids is None or self.llm.n_tokens != 0 or n > len(ids):
            return False
        return (int(llama_cpp.llama_memory_seq_pos_max(self.mem, 0)) == n - 1
                and bool(np.array_equal(ids[:n], self.cache[0])))

    def lag(self, seq: Sequence[int], slot: int = 0, n_logits: int = 1) -> int:
        """Tokens :meth:`eval` of ``seq`` with ``n_logits`` rows would evaluate:
        those the slot's KV cache does not hold, and at least ``n_logits`` (rows
        come from tokens evaluated now) less the first where the cache ends
        just before it with that row kept (:attr:`last`). A cached prompt
        otherwise still costs its last token: counted as 0, a first round on
        it fitted a 21 ms forward at 0 tokens to the policy's line of the
        target's cost."""
        if self._kept(slot, seq, n_logits):
            return n_logits - 1
        return len(seq) - common_prefix(self.cache[slot], seq, len(seq) - n_logits)

    def _kept(self, slot: int, seq: Sequence[int], n_logits: int) -> bool:
        """Whether the slot's cache holds exactly ``seq`` up to its first row's
        token, with that row's logits kept."""
        held = self.cache[slot]
        return (self.last[slot] is not None and len(held) == len(seq) - n_logits + 1
                and common_prefix(held, seq) == len(held))

    def _cut(self, slot: int, keep: int) -> None:
        held = self.cache[slot]
        if keep < len(held):
            if not llama_cpp.llama_memory_seq_rm(self.mem, slot, keep, -1):
                raise ValueError("this model cannot drop part of its KV cache (recurrent or hybrid "
                                 "architecture); specgguf needs a transformer model")
            del held[keep:]
            self.last[slot] = None
            if self.stock_from[slot] is not None and keep <= self.stock_from[slot]:
                self.stock_from[slot] = None

    def save(self, slot: int) -> "Saved":
        """A copy, in host memory, of what ``slot``'s KV cache holds (see
        :mod:`specgguf.llama.stash`), for :meth:`load` into any slot later."""
        if self.own_ctx is None:
            raise ValueError("a one-sequence model keeps its KV cache in the Llama object's context")
        n = int(llama_cpp.llama_state_seq_get_size(self.ctx, slot))
        data = (ctypes.c_uint8 * n)()
        if n and int(llama_cpp.llama_state_seq_get_data(self.ctx, data, n, slot)) != n:
            raise RuntimeError(f"llama.cpp could not copy slot {slot}'s KV cache")
        last = self.last[slot]
        return Saved(list(self.cache[slot]), data, None if last is None else last.copy(), self.stock_from[slot])

    def load(self, slot: int, saved: "Saved") -> None:
        """Make ``slot``'s KV cache hold what :meth:`save` copied. In a KV
        stream per slot the cells land where evaluating the tokens would put
        them (from the stream's first), so later rows are computed as if the
        slot had never been used for anything else. If llama.cpp cannot load
        it, the slot is left empty (the next call evaluates the tokens)."""
        self._cut(slot, 0)
        n = len(saved.data)
        if n and int(llama_cpp.llama_state_seq_set_data(self.ctx, saved.data, n, slot)) == n:
            self.cache[slot] = list(saved.tokens)
            self.last[slot] = None if saved.last is None else saved.last.copy()
            self.stock_from[slot] = saved.stock_from
        else:
            llama_cpp.llama_memory_seq_rm(self.mem, slot, -1, -1)

    def eval(self, seq: Sequence[int], n_logits: int, proposed: int = 0) -> np.ndarray:
        """Make the KV cache hold ``seq``; return logits ``[n_logits, n_vocab]``
        float32 for its last ``n_logits`` positions (row i predicts the token
        after ``seq[:len(seq) - n_logits + i + 1]``). ``proposed``: how many of
        ``seq``'s last tokens are a draft's proposals (see :meth:`eval_many`)."""
        return self.eval_many([(0, seq, n_logits, proposed)])[0]

    def eval_many(self, work: Sequence[tuple], row_invariant: bool = True) -> List[np.ndarray]:
        """:meth:`eval` for several slots in as few ``llama_decode`` calls as
        the batch size allows (one, in a decoding round): ``work`` holds
        ``(slot, seq, n_logits[, proposed])``; returns each one's
        ``[n_logits, n_vocab]`` float32 logits. On any failure every slot's
        cache is emptied (its state is unknown); the next call evaluates each
        sequence again.

        With batch invariance (:func:`batch_invariance`) the forwards are cut
        so that each row is computed as plain decoding computes it: what a
        sequence lacks before its proposals in chunks of ``n_batch``, as plain
        decoding reads a prompt, and the proposals in forwards shorter than
        the bound (see :func:`forwards`).

        ``row_invariant`` False (a draft's forward whose rows reach no text:
        :func:`~specgguf.llama.invariance.kernels`): llama.cpp's stock kernels,
        in chunks of ``n_batch``. A row-invariant call reads again what a slot
        holds from such a forward on, so that its rows are the bits a fresh
        cache gives."""
        outs, pieces = [], []
        stock = not row_invariant and self.invariant > 0
        for item in work:
            slot, seq, n_logits = item[:3]
            proposed = item[3] if len(item) > 3 else 0
            n = len(seq)
            if n > self.n_ctx:
                raise ValueError(f"sequence of {n} tokens does not fit the context window of {self.n_ctx}")
            if not stock and self.stock_from[slot] is not None:
                self._cut(slot, self.stock_from[slot])
            out = np.empty((n_logits, self.n_vocab), dtype=np.float32)
            out[:, self.model_vocab:] = -np.inf
            if self._kept(slot, seq, n_logits):
                out[0, :self.model_vocab] = self.last[slot][:self.model_vocab]
            else:
                self._cut(slot, n - self.lag(seq, slot, n_logits))  # keeps what it need not evaluate
            outs.append(out)
            todo = [(slot, pos, seq[pos], out, pos - (n - n_logits)) for pos in range(len(self.cache[slot]), n)]
            if stock and todo and self.stock_from[slot] is None:
                self.stock_from[slot] = todo[0][1]
            split = max(0, len(todo) - proposed)  # what the sequence lacks before its proposals
            pieces += [todo[i:min(i + self.n_batch, split)] for i in range(0, split, self.n_batch)]
            if split < len(todo):
                pieces.append(todo[split:])
        t0 = time.perf_counter()
        try:
            with kernels(not stock):
                for batch in forwards(pieces, self.n_batch, 0 if stock else self.invariant):
                    self._decode(batch)
        except BaseException:
            # Unknown KV state after a failure or Ctrl-C: start clean next time.
            self.reset()
            raise
        finally:
            self.seconds += time.perf_counter() - t0
        for item, out in zip(work, outs):
            self.last[item[0]] = out[-1, :self.model_vocab].copy()
        return outs

    def _decode(self, todo: Sequence[tuple]) -> None:
        """One ``llama_decode`` of ``(slot, position, token, out, row)`` items
        (row < 0: no logits wanted there)."""
        b = self.batch
        b.n_tokens = len(todo)
        for j, (slot, pos, token, _, row) in enumerate(todo):
            b.token[j] = token
            b.pos[j] = pos
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = slot
            b.logits[j] = row >= 0
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        width = self.model_vocab * 4
        ids = getattr(self.llm, "input_ids", None) if self.own_ctx is None else None  # the Llama's record: held()
        for j, (slot, pos, token, out, row) in enumerate(todo):
            self.cache[slot].append(token)
            if ids is not None:
                ids[pos] = token
            if row >= 0:
                ctypes.memmove(out[row].ctypes.data, llama_cpp.llama_get_logits_ith(self.ctx, j), width)


def stock_pays(llm) -> bool:
    """Whether llama.cpp's stock kernels read one token of ``llm``'s weights
    faster than the row-invariant ones: for quantized files (Zen 4, ms a token,
    row-invariant / stock: Q4_1 7.5 / 6.5, Q4_K_M 9.0 / 6.7, Q2_K 6.4 / 5.4;
    Q8_0 and Q4_0 alike, as both take vec_dot under the bound: nothing lost),
    not for F32, F16 or BF16 ones (9.1 / 10.1, 6.4 / 7.8), whose one-token
    row-invariant kernel is tinyBLAS's one row at a time. Unknown file types
    are taken as quantized."""
    full = {llama_cpp.LLAMA_FTYPE_ALL_F32, llama_cpp.LLAMA_FTYPE_MOSTLY_F16, llama_cpp.LLAMA_FTYPE_MOSTLY_BF16}
    try:
        return int((getattr(llm, "metadata", None) or {}).get("general.file_type", -1)) not in full
    except (TypeError, ValueError):
        return True


def forwards(pieces: Sequence[list], n_batch: int, invariant: int) -> List[list]:
    """The ``llama_decode`` batches for ``pieces``, runs of rows in the order
    they must be evaluated (a sequence's before its later ones).

    Without invariance (``invariant`` 0): every row in order, ``n_batch`` at a
    time. With it: a piece of ``invariant`` rows or more (a prompt's chunk)
    in a forward of its own, as plain decoding evaluates it; the others
    packed in order into forwards of fewer than ``invariant`` rows, which
    llama.cpp computes row by row as one-token forwards."""
    rows = [r for p in pieces for r in p]
    if not invariant:
        return [rows[i:i + n_batch] for i in range(0, len(rows), n_batch)]
    small = max(1, min(n_batch, invariant - 1))
    out: List[list] = []
    packing = False  # whether out[-1] takes more rows of small pieces
    for piece in pieces:
        if len(piece) >= invariant:
            out.append(list(piece))
            packing = False
            continue
        for row in piece:
            if not packing or len(out[-1]) >= small:
                out.append([])
                packing = True
            out[-1].append(row)
    return out


def plain_greedy(llm: "llama_cpp.Llama", ids: Sequence[int], n: int) -> List[int]:
    """``n`` tokens of the target alone after ``ids``, greedy, through
    llama-cpp-python's own loop: the reference greedy speculation must equal
    (the tests and the aarch64 pipeline check). The ``Llama`` is
    reset before and after (its KV cache, not only its token count: a
    :class:`LlamaModel` over the same context must start from empty)."""
    out: List[int] = []
    llm.reset()
    try:
        for tok in llm.generate(list(ids), temp=0.0, top_k=1, reset=True):
            out.append(tok)
            if len(out) == n:
                break
    finally:
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    return out


class InUse:
    """One generation at a time per object. A call from another thread waits
    for the running one to finish; a second generation started in the thread
    that holds an unfinished one (a stream not yet exhausted or closed)
    raises instead of deadlocking."""

    def __init__(self, what: str) -> None:
        self.what, self.lock, self.owner = what, threading.Lock(), None

    def __enter__(self) -> "InUse":
        if self.owner == threading.get_ident():
            raise RuntimeError(f"this {self.what} is in use by an unfinished generation in this thread; "
                               "exhaust or close() that stream first")
        self.lock.acquire()
        self.owner = threading.get_ident()
        return self

    def __exit__(self, *exc) -> None:
        self.owner = None
        self.lock.release()
