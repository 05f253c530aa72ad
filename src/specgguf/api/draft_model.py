"""A real GGUF draft inside llama-cpp-python's own ``Llama``:
``Llama(target, draft_model=specgguf.DraftModel("tiny.gguf"))``.

llama-cpp-python's draft interface is one stateless call,
``draft_model(input_ids) -> draft ids``, and ``Llama`` verifies by
sample-and-compare (accept while its own sample equals the draft's token).
:class:`DraftModel` makes a GGUF model fit it:

* KV cache: it keeps its own cache aligned with ``input_ids``, cut back to the
  longest common prefix; only what it lacks is evaluated (the same
  :class:`~specgguf.llama.model.LlamaModel` bookkeeping as specgguf's adapter).
* Proposals: greedy, which is what sample-and-compare accepts most often.
* Adaptive K: the next call's ``input_ids`` tell how many of its last proposals
  ``Llama`` kept (they continue the last context with the accepted tokens and
  one more). That, and the time from one call to the next (a whole round:
  the draft's forwards, then ``Llama``'s batched forward and sampling), feed
  specgguf's draft policy. A
  draft that does not pay returns an empty array: no speculation that step.

Note the trade-off (measured in the README): ``Llama`` with a draft forces
``logits_all=True`` (an ``n_ctx x n_vocab`` float32 buffer), and
sample-and-compare accepts less than specgguf's exact verification at
temperature > 0. ``specgguf.SpeculativeLlama`` has neither cost.
"""

from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Union

import llama_cpp
import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

from ..ops.drafter import Draft, common_prefix
from ..config import AUTO_K_MAX, check_k
from ..llama.adapter import ModelDrafter
from ..llama.model import InUse, LlamaModel, ModelLike, load_llama
from ..llama.vocab import check_vocab
from ..llama.models import resolve_model
from ..ops.ngram import NgramDrafter
from ..engine.lookup_first import LookupFirst, Turn, measured, next_turn, report
from ..engine.draft_length import draft_length
from ..engine.policy import Policy, SlotView


REGIME = "greedy"  # what DraftModel proposes: Llama's own sampler decides what it keeps


class _Round:
    """What the last call proposed, to read the next call's input against."""

    def __init__(self, context: List[int], turn: Turn, draft: Optional[Draft], started: float) -> None:
        self.context, self.turn, self.started = context, turn, started
        self.draft = draft or Draft(forwards=[])
        self.tokens = list(self.draft.tokens)
        self.draft_seconds = time.perf_counter() - started

    def accepted(self, ids: List[int]) -> Optional[int]:
        """How many proposals ``ids`` kept, or None if ``ids`` is not this
        generation's next step (a new prompt, a reset)."""
        n = len(self.context)
        if len(ids) < n + 1 or len(ids) > n + len(self.tokens) + 1 or ids[:n] != self.context:
            return None
        a = common_prefix(ids[n:], self.tokens)
        return a if len(ids) == n + a + 1 else None


