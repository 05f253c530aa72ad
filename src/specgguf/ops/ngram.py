"""Model-free drafting: propose what followed the longest earlier match of the
context's suffix (prompt lookup / n-gram drafting).

The proposal is a point mass (the draft is certain of it), so exact
verification accepts each token with probability p(token) and otherwise
resamples from p without it (:func:`specgguf.accept_onehot`); no ``[K, V]``
draft array exists. It costs microseconds, and pays on copy-heavy text:
code edits, summaries that quote, repeated boilerplate.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .drafter import Draft


class NgramDrafter:
    """A :class:`~specgguf.ops.drafter.Drafter` that looks the context's last n
    tokens up in the context.

    Args:
        n_max: longest suffix tried first.
        n_min: shortest suffix accepted as a match.

    ``propose`` returns a one-hot :class:`Draft`; no match gives no tokens
    (``stop="end"``). The index is kept incrementally while the context grows.
    """

    model_free = True  # its accepted tokens are a lookup's (the API's ``sources``)

    def __init__(self, n_max: int = 5, n_min: int = 2) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_max, self.n_min = n_max, n_min
        self._seq: List[int] = []
        self._index: Dict[Tuple[int, ...], int] = {}  # n-gram -> latest position after it

    def lag(self, context: Sequence[int]) -> int:
        return 0  # a dictionary lookup has nothing to catch up on

    def _sync(self, context: Sequence[int]) -> None:
        n0 = len(self._seq)
        if len(context) < n0 or list(context[:n0]) != self._seq:  # a new context: rebuild
            self._seq, self._index, n0 = [], {}, 0
        self._seq = list(context)
        # Index continuation starts p in [old end, new end - 1]: each n-gram
        # ending at p maps to p, later occurrences overwriting earlier ones.
        seq = self._seq
        for p in range(max(n0, 1), len(seq)):
            for n in range(self.n_min, min(self.n_max, p) + 1):
                self._index[tuple(seq[p - n:p])] = p

    def propose(self, context: Sequence[int], k: int, p_min: Optional[float] = None) -> Draft:
        """Up to k tokens (p_min is ignored: a lookup has no confidence)."""
        self._sync(context)
        seq, end = self._seq, len(self._seq)
        for n in range(min(self.n_max, end), self.n_min - 1, -1):
            p = self._index.get(tuple(seq[end - n:]))
            if p is not None and p < end:
                tokens = seq[p:p + k]
                return Draft(tokens, onehot=True, stop="max" if len(tokens) == k else "end", forwards=[])
        return Draft([], onehot=True, stop="end", forwards=[])

