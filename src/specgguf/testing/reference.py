"""Plain numpy reference of the verification ops, for checking, not speed.

Same contract as :mod:`specgguf.ops.verify` (same uniforms, same decisions), but
written the obvious way in float64 with ``np.sum``/``np.cumsum``. Its sums
round in a different order from the compiled kernels, so on a draw that lands
within rounding of a decision boundary the two may legitimately differ; the
``margin`` it returns says how close the nearest decision was (relative), so a
test can tell such a tie from a bug.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np


def _mass(row: np.ndarray, name: str, i: int) -> np.ndarray:
    """A row of masses as float64, checked as the compiled ops check the rows they read."""
    x = np.asarray(row, dtype=np.float64)
    if not np.isfinite(x).all() or (x < 0).any():
        raise ValueError(f"{name} row {i} contains NaN, Inf or a negative value")
    if x.sum() == 0:
        raise ValueError(f"{name} row {i} has zero total mass")
    return x


def verify_greedy(target_probs: np.ndarray, draft_tokens: Sequence[int]) -> Tuple[int, int]:
    """Reference of :func:`specgguf.verify_greedy`. target_probs ``[K+1, V]``."""
    target = np.asarray(target_probs)
    k = len(draft_tokens)
    for i in range(k + 1):
        row = target[i].astype(np.float32)
        if np.isnan(row).any() or np.isposinf(row).any():
            raise ValueError(f"target_probs row {i} contains NaN or +Inf")
        a = int(np.argmax(row))
        if i == k or int(draft_tokens[i]) != a:
            return i, a
    raise AssertionError("unreachable")


def _sample(mass: np.ndarray, total: float, u: float) -> Tuple[int, float]:
    """Smallest j with cumsum(mass)[j] > u * total; and the relative margin."""
    c = np.cumsum(mass)
    x = u * total
    j = int(np.searchsorted(c, x, side="right"))
    if j >= len(mass):  # rounding: the last token with mass
        j = int(np.flatnonzero(mass > 0)[-1])
    near = [abs(c[i] - x) for i in (j - 1, j) if 0 <= i < len(c)]
    return j, min(near) / total


def accept_uniforms(target_probs: np.ndarray, draft_probs: np.ndarray,
                    draft_tokens: Sequence[int], uniforms: Sequence[float]
                    ) -> Tuple[int, int, float]:
    """Reference of :func:`specgguf.accept_uniforms`.

    Returns ``(n_accepted, next_token, margin)``: margin is the smallest
    relative distance of any decision taken to its threshold.
    """
    target = np.asarray(target_probs)
    k = len(draft_tokens)
    draft = np.asarray(draft_probs).reshape(k, target.shape[1])
    u = np.asarray(uniforms, dtype=np.float64)
    margin = np.inf
    for i in range(k):
        # Rows are converted (and checked) as they are read: rows after a rejection never are.
        t = int(draft_tokens[i])
        p, q = _mass(target[i], "target_probs", i), _mass(draft[i], "draft_probs", i)
        P, Q = p.sum(), q.sum()
        lhs, rhs = u[i] * q[t] * P, p[t] * Q
        margin = min(margin, abs(lhs - rhs) / max(rhs, lhs, 1e-300))
        if lhs < rhs:
            continue
        r = np.maximum(p * Q - q * P, 0.0)
        R = r.sum()
        thr = P * Q * 1e-15
        if thr > 0:
            with np.errstate(over="ignore", divide="ignore"):
                margin = min(margin, abs(np.log(max(R, 1e-300) / thr)))
        if not R > P * Q * 1e-15:  # residual vanished to rounding: sample p
            r, R = p, P
        j, m = _sample(r, R, u[k])
        return i, j, min(margin, m)
    p = _mass(target[k], "target_probs", k)
    j, m = _sample(p, p.sum(), u[k])
    return k, j, min(margin, m)


def accept_onehot_uniforms(target_probs: np.ndarray, draft_tokens: Sequence[int],
                           uniforms: Sequence[float]) -> Tuple[int, int, float]:
    """Reference of :func:`specgguf.accept_onehot_uniforms`: :func:`accept_uniforms`
    with one-hot draft rows, which is its contract."""
    target = np.asarray(target_probs)
    k, v = len(draft_tokens), target.shape[1]
    onehot = np.zeros((k, v), np.float32)
    onehot[np.arange(k), np.asarray(draft_tokens, dtype=np.int64)] = 1.0
    return accept_uniforms(target, onehot, draft_tokens, uniforms)


def exp_floor(x: np.ndarray) -> np.ndarray:
    """E, the warp's exp (``cpp/warp.h``): ``exp`` of float32 arguments, as
    float32, and 0 below -64 (where the compiled one stops, so every
    probability stays a normal float). The compiled E is a float polynomial
    within a few ulp of this."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(x >= np.float32(-64.0), np.exp(x.astype(np.float64)), 0.0).astype(np.float32)


