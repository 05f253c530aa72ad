"""A draft that costs nothing: what followed the context's suffix where the
same tokens were seen before, in this text or in earlier ones.

Answers about pasted code or documents, revisions of an earlier answer and
an agent's loop copy long runs of tokens the model has already seen. This
drafter keeps one index over a stream of tokens: earlier texts (each a
request's prompt and output, the oldest dropped past ``memory`` tokens) and
the current context at its end. Each round it finds the longest of the
context's last n tokens (n in ``SIZES``) seen before, gathers up to
``FANOUT`` earlier places where they occurred (most recent first: the
current text before older ones), and walks their continuations token by
token, keeping the most frequent next token (SuffixDecoding's frequency-scored
tree, Oliaro et al. 2024, kept shallow); a token's confidence is the share
of the places still followed that agree on it.

The proposal is a point mass: exact verification accepts each token with
the target's probability of it and otherwise resamples without it
(:func:`specgguf.accept_onehot`); seeds stay drafter-invariant. Its cost per
round does not grow with the context: the stream is checked at its ends
(a context that does not extend the last one starts a new text), each new
token adds one entry per n-gram size, and a proposal reads at most FANOUT
places for k tokens.
"""

from __future__ import annotations

from array import array
from typing import Dict, List, Optional, Sequence

from .drafter import Draft

SIZES = (2, 3, 4, 6, 8, 12, 16)  # n-gram lengths indexed; the longest that matches wins
FANOUT = 8                       # earlier places a proposal weighs
CHECK = 8                        # tokens compared at each end to tell a grown context from a new one
SEPARATOR = -1                   # between texts: no n-gram across it matches a context


class SuffixDrafter:
    """A :class:`~specgguf.ops.drafter.Drafter` over the current context and earlier texts.

    Args:
        memory: tokens of earlier texts kept (their prompts and outputs); 0
            keeps only the current one. Held in memory (about 600 bytes a
            token), never written.
        n_min: the shortest suffix accepted as a match.

    ``propose`` returns a one-hot :class:`Draft` with ``confidence`` per token;
    no match gives no tokens (``stop="end"``).
    """

    model_free = True  # its accepted tokens are a lookup's (the API's ``sources``)

    def __init__(self, memory: int = 16384, n_min: int = 2) -> None:
        if memory < 0:
            raise ValueError(f"memory must be >= 0 tokens, got {memory}")
        if n_min not in SIZES:
            raise ValueError(f"n_min must be one of {SIZES}, got {n_min}")
        self.memory, self.sizes = memory, tuple(n for n in SIZES if n >= n_min)
        self.matched = 0  # the length of the suffix the last proposal matched (0: none)
        self._clear()

    def _clear(self) -> None:
        self.stream: List[int] = []  # earlier texts, separated, then the current context
        self.start = 0               # where the current context begins in the stream
        # per size: an n-gram's hash -> the latest position after it (a collision only makes a
        # poor draft: verification is exact); per position, the one after its n-gram before (-1: none)
        self.latest: Dict[int, Dict[int, int]] = {n: {} for n in self.sizes}
        self.before: Dict[int, array] = {n: array("i") for n in self.sizes}
        self.separated = -1  # the last separator's position: no n-gram across it is indexed

    def lag(self, context: Sequence[int]) -> int:
        return 0  # nothing to catch up on: the index follows the context when asked

    def propose(self, context: Sequence[int], k: int, p_min: Optional[float] = None) -> Draft:
        """Up to ``k`` tokens continuing ``context`` (tokens whose confidence falls
        below ``p_min`` end the draft, ``stop="cutoff"``)."""
        self._sync(context)
        end, places, self.matched = len(self.stream), [], 0
        for n in sorted(self.sizes, reverse=True):
            if end - self.start >= n:
                places = self._places(n, hash(tuple(self.stream[end - n:])))
                if places:
                    self.matched = n
                    break
        tokens, confidence, stop = [], [], "end"
        while places and len(tokens) < k:
            if len(places) == 1:  # one place left: its continuation, every token at confidence 1
                p = places[0] + len(tokens)
                run = self.stream[p:min(end, p + k - len(tokens))]
                if SEPARATOR in run:
                    run = run[:run.index(SEPARATOR)]
                tokens += run
                confidence += [1.0] * len(run)
                break
            counts: Dict[int, int] = {}
            for p in places:  # most recent first: on a tie, the most recent place's token
                t = self.stream[p + len(tokens)] if p + len(tokens) < end else SEPARATOR
                if t != SEPARATOR:
                    counts[t] = counts.get(t, 0) + 1
            if not counts:
                break
            best = max(counts, key=counts.get)
            share = counts[best] / len(places)
            if p_min is not None and share < p_min:
                stop = "cutoff"
                break
            tokens.append(best)
            confidence.append(share)
            places = [p for p in places if p + len(tokens) - 1 < end and self.stream[p + len(tokens) - 1] == best]
        if len(tokens) == k:
            stop = "max"
        return Draft(tokens, onehot=True, stop=stop, confidence=confidence, forwards=[])

    def _places(self, n: int, key: int) -> List[int]:
        """Up to FANOUT positions after earlier occurrences of the n-gram hashed ``key``, latest first."""
        out, p = [], self.latest[n].get(key, -1)
        while p >= 0 and len(out) < FANOUT:
            out.append(p)
            p = self.before[n][p]
        return out

    def _sync(self, context: Sequence[int]) -> None:
        """The stream's tail made ``context``: grown by its new tokens, or a new text after a separator."""
        held = len(self.stream) - self.start
        ctx = context
        grown = len(ctx) >= held and all(ctx[i] == self.stream[self.start + i] for i in range(min(CHECK, held))) \
            and all(ctx[held - 1 - i] == self.stream[-1 - i] for i in range(min(CHECK, held)))
        if not grown:
            if self.memory == 0:
                self._clear()
            elif self.stream:
                self._append([SEPARATOR])
            self.start, held = len(self.stream), 0
            if self.start > 2 * self.memory:
                self._trim()
        self._append([int(t) for t in ctx[held:]])

    def _append(self, tokens: List[int]) -> None:
        """Add ``tokens`` to the stream; each n-gram ending before a new position maps to it."""
        s, top = self.stream, self.sizes[-1]
        for t in tokens:
            s.append(t)
            p = len(s) - 1  # the n-grams ending at p - 1 are followed by position p
            window = tuple(s[max(0, p - top):p])  # one slice for every size (their hashes match propose's)
            for n in self.sizes:
                if p < n or self.separated >= p - n:  # too short, or across a separator
                    self.before[n].append(-1)
                    continue
                latest = self.latest[n]
                key = hash(window[-n:])
                self.before[n].append(latest.get(key, -1))
                latest[key] = p
            if t == SEPARATOR:
                self.separated = p

    def _trim(self) -> None:
        """Keep the last ``memory`` tokens of earlier texts (the index rebuilt: once per
        ``memory`` tokens added, so its cost per token stays bounded)."""
        keep = self.stream[self.start - self.memory:]
        current = len(self.stream) - self.start
        self._clear()
        self._append(keep)
        self.start = len(self.stream) - current
