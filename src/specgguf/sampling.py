"""Logit warping applied identically to both models (so p/q verification is exact).

Order as llama-cpp-python's default sampler chain: top-k, then top-p and
min-p on the softmax of the (untempered) survivors, then temperature on what
is left. Temperature 0 means greedy and never reaches this module.
"""

from __future__ import annotations

import numpy as np


def warp(logits: np.ndarray, temperature: float, top_k: int = 40, top_p: float = 0.95,
         min_p: float = 0.05) -> np.ndarray:
    """Warp logits into sampling probabilities.

    Args:
        logits: ``[n, V]`` float32 (``-inf`` allowed: padding/masked tokens).
        temperature: > 0.
        top_k: keep the k largest logits (0 or >= V: all).
        top_p: keep the smallest prefix (by probability) whose mass reaches top_p.
        min_p: keep tokens with probability >= min_p * the top probability.

    Returns:
        ``[n, V]`` float32 probabilities, zero outside each row's kept set.
    """
    n, v = logits.shape
    out = np.zeros((n, v), dtype=np.float32)
    for r in range(n):
        row = logits[r]
        if 0 < top_k < v:
            idx = np.argpartition(row, v - top_k)[v - top_k:]
        else:
            idx = np.arange(v)
        vals = row[idx].astype(np.float64)
        order = np.argsort(-vals, kind="stable")
        idx, vals = idx[order], vals[order]
        idx, vals = idx[np.isfinite(vals)], vals[np.isfinite(vals)]
        p = np.exp(vals - vals[0])
        p /= p.sum()
        keep = len(p)
        if top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(p), top_p)) + 1)
        if min_p > 0.0:
            keep = min(keep, max(1, int(np.count_nonzero(p >= min_p * p[0]))))
        w = np.exp((vals[:keep] - vals[0]) / temperature)
        out[r, idx[:keep]] = w / w.sum()
    return out
