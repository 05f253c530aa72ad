"""Model-free drafting: propose what followed the longest earlier match of the
context's suffix (prompt lookup / n-gram drafting).

The proposal is a point mass (the draft is certain of it), so exact
verification accepts each token with probability p(token) and otherwise
resamples from p without it (:func:`specgguf.accept_onehot`); no ``[K, V]``
draft array exists. It costs microseconds, and pays on copy-heavy text:
code edits, summaries that quote, repeated boilerplate.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple


class NgramDraft:
    """``draft_step`` that looks the context's last n tokens up in the context.

    Args:
        n_max: longest suffix tried first.
        n_min: shortest suffix accepted as a match.

    Returns from ``draft_step(prefix, k)``: ``(tokens [<= k], None, info)``
    with ``info = {"onehot": True, "stop": "max" | "end"}``; no match gives no
    tokens (``"end"``).
    """

    def __init__(self, n_max: int = 5, n_min: int = 2) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_max, self.n_min = n_max, n_min
        self._seq: List[int] = []
        self._index: Dict[Tuple[int, ...], int] = {}  # n-gram -> latest position after it

    def _sync(self, prefix: List[int]) -> None:
        n0 = len(self._seq)
        if len(prefix) < n0 or prefix[:n0] != self._seq:  # a new context: rebuild
            self._seq, self._index, n0 = [], {}, 0
        self._seq = list(prefix)
        # Index continuation starts p in [old end, new end - 1]: each n-gram
        # ending at p maps to p, later occurrences overwriting earlier ones.
        seq, start = self._seq, max(n0, 1)
        for p in range(start, len(seq)):
            for n in range(self.n_min, min(self.n_max, p) + 1):
                self._index[tuple(seq[p - n:p])] = p

    def draft_step(self, prefix: List[int], k: int, p_min: Optional[float] = None
                   ) -> Tuple[List[int], None, dict]:
        """Propose up to k tokens (p_min is ignored: a lookup has no confidence)."""
        self._sync(prefix)
        seq, end = self._seq, len(self._seq)
        for n in range(min(self.n_max, end), self.n_min - 1, -1):
            p = self._index.get(tuple(seq[end - n:]))
            if p is not None and p < end:
                tokens = seq[p:p + k]
                return tokens, None, {"onehot": True, "stop": "max" if len(tokens) == k else "end"}
        return [], None, {"onehot": True, "stop": "end"}


class FallbackDraft:
    """Try ``first`` (e.g. an n-gram lookup); if it proposes nothing, use ``second``."""

    def __init__(self, first: Callable, second: Callable) -> None:
        self.first, self.second = first, second

    def draft_step(self, prefix: List[int], k: int, p_min: Optional[float] = None) -> tuple:
        out = self.first(prefix, k)
        if out[0]:
            return out
        return self.second(prefix, k) if p_min is None else self.second(prefix, k, p_min=p_min)