def warp(logits: np.ndarray, temperature: float, top_k: int = 40, top_p: float = 0.95,
         min_p: float = 0.05) -> np.ndarray:
    """Reference of :func:`specgguf.ops.sampling.warp`: ``[n, V]`` logits -> probabilities,
    by the definition in ``cpp/warp.h`` (float32 arguments, float32 results)."""
    logits = np.asarray(logits, dtype=np.float32)
    n, v = logits.shape
    out = np.zeros((n, v), dtype=np.float32)
    inv_t = np.float32(1.0 / temperature)
    for r in range(n):
        row = logits[r]
        if np.isnan(row).any() or np.isposinf(row).any() or not np.isfinite(row).any():
            raise ValueError(f"logits row {r} contains NaN or +inf, or has no finite value")
        order = np.lexsort((np.arange(v), -row))  # by logit, ties to the lower index
        order = order[np.isfinite(row[order])]
        if 0 < top_k < v:
            order = order[:top_k]
        vals = row[order]
        with np.errstate(over="ignore"):  # a distance past float's range is -inf: E gives 0, as in C++
            m = exp_floor(vals - vals[0])  # masses at temperature 1
            keep = len(m)
            if top_p < 1.0:
                mass = m.astype(np.float64)
                keep = min(keep, int(np.searchsorted(np.cumsum(mass), top_p * mass.sum())) + 1)
            kept = order[:keep][m[:keep] >= min_p]  # min-p: m >= min_p (the top's m is 1)
            e = exp_floor((row[kept] - vals[0]) * inv_t)
        out[r, kept] = e * np.float32(1.0 / e.astype(np.float64).sum())
    return out


_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def race_uniform(seed: int, position: int, token: int) -> float:
    """Reference of the race's counter-based uniform U(seed, position, token)."""
    h = _mix64(_mix64(_mix64(seed) ^ position) ^ token)
    return ((h >> 11) + 0.5) * 2.0**-53


def race_pick(row: np.ndarray, seed: int, position: int) -> int:
    """Reference of :func:`specgguf.race_pick` for one ``[V]`` row of masses:
    argmin over tokens with mass of -log(U) / mass (ties: lower index)."""
    import math
    row = _mass(row, "probs", 0)
    best, pick = math.inf, -1
    for t in np.flatnonzero(np.asarray(row) > 0):
        e = -math.log(race_uniform(seed, position, int(t))) / float(row[t])
        if e < best:
            best, pick = e, int(t)
    return pick


def accept_invariant(target_probs: np.ndarray, draft_tokens: Sequence[int], seed: int,
                     position: int) -> Tuple[int, int]:
    """Reference of :func:`specgguf.accept_invariant`."""
    target = np.asarray(target_probs)
    for i in range(len(draft_tokens) + 1):
        _mass(target[i], "target_probs", i)
        y = race_pick(target[i], seed, position + i)
        if i == len(draft_tokens) or int(draft_tokens[i]) != y:
            return i, y
    raise AssertionError("unreachable")
