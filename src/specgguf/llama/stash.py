"""Slots' KV caches kept in host memory when a new request takes their slot,
so that a conversation coming back reads only what its turn adds.

A server with N slots keeps N conversations' texts in its KV caches (a
conversation's next turn goes back to the slot that shares most with it).
With more conversations than slots, a slot taken by another request lost its
text, and the next turn read the whole conversation again: eight
conversations' second turns over four slots read 0.58x llama-server's
tok/s, which keeps an evicted slot's cache in memory (its ``--cache-ram``).
The :class:`Stash` does the same: before a request cuts what a slot holds,
the slot's KV cache (every model's: the target's and the draft's) is copied
to host memory (``llama_state_seq_get_data``); a request sharing more with
a copy than with any free slot gets the copy loaded into its slot
(``llama_state_seq_set_data``). Least recently used copies go first when
the memory bound is reached. Nothing is written to disk.

A copy loaded into a KV stream of its own lands in the cells evaluation
would have used, so every later row is what it would have been had the slot
been kept: outputs stay bit-identical to plain decoding's.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from ..ops.drafter import common_prefix
from .model import LlamaModel, Saved

KEEP_MIN = 32  # tokens a copy must hold past what the request taking its slot shares, to be worth one


class Stash:
    """Copies of slots' KV caches, most recently used last, up to ``limit`` bytes.

    Args:
        models: the models whose slots are copied together (the target first:
            its tokens are what a request is matched against).
        limit: bytes of host memory the copies may take (0: none is kept).
    """

    def __init__(self, models: Sequence[LlamaModel], limit: int) -> None:
        if limit < 0:
            raise ValueError(f"the stash's memory bound must be >= 0 bytes, got {limit}")
        self.models, self.limit = list(models), limit
        self.kept: List[List[Saved]] = []  # each: one Saved per model
        self.used = 0
        self.loaded = 0  # copies loaded back into a slot (for stats and tests)

    def __len__(self) -> int:
        return len(self.kept)

    def before_taking(self, slot: int, ids: Sequence[int]) -> None:
        """A request of prompt ``ids`` is about to run in ``slot``: copy what
        the slot holds that the request would cut (if it is worth a copy),
        then load the copy sharing most with ``ids`` if it shares more than
        the slot does (by at least :data:`KEEP_MIN` tokens)."""
        if not self.limit:
            return
        held = self.models[0].cache[slot]
        shared = common_prefix(held, ids)
        best = max(range(len(self.kept)), key=lambda i: common_prefix(self.kept[i][0].tokens, ids), default=None)
        back = None
        if best is not None and common_prefix(self.kept[best][0].tokens, ids) >= shared + KEEP_MIN:
            back = self._remove(best)
        if len(held) - shared >= KEEP_MIN:
            try:
                self._keep(slot)
            except (RuntimeError, MemoryError):  # not copied: the request cuts it, as without a stash
                pass
        if back is not None:
            for m, saved in zip(self.models, back):
                m.load(slot, saved)
            self.loaded += 1

    def _keep(self, slot: int) -> None:
        copy = [m.save(slot) for m in self.models]
        size = sum(s.nbytes for s in copy)
        if size > self.limit:
            return
        tokens = copy[0].tokens
        for i in reversed(range(len(self.kept))):  # a copy the new one extends is worth nothing now
            if common_prefix(self.kept[i][0].tokens, tokens) == len(self.kept[i][0].tokens):
                self._remove(i)
        while self.used + size > self.limit:
            self._remove(0)
        self.kept.append(copy)
        self.used += size

    def _remove(self, i: int) -> List[Saved]:
        copy = self.kept.pop(i)
        self.used -= sum(s.nbytes for s in copy)
        return copy


def stash_limit(mib: Optional[int], available: Optional[int]) -> int:
    """Bytes for ``cache_ram=mib`` (None: 1 GiB, at most a quarter of the
    memory ``available`` now; 0: no stash)."""
    if mib is not None:
        if mib < 0:
            raise ValueError(f"cache_ram must be >= 0 MiB (0: keep no evicted slot), got {mib}")
        return mib << 20
    default = 1 << 30
    return default if available is None else min(default, available // 4)
