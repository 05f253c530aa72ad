"""Verification ops: one speculative-decoding round's accept/reject decision.

The ops take the target model's rows for the K drafted positions plus one
(the bonus position) and return ``(n_accepted, next_token)``: keep
``draft_tokens[:n_accepted]`` and append ``next_token``. The work runs in the
compiled extension ``specgguf._core`` (NEON on aarch64, AVX2 or AVX-512 on
x86-64 when the CPU has it, scalar otherwise; every path returns identical
results).

Array arguments may be numpy arrays or anything numpy can view through the
buffer protocol or ``__array__`` (torch CPU tensors included). float32
C-contiguous input is used in place; other real dtypes are converted.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core

GeneratorLike = Union[np.random.Generator, int, None]

_default_rng: Optional[np.random.Generator] = None


def as_generator(generator: GeneratorLike) -> np.random.Generator:
    """Resolve the ``generator`` argument of :func:`accept`.

    A ``numpy.random.Generator`` is used as is; an int seeds a new one; None
    uses a process-wide generator seeded once from fresh OS entropy.
    """
    global _default_rng
    if isinstance(generator, np.random.Generator):
        return generator
    if generator is None:
        if _default_rng is None:
            _default_rng = np.random.default_rng()
        return _default_rng
    if isinstance(generator, numbers.Integral) and not isinstance(generator, bool):
        return np.random.default_rng(int(generator))
    raise TypeError(
        "generator must be a numpy.random.Generator, an int seed or None, "
        f"got {type(generator).__name__}"
    )


def verify_greedy(target_probs: Any, draft_tokens: Sequence[int]) -> Tuple[int, int]:
    """Greedy (temperature 0) verification.

    Accept ``draft_tokens[i]`` while it equals ``argmax(target_probs[i])``; at
    the first miss return ``(i, argmax(target_probs[i]))``; if all K match,
    return ``(K, argmax(target_probs[K]))``. Ties go to the lowest index. Rows
    after the first miss are not read. The emitted stream is exactly plain
    greedy decoding of the target.

    Args:
        target_probs: ``[K+1, V]`` float32 (other real dtypes are converted).
            Probabilities or logits: only the argmax is read, so no softmax is
            needed. ``-inf`` is allowed (masked logits); NaN and ``+inf`` are
            errors.
        draft_tokens: ``[K]`` integer token ids in ``[0, V)``; K may be 0.

    Returns:
        ``(n_accepted, next_token)``: two ints, ``0 <= n_accepted <= K``.

    Raises:
        TypeError: non-numeric arrays, non-integer tokens.
        ValueError: wrong ndim or shape, V = 0, token out of range, NaN/+inf
            in a row that was read.
    """
    return _core.verify_greedy(target_probs, draft_tokens)


def accept(
    target_probs: Any,
    draft_probs: Any,
    draft_tokens: Sequence[int],
    generator: GeneratorLike = None,
) -> Tuple[int, int]:
    """Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    With ``p_i = target_probs[i] / sum(target_probs[i])`` and
    ``q_i = draft_probs[i] / sum(draft_probs[i])``: accept ``t_i =
    draft_tokens[i]`` with probability ``min(1, p_i(t_i) / q_i(t_i))``; at the
    first rejection sample the next token from ``norm(max(0, p_i - q_i))``; if
    all K are accepted, sample the bonus token from ``p_K``. The emitted tokens
    are distributed exactly as sampling from the target, provided the draft
    tokens were sampled from ``q`` and both models' distributions were warped
    (temperature, top-k, ...) identically.

    Randomness contract: exactly ``generator.random(K + 1)`` is drawn, after
    the arguments are checked. ``u[i]`` decides position i (accept iff
    ``u[i] * q_i(t_i) * P_i < p_i(t_i) * Q_i`` in double, i.e. ``u[i] <
    p/q`` without division rounding, with P, Q the row totals); ``u[K]``
    drives the single final sample: the smallest index j whose cumulative
    mass exceeds ``u[K]`` times the row's total. Use :func:`accept_uniforms`
    to supply the uniforms yourself.

    Row totals are accumulated in double in a fixed order (``cpp/verify.h``),
    so masses need not be normalized and every kernel path agrees exactly. If
    the residual's mass vanishes to rounding (p and q equal up to float
    precision), the correction is sampled from ``p_i`` instead.

    Args:
        target_probs: ``[K+1, V]`` float32, non-negative finite masses.
        draft_probs: ``[K, V]`` float32, non-negative finite masses. For
            K = 0 it may be None.
        draft_tokens: ``[K]`` integer token ids in ``[0, V)``.
        generator: ``numpy.random.Generator``, an int seed, or None.

    Returns:
        ``(n_accepted, next_token)``: two ints, ``0 <= n_accepted <= K``.

    Raises:
        TypeError: non-numeric arrays, non-integer tokens, bad generator.
        ValueError: wrong ndim or shape, V mismatch, V = 0, token out of
            range; NaN, Inf, negative values or zero total mass in a row that
            was read (rows after the first rejection are not read).
    """
    gen = as_generator(generator)
    if draft_probs is None:
        draft_probs = _empty_draft(target_probs)
    return _core.accept(target_probs, draft_probs, draft_tokens, gen)


def accept_uniforms(
    target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], uniforms: Any
) -> Tuple[int, int]:
    """:func:`accept` with the K+1 uniforms given: ``uniforms`` ``[K+1]`` float64
    in ``[0, 1)``. Lets any other implementation be checked draw for draw."""
    if draft_probs is None:
        draft_probs = _empty_draft(target_probs)
    return _core.accept_uniforms(target_probs, draft_probs, draft_tokens, uniforms)


def accept_onehot(target_probs: Any, draft_tokens: Sequence[int],
                  generator: GeneratorLike = None) -> Tuple[int, int]:
    """:func:`accept` for a point-mass draft (n-gram / prompt-lookup proposals).

    The draft proposed each token with certainty (``q_i = one-hot(t_i)``), so
    no ``[K, V]`` draft array is needed: ``t_i`` is accepted with probability
    ``p_i(t_i)`` (accept iff ``u[i] * P_i < p_i(t_i)``), and on rejection the
    next token is sampled from ``p_i`` with ``t_i`` removed. Draws exactly
    ``generator.random(K + 1)`` and returns exactly what :func:`accept`
    returns with explicit one-hot draft rows and the same uniforms.

    Args:
        target_probs: ``[K+1, V]`` float32 non-negative masses.
        draft_tokens: ``[K]`` integer token ids in ``[0, V)``.
        generator: ``numpy.random.Generator``, an int seed, or None.

    Returns:
        ``(n_accepted, next_token)``.
    """
    return _core.accept_onehot(target_probs, draft_tokens, as_generator(generator))


def accept_onehot_uniforms(target_probs: Any, draft_tokens: Sequence[int],
                           uniforms: Any) -> Tuple[int, int]:
    """:func:`accept_onehot` with the K+1 uniforms given (``[K+1]`` float64 in [0, 1))."""
    return _core.accept_onehot_uniforms(target_probs, draft_tokens, uniforms)


def accept_invariant(target_probs: Any, draft_tokens: Sequence[int], seed: int,
                     position: int) -> Tuple[int, int]:
    """Drafter-invariant verification: the emitted tokens do not depend on the draft.

    Output position j of a seeded generation owns one exponential variate per
    token, ``E_j(t) = -log U(seed, j, t)``, with ``U`` a counter-based uniform
    in (0, 1) (a hash of seed, j and t; :func:`race_uniforms`). The token at
    position j is the race winner ``y_j = argmin over {t: p_j(t) > 0} of
    E_j(t) / p_j(t)`` (ties: lower t). Row i of ``target_probs`` is position
    ``position + i``: draft token i is accepted iff it equals ``y_{position+i}``;
    at the first mismatch ``y`` is emitted; after K matches, ``y`` of row K.

    Why the output law is the target's: E_j(t) / p_j(t) is exponential with
    rate p_j(t), independent across t, and the minimum of independent
    exponentials falls on t with probability rate / total rate = p_j(t) /
    sum(p_j) (the exponential race; equivalently Gumbel-max, argmax of
    log p + G with G = -log E). So y_j is an exact sample of p_j. The emitted
    token at every position is y_j, computed from p_j and (seed, j) alone:
    accepted drafts are equal to it, a rejection emits it. What the draft
    proposed only decides how many positions one target call settles, never
    which tokens come out - so the text is token for token what plain
    (K = 0) sampling with the same seed gives, whatever the draft, K, p_min
    or the machine's timings, and its law is the target's, position by
    position given the prefix. A draft that proposes its own race winner
    ``argmin E_j(t) / q_j(t)`` (:func:`race_pick` on its rows) is accepted
    with probability at least (1 - TV) / (1 + TV), TV the total variation
    between p_j and q_j (Daliri, Musco, Suresh 2024); exact p/q verification
    accepts with probability 1 - TV.

    Args:
        target_probs: ``[K+1, V]`` float32 non-negative masses (warped target
            distributions; need not be normalized).
        draft_tokens: ``[K]`` integer token ids in ``[0, V)``.
        seed: int in ``[0, 2**64)``.
        position: output position of row 0 (tokens generated before it).

    Returns:
        ``(n_accepted, next_token)``.

    Raises:
        TypeError, ValueError: as :func:`accept`, and for a seed or position
        that is not an int in ``[0, 2**64)``.
    """
    return _core.accept_invariant(target_probs, draft_tokens, seed, position)


def race_pick(probs: Any, seed: int, position: int) -> np.ndarray:
    """The race winner of each row: ``[n]`` int64, row r at output position
    ``position + r`` (see :func:`accept_invariant`). ``probs``: ``[n, V]``
    non-negative masses. What a draft proposes under drafter-invariant
    verification, and plain seeded sampling's token."""
    return _core.race_pick(probs, seed, position)


def race_uniforms(seed: int, position: int, tokens: Sequence[int]) -> np.ndarray:
    """The race's uniforms ``U(seed, position, t)`` for ``tokens``: ``[n]``
    float64 in (0, 1) (for checking other implementations draw for draw)."""
    return _core.race_uniforms(seed, position, tokens)


def _empty_draft(target_probs: Any) -> np.ndarray:
    v = np.shape(target_probs)[-1] if np.ndim(target_probs) == 2 else 1
    return np.zeros((0, v), dtype=np.float32)


def kernels() -> list:
    """Kernel paths this CPU can run, scalar first (e.g. ``['scalar', 'avx2']``)."""
    return _core.kernels()


def get_kernel() -> str:
    """The kernel path in use (set by ``SPECGGUF_KERNEL`` or :func:`set_kernel`)."""
    return _core.get_kernel()


def set_kernel(name: str) -> None:
    """Use kernel path ``name`` (one of :func:`kernels`, or ``'auto'``) process-wide."""
    _core.set_kernel(name)
