"""Batch invariance: every token's logits in a verification batch are the
bits plain decoding computes for it.

A speculative round scores K+1 tokens in one forward where plain decoding
scores one. llama.cpp's CPU kernels for batches sum in other orders than
its one-token kernels (llamafile's tinyBLAS for F32/F16/Q8_0/Q4_0 weights,
the tiled K-quant matmul from 8 rows, the tiled flash attention, the
repacked weights' gemm over groups of 4 rows, and one query's attention
split over the KV cache from 512 cells), so logits moved by rounding and
near-ties flipped: greedy text differed from plain decoding on about one
code prompt in six. scripts/setup.sh builds llama.cpp with
``scripts/patches/llama-batch-invariant.patch``, which adds
``ggml_cpu_set_batch_invariant(n)``: a forward of fewer than n tokens sums
every row in the order a one-token forward does (tinyBLAS for one token too
where it serves the type; the one-token kernel elsewhere; see the patch's
README). specgguf turns it on when it is
imported (:func:`batch_invariance`) and keeps every verification row in such
forwards (:func:`specgguf.llama.model.forwards`); prompts, read in chunks of
the batch size as plain decoding reads them, keep the fast kernels.
:func:`probe` measures whether it holds for a loaded model.

A draft's rows reach no text but under exact p/q sampling with a seed, and
the one-token kernels cost a quantized draft 15% more a token (Q4_1 here:
7.5 ms against 6.5) and a K-quant's prompt twice the time: the draft's
forwards run llama.cpp's stock kernels (:func:`kernels`) unless one of its
rows belongs to such a run. The switch is process-wide, so specgguf's
forwards take turns under one lock and the bound is back before any other
of its forwards starts.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

import llama_cpp
import numpy as np

INVARIANT_TOKENS = 64  # forwards shorter than this compute each row as a one-token forward does


def batch_invariance() -> int:
    """Turn on llama.cpp's batch invariance for this process, once, and
    return its bound in tokens (0 where this llama.cpp lacks it).

    A speculative round scores K+1 tokens in one forward where plain
    decoding scores one; llama.cpp's CPU kernels for batches (llamafile's
    tinyBLAS, the tiled K-quant and flash-attention paths, the repacked
    gemm, the split of one query over the KV cache) sum in other orders, so
    logits moved by rounding and near-ties flipped. scripts/setup.sh builds
    llama.cpp with ``scripts/patches/llama-batch-invariant.patch``: a forward
    of fewer than ``INVARIANT_TOKENS`` tokens then sums every row as a
    one-token forward does, and :meth:`LlamaModel.eval_many` keeps every
    verification row in such forwards, so verification reproduces plain
    decoding bit for bit. Longer forwards (prompts) keep the fast kernels,
    and are evaluated in the same chunks as plain decoding evaluates them.
    ``SPECGGUF_BATCH_INVARIANT=0`` turns it off (a prompt of under 64 tokens
    is then read a little faster); it is process-wide, like llama.cpp's
    other CPU settings."""
    global _invariant, _lib
    if _invariant is None:
        lib = _lib = _ggml_cpu()
        if lib is None:
            _invariant = 0
        else:
            want = os.environ.get("SPECGGUF_BATCH_INVARIANT", str(INVARIANT_TOKENS))
            try:
                tokens = int(want)
            except ValueError:
                warnings.warn(f"SPECGGUF_BATCH_INVARIANT must be a number of tokens (0: off), got {want!r}; "
                              f"using {INVARIANT_TOKENS}")
                tokens = INVARIANT_TOKENS
            lib.ggml_cpu_set_batch_invariant(max(0, tokens))
            _invariant = int(lib.ggml_cpu_get_batch_invariant())
    return _invariant


_invariant: Optional[int] = None
_lib: Optional[ctypes.CDLL] = None  # llama.cpp's CPU backend, where it has the switch
_forwards = threading.RLock()  # specgguf's forwards in this process, one at a time (see kernels)


@contextmanager
def kernels(row_invariant: bool = True) -> Iterator[None]:
    """Hold this process's specgguf forwards for one: with ``row_invariant``
    False (a draft forward whose rows reach no text), llama.cpp's stock
    kernels at every batch size, the bound restored after, on error too.

    Every :class:`~specgguf.llama.model.LlamaModel` forward runs inside, so
    none of specgguf's runs while the switch is off: a forward takes every
    thread anyway. A ``Llama`` of the caller's own, run in another thread at
    that moment, computes with the stock kernels, as it would without specgguf."""
    with _forwards:
        lib = None if row_invariant or not batch_invariance() else _lib
        if lib is None:
            yield
            return
        lib.ggml_cpu_set_batch_invariant(0)
        try:
            yield
        finally:
            lib.ggml_cpu_set_batch_invariant(_invariant)


def patched() -> bool:
    """Whether this llama.cpp has the batch-invariance switch (on or off)."""
    return _ggml_cpu() is not None


def _ggml_cpu() -> Optional[ctypes.CDLL]:
    """llama.cpp's CPU backend library as llama-cpp-python loaded it, where it
    has the batch-invariance calls; None otherwise. The wheel holds the
    library under several names as separate files (libggml-cpu.so,
    .so.0, ...): only the copy already loaded (RTLD_NOLOAD) is llama.cpp's."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for path in sorted(lib_dir.glob("libggml-cpu*.so*")) + sorted(lib_dir.glob("ggml-cpu*.dll")):
        try:
            lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
            set_, get = lib.ggml_cpu_set_batch_invariant, lib.ggml_cpu_get_batch_invariant
        except (OSError, AttributeError):
            continue
        set_.argtypes, set_.restype, get.argtypes, get.restype = [ctypes.c_int], None, [], ctypes.c_int
        return lib
    return None


def probe(model, ids: Sequence[int], batch: int = 5) -> dict:
    """Whether ``model`` (a :class:`~specgguf.llama.model.LlamaModel`) scores
    tokens in a batch exactly as one at a time, here: the rows for the
    positions of ``ids`` after its first quarter, evaluated one token per
    forward and then ``batch`` tokens per forward (from the same cache),
    compared bit for bit.

    Returns ``{"rows": n, "identical": rows bit-identical, "max_diff": the
    largest absolute difference of a logit, "argmax_flips": rows whose top
    token differs, "invariant_tokens": the bound in force}``. The model's
    cache is emptied before and after."""
    ids = [int(t) for t in ids]
    start = max(1, len(ids) // 4)
    if len(ids) - start < batch:
        raise ValueError(f"probe needs at least {batch + start} tokens, got {len(ids)}")
    model.reset()
    try:
        model.eval(ids[:start], 1)  # the same prompt read both ways
        one = [model.eval(ids[:p + 1], 1)[0] for p in range(start, len(ids))]
        model.reset()
        many = []
        for p in range(start, len(ids), batch):
            end = min(len(ids), p + batch)
            model.eval(ids[:p], 1)  # the cache holds what precedes the batch, as in a round
            many.extend(model.eval(ids[:end], end - p + 1, proposed=end - p)[1:])
    finally:
        model.reset()
    a, b = np.stack(one), np.stack(many)
    finite = np.isfinite(a) & np.isfinite(b)
    same = np.all((a == b) | ~finite, axis=1)
    return {"rows": len(a), "identical": int(same.sum()),
            "max_diff": float(np.max(np.abs(np.where(finite, a - b, 0.0)))),
            "argmax_flips": int(np.sum(np.argmax(a, axis=1) != np.argmax(b, axis=1))),
            "invariant_tokens": batch_invariance()}


batch_invariance()  # at import: plain decoding in this process then computes as verification does
