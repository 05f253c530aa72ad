"""Logit warping applied identically to both models (so p/q verification is exact).

Order as llama-cpp-python's default sampler chain: top-k, then top-p and
min-p on the softmax of the (untempered) survivors, then temperature on what
is left. Temperature 0 means greedy and never reaches this module.
"""

from __future__ import annotations

import numpy as np

from . import _core


def warp(logits: np.ndarray, temperature: float, top_k: int = 40, top_p: float = 0.95,
         min_p: float = 0.05) -> np.ndarray:
    """Warp logits into sampling probabilities (compiled: ``cpp/warp.cpp``).

    Args:
        logits: ``[n, V]`` float32 (``-inf`` allowed: padding/masked tokens).
        temperature: > 0.
        top_k: keep the k largest logits, ties to the lower index (0 or >= V: all).
        top_p: keep the smallest prefix (by probability) whose mass reaches top_p.
        min_p: keep tokens with probability >= min_p * the top probability.

    Returns:
        ``[n, V]`` float32 probabilities, zero outside each row's kept set.

    Raises:
        ValueError: bad settings, or a row with NaN/+inf or no finite logit.
    """
    return _core.warp(logits, temperature, top_k, top_p, min_p)
