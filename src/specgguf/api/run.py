"""One generation of a :class:`~specgguf.api.SpeculativeLlama`, from checked
prompt ids and settings to text pieces and its result.

Alone (``parallel=1``): under the pair's lock, the models' caches readied,
the engine's rounds over the one sequence, in the caller's thread (K objects
from :class:`~specgguf.engine.learning.Learning`). With several slots: a
ticket in the :class:`~specgguf.engine.batch.Engine`'s shared rounds, in its
thread. Either way the same round loop
(:class:`~specgguf.engine.rounds.Rounds`) plays every round, and the tokens
become text through a :class:`~specgguf.llama.text.TextStream`, and the
models are usable after any exit (an error or Ctrl-C empties them).
"""

from __future__ import annotations

import time
from typing import Iterator, List, Optional

from ..config import GenerationConfig
from ..engine.batch import Engine
from ..config import AUTO_K_MAX, LOOKUP_K_MAX
from ..engine.learning import Learning, clock_blind
from ..engine.rounds import Request, Rounds, one_sequence
from ..llama.model import InUse, ubatches
from ..llama.pair import ModelPair
from ..llama.text import TextStream
from ..ops.sampling import Sampler
from ..ops.suffix import SuffixDrafter
from .output import GenerationResult, Pieces, result


class Runner:
    """Runs generations on ``pair``: one at a time under ``guard``, or, with
    several slots, in ``engine``'s shared rounds; K from ``learning``'s policy."""

    def __init__(self, pair: ModelPair) -> None:
        self.pair, self.guard = pair, InUse("SpeculativeLlama")
        # Several slots keep a KV stream each in the target: a round may take several passes.
        split = pair.slots > 1 and not pair.target.model.unified
        # A lookup alone (draft="ngram") in one sequence's rounds drafts long copies; shared rounds keep K short.
        alone = pair.draft_model is None and pair.slots == 1
        self.learning = Learning(pair.state, pair.draft_model is None, ubatches if split else None,
                                 LOOKUP_K_MAX if alone else AUTO_K_MAX)
        self.engine: Optional[Engine] = None
        if pair.slots > 1:
            draft = pair.draft_model.model if pair.draft_model else None
            self.engine = Engine(pair.target.model, draft, None if draft else pair.drafter, self.learning.online,
                                 pair.lookups, self.learning.lookup, pair.stash())

    def __call__(self, ids: List[int], config: GenerationConfig, sampler: Sampler, should_stop) -> Iterator:
        """Text pieces (:class:`~specgguf.api.output.Piece`), then the
        :class:`GenerationResult`; ``should_stop()`` is asked once per token."""
        if self.engine is not None:
            return self._in_engine(ids, config, sampler, should_stop)
        return self._alone(ids, config, sampler, should_stop)

    def _alone(self, ids: List[int], config: GenerationConfig, sampler: Sampler, should_stop) -> Iterator:
        """One generation in the caller's thread: the engine's rounds over one
        sequence (:func:`~specgguf.engine.rounds.one_sequence`), under the pair's lock."""
        pair = self.pair
        with self.guard:
            length = self.learning.length(config)
            if not pair.owns:  # the Llama objects may have been used on their own since
                pair.reset(unless_held=not length.cold)
            t0, before = time.perf_counter(), pair.timers()
            cached = len(ids) - pair.target.model.lag(ids)
            # A seeded p/q text depends on what was drafted: its lookups remember no earlier call.
            forget = clock_blind(config)
            req = Request(ids, self.budget(ids, config), pair.eog, sampler, config.regime,
                          length,
                          None if pair.lookup is None else self.learning.lookup_length(config), config.p_min,
                          plain_first=True)  # the first token at once
            lookups = None if pair.lookup is None else [SuffixDrafter(0) if forget else pair.lookup]
            rounds = Rounds(pair.target.model, pair.rounds_drafter(sampler, forget), lookups)
            out, produced = self._text(config), []
            yield from self._decode(one_sequence(rounds, req), out, should_stop, produced, sampler, req.stats)
            seconds = time.perf_counter() - t0
            self.learning.finish(req.length, config)
            res = self._result(req, out, produced[:out.n_tokens()], len(ids), seconds, before)
            res.stats["cached_tokens"] = max(0, cached)
            res.stats["why"] = req.length.explain(config.regime)
            yield res

    def _in_engine(self, ids: List[int], config: GenerationConfig, sampler: Sampler, should_stop) -> Iterator:
        """One generation among others in the engine's shared rounds (``parallel`` > 1)."""
        pair, engine = self.pair, self.engine
        t0, before = time.perf_counter(), pair.timers()
        ticket = engine.submit(ids, self.budget(ids, config), pair.eog, sampler, config.regime,
                               config.k, config.p_min,
                               start=lambda: self.learning.ready(self.learning.online, config))
        out, produced = self._text(config), []
        yield from self._decode(iter(ticket), out, should_stop, produced, sampler, ticket.stats)
        self.learning.keep(config.regime, engine.record(config.regime))  # for later processes
        if ticket.length is self.learning.online:
            engine.store(self.learning.keep_costs)
        res = self._result(ticket, out, produced[:out.n_tokens()], len(ids), time.perf_counter() - t0, before)
        res.stats["cached_tokens"] = ticket.cached
        res.stats["why"] = engine.explain(ticket)
        yield res

    def budget(self, ids: List[int], config: GenerationConfig) -> int:
        """Tokens this generation may emit: max_tokens, within the context window."""
        return min(config.max_tokens, self.pair.n_ctx - len(ids))

    def _text(self, config: GenerationConfig) -> TextStream:
        """The text of one generation, ended by its stop strings or an end-of-generation token."""
        llm = self.pair.target_llm
        return TextStream(lambda t: llm.detokenize([t], special=False), config.stop, self.pair.eog)

    def _decode(self, tokens: Iterator[int], out: TextStream, should_stop, produced: List[int],
                sampler: Sampler, stats):
        """:class:`~specgguf.api.output.Piece` s of text from ``tokens`` until ``out`` or
        ``should_stop`` ends them (``stats``: the run's, with each token's
        provenance); the models are reset after an error. After a clean run
        their caches keep the text for the next call, the caller's ``Llama``
        objects' too (their own next use starts from scratch: see
        :meth:`~specgguf.llama.model.LlamaModel.held`)."""
        clean, piece = False, Pieces(out, stats, sampler.logprobs)
        try:
            for tok in tokens:
                produced.append(tok)
                text = out.add(tok)
                if text:
                    yield piece(text)
                if out.stopped or (should_stop is not None and should_stop()):
                    out.stopped = True
                    break
            rest = out.finish()
            if rest:
                yield piece(rest)
            clean = True
        finally:
            close = getattr(tokens, "close", None)
            if close is not None:
                close()  # an engine's request ends (cancelled) with its stream
            if self.engine is None:  # the engine's thread may still read it: freed when collected
                sampler.close()
            if not clean and self.engine is None:
                self.pair.reset()  # clean and usable after any exit, Ctrl-C included

    def _result(self, run, out: TextStream, tokens: List[int], n_prompt: int,
                seconds: float, before: tuple) -> GenerationResult:
        spent = [b - a for a, b in zip(before, self.pair.timers())]
        return result(run, out, tokens, n_prompt, self.pair.n_ctx, seconds, spent)