class DraftModel(LlamaDraftModel):
    """A GGUF draft model for ``llama_cpp.Llama(draft_model=...)``.

    Args:
        model: path, models.lock name, or a loaded ``llama_cpp.Llama``.
        k: draft tokens per call, or ``"auto"`` (chosen per call; 0 when the
            draft does not pay).
        n_threads: threads for a model loaded here (None: every core).
        n_ctx: its context window (None: 4096; at least the target's).
        ngram: try a prompt lookup first, the model only when it finds nothing.

    ``__call__(input_ids [n] intc) -> [k'] intc`` proposes up to K tokens to
    follow ``input_ids``; ``stats`` counts calls, drafted and accepted tokens
    and the K chosen; ``reset()`` empties the cache and the counts. One call at
    a time: a second thread waits.
    """

    def __init__(self, model: ModelLike, *, k: Union[int, str] = "auto", n_threads: Optional[int] = None,
                 n_ctx: Optional[int] = None, ngram: bool = False) -> None:
        k = check_k(k)
        if isinstance(model, llama_cpp.Llama):
            llm = model
        else:
            llm = load_llama(resolve_model(os.fspath(model)), n_ctx or 4096, n_threads)
        self.llm, self.k = llm, k
        self.model = LlamaModel(llm)
        self.drafter = ModelDrafter(self.model)
        self.sampler = self.drafter.sampler  # greedy proposals; its origin marks where output starts
        self.ngram = NgramDrafter(n_min=3) if ngram else None  # tried first, with its own K
        self.guard = InUse("DraftModel")
        self.reset()

    def reset(self) -> None:
        """Empty the KV cache, forget the last round, zero the stats."""
        with self.guard:
            self.model.reset()
            self.length = draft_length(self.k, lambda: Policy(AUTO_K_MAX))
            self.lookup = None if self.ngram is None else LookupFirst(
                self.ngram, draft_length(self.k, lambda: Policy(AUTO_K_MAX, free_draft=True)))
            self.after_miss = False
            self.last: Optional[_Round] = None
            self._stats: Dict[str, object] = {"calls": 0, "drafted": 0, "accepted": 0, "k_hist": {},
                                              "draft_seconds": 0.0}

    @property
    def stats(self) -> dict:
        """calls, drafted, accepted, acceptance_rate, k_chosen (K: calls),
        draft_seconds, and ``why`` (k="auto": the K it would draft now, its
        predicted speed against plain decoding and what that rests on; a
        fixed K: None)."""
        s = dict(self._stats)
        s["acceptance_rate"] = s["accepted"] / s["drafted"] if s["drafted"] else 0.0
        s["k_chosen"] = dict(sorted(s.pop("k_hist").items()))
        s["why"] = self.length.explain(REGIME)
        return s

    def check(self, target: "llama_cpp.Llama") -> None:
        """Raise ValueError unless this draft shares ``target``'s tokenizer."""
        check_vocab(target, self.llm, os.path.basename(target.model_path),
                    os.path.basename(self.llm.model_path))

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        with self.guard:
            ids = [int(t) for t in np.asarray(input_ids).reshape(-1)]
            bad = next((t for t in ids if not 0 <= t < self.model.model_vocab), None)
            if bad is not None:
                raise ValueError(f"token id {bad} is out of range for the draft's vocabulary of "
                                 f"{self.model.model_vocab}: the draft and the target do not share a tokenizer")
            self._learn(ids)
            lag = self.length.draft_lag(lambda: self.model.lag(ids))
            view = SlotView(REGIME, self.length.k_max, False, 1, lag, None, self.after_miss)
            turn = next_turn(ids, view, self.drafter, self.length, self.lookup)
            t0 = time.perf_counter()
            draft = turn.drafter.propose(ids, turn.k) if turn.k > 0 else None
            self.last = _Round(ids, turn, draft, t0)
            self._count(turn.k, self.last.tokens, time.perf_counter() - t0)
            return np.array(self.last.tokens, dtype=np.intc)

    def _learn(self, ids: List[int]) -> None:
        last = self.last
        a = last.accepted(ids) if last is not None else None
        if a is None:  # a new generation: its output starts after the token Llama just sampled
            self.sampler.origin = max(0, len(ids) - 1)
            self.after_miss = False
            return
        self._stats["accepted"] += a
        # The whole round: the draft, then Llama's batched forward and sampling (its "target" here).
        seconds = time.perf_counter() - last.started
        report(last.turn, self.lookup, last.draft, a,
               measured(last.turn, last.draft, last.draft_seconds, seconds - last.draft_seconds, seconds))
        self.after_miss = a < len(last.tokens)

    def _count(self, k: int, tokens: List[int], seconds: float) -> None:
        s = self._stats
        s["calls"] += 1
        s["drafted"] += len(tokens)
        s["draft_seconds"] += seconds
        s["k_hist"][k] = s["k_hist"].get(k, 0) + 1
