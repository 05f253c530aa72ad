"""One llama.cpp model as specgguf uses it: loading, the KV cache's
bookkeeping, the vocabulary check, and the model's identity.

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
import hashlib
import os
import platform
import threading
import time
from pathlib import Path
from typing import FrozenSet, List, Optional, Sequence, Union

import llama_cpp
import numpy as np

from .drafter import common_prefix

MAX_VOCAB_DIFF = 128  # padding rows, as llama.cpp allows (e.g. Qwen2.5 0.5B vs 7B)
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


def machine_id(n_threads: int) -> str:
    """What forward costs depend on besides the models: the CPU, the llama.cpp
    build (its CPU features) and the thread count."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith(("model name", "Model"))), cpu)
    except OSError:
        pass
    build = hashlib.sha256(llama_cpp.llama_print_system_info()).hexdigest()[:12]
    return f"{platform.machine()}|{cpu}|{os.cpu_count()}|llama {llama_cpp.__version__} {build}|threads {n_threads}"


class LlamaModel:
    """One model's KV-cache bookkeeping over the llama.cpp C API.

    Args:
        llm: a loaded ``llama_cpp.Llama`` (its settings are kept).
        n_vocab: width of the logit rows returned (>= the model's own vocab;
            columns past it are -inf, i.e. zero mass).
    """

    def __init__(self, llm: "llama_cpp.Llama", n_vocab: Optional[int] = None) -> None:
        self.llm = llm
        self.ctx = llm.ctx
        self.vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self.model_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_vocab = n_vocab or self.model_vocab
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self.n_batch = max(1, int(llama_cpp.llama_n_batch(self.ctx)))
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.tokens: List[int] = []  # what the KV cache holds, in order
        self.seconds = 0.0  # time spent in llama_decode and reading logits
        self.reset()

    def __del__(self) -> None:
        batch = getattr(self, "batch", None)
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
            self.batch = None

    def reset(self) -> None:
        """Empty the KV cache; the ``Llama`` object re-evaluates from scratch next time."""
        llama_cpp.llama_memory_clear(self.mem, True)
        self.tokens = []
        self.llm.n_tokens = 0  # keep Llama's own prefix cache honest

    def lag(self, seq: Sequence[int]) -> int:
        """Tokens of ``seq`` the KV cache does not hold (what eval would evaluate)."""
        return len(seq) - common_prefix(self.tokens, seq)

    def _cut(self, keep: int) -> None:
        if keep < len(self.tokens):
            if not llama_cpp.llama_memory_seq_rm(self.mem, 0, keep, -1):
                raise ValueError("this model cannot drop part of its KV cache (recurrent or hybrid "
                                 "architecture); specgguf needs a transformer model")
            del self.tokens[keep:]

    def eval(self, seq: Sequence[int], n_logits: int) -> np.ndarray:
        """Make the KV cache hold ``seq``; return logits ``[n_logits, n_vocab]``
        float32 for its last ``n_logits`` positions (row i predicts the token
        after ``seq[:len(seq) - n_logits + i + 1]``)."""
        n = len(seq)
        if n > self.n_ctx:
            raise ValueError(f"sequence of {n} tokens does not fit the context window of {self.n_ctx}")
        self._cut(common_prefix(self.tokens, seq, n - n_logits))
        out = np.empty((n_logits, self.n_vocab), dtype=np.float32)
        out[:, self.model_vocab:] = -np.inf
        t0 = time.perf_counter()
        try:
            for start in range(len(self.tokens), n, self.n_batch):
                self._decode(seq, start, min(n, start + self.n_batch), n - n_logits, out)
        except BaseException:
            # Unknown KV state after a failure or Ctrl-C: start clean next time.
            self.reset()
            raise
        finally:
            self.seconds += time.perf_counter() - t0
        return out

    def _decode(self, seq: Sequence[int], start: int, end: int, first_logit: int, out: np.ndarray) -> None:
        b = self.batch
        b.n_tokens = end - start
        for j, pos in enumerate(range(start, end)):
            b.token[j] = seq[pos]
            b.pos[j] = pos
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = 0
            b.logits[j] = pos >= first_logit
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        self.tokens.extend(seq[start:end])
        for pos in range(max(start, first_logit), end):
            ptr = llama_cpp.llama_get_logits_ith(self.ctx, pos - start)
            ctypes.memmove(out[pos - first_logit].ctypes.data, ptr, self.model_vocab * 4)

    def token_text(self, token: int) -> bytes:
        return llama_cpp.llama_vocab_get_text(self.vocab, token) or b""


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


def check_vocab(target: LlamaModel, draft: LlamaModel, target_name: str, draft_name: str) -> None:
    """Raise ValueError unless both models share a tokenizer: the same type,
    BOS and EOS, sizes within MAX_VOCAB_DIFF, and the same text per token."""
    def fail(why: str) -> None:
        raise ValueError(f"draft {draft_name} and target {target_name} do not share a tokenizer: {why}")

    tv, dv = target.vocab, draft.vocab
    if llama_cpp.llama_vocab_type(tv) != llama_cpp.llama_vocab_type(dv):
        fail("different tokenizer types")
    for what, f in (("BOS", llama_cpp.llama_vocab_bos), ("EOS", llama_cpp.llama_vocab_eos)):
        if f(tv) != f(dv):
            fail(f"{what} token {f(dv)} vs {f(tv)}")
    if abs(target.model_vocab - draft.model_vocab) > MAX_VOCAB_DIFF:
        fail(f"vocab sizes {draft.model_vocab} vs {target.model_vocab} differ by more than {MAX_VOCAB_DIFF}")
    for t in range(min(target.model_vocab, draft.model_vocab)):
        a, b = draft.token_text(t), target.token_text(t)
        if a != b:
            fail(f"token {t} is {a!r} in the draft but {b!r} in the target")
