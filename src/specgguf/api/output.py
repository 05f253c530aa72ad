"""One generation's output: text pieces as they come, then the result.

The tokens a run produces become text through a
:class:`~specgguf.llama.text.TextStream` (which also decides where the
output ends); each streamed :class:`Piece` carries the provenance (draft or
target) and the logprobs of the tokens whose text completed with it, and the
:class:`GenerationResult` carries them all with the run's stats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..engine.stats import sources
from ..llama.invariance import batch_invariance
from ..llama.text import TextStream


@dataclass
class GenerationResult:
    """What :func:`~specgguf.generate` returns: text, generated token ids, why it stopped, stats.

    ``tokens`` are the generated tokens whose text is entirely in ``text``
    (an end-of-generation token is never included; see :class:`TextStream`).
    ``logprobs`` (when asked for): one ``(token, logprob, [(id, logprob)])``
    per token of ``tokens``, under the target's raw logits. ``sources``: one
    entry per token of ``tokens``, ``"draft"`` (a draft model's token the
    target accepted), ``"lookup"`` (a lookup's, accepted) or ``"target"``
    (a token the target produced itself).
    """

    text: str
    tokens: List[int]
    finish_reason: str
    stats: Dict[str, Any] = field(default_factory=dict)
    logprobs: Optional[List[tuple]] = None
    sources: List[str] = field(default_factory=list)


class Piece(str):
    """A streamed text piece. ``sources`` and ``logprobs`` (when asked for)
    cover the tokens whose text completed with it (see
    :class:`GenerationResult`): a stream's pieces together carry the result's."""

    sources: List[str] = []
    logprobs: Optional[List[tuple]] = None


class Pieces:
    """Makes the :class:`Piece` s of one run: each covers the tokens whose
    text ``out`` completed since the last one.

    Args:
        out: the run's text.
        stats: its :class:`~specgguf.engine.stats.DecoderStats` (each token's provenance).
        logprobs: its sampler's :class:`~specgguf.ops.logits.Logprobs`, or None.
    """

    def __init__(self, out: TextStream, stats, logprobs=None) -> None:
        self.out, self.stats, self.logprobs = out, stats, logprobs
        self.sent = 0  # tokens covered by the pieces made so far

    def __call__(self, text: str) -> Piece:
        p = Piece(text)
        done = self.out.n_tokens()  # the tokens whose text is now complete
        p.sources = sources(self.stats.from_draft[self.sent:done])
        if self.logprobs is not None:
            p.logprobs = self.logprobs.entries[self.sent:done]
        self.sent = done
        return p


def result(run, out: TextStream, tokens: List[int], n_prompt: int, n_ctx: int, seconds: float,
           spent: List[float]) -> GenerationResult:
    """The :class:`GenerationResult` of ``run`` (a request of the rounds:
    its ``stats`` and ``sampler``), which produced ``tokens`` after
    ``n_prompt`` prompt tokens in ``seconds``; ``spent``: the seconds the
    models' forwards took (``ModelPair.timers`` differences)."""
    forwards, warp = sum(spent), run.stats.warp_seconds
    n = len(tokens)
    stats = run.stats.as_dict()
    after_first = seconds - stats["first_target_seconds"]  # the first round also read the prompt
    stats.update(decode_tokens_per_second=(n - 1) / after_first if n > 1 and after_first > 0 else 0.0,
                 context_full=out.finish_reason == "length" and n_prompt + run.stats.emitted >= n_ctx,
                 tokens_per_second=n / seconds if seconds else 0.0, seconds=seconds, completion_tokens=n,
                 forward_seconds=forwards, warp_seconds=warp, overhead_seconds=seconds - forwards,
                 prompt_tokens=n_prompt, finish_reason=out.finish_reason, verification=run.sampler.rule,
                 bit_identical=batch_invariance() > 0)
    lp = run.sampler.logprobs
    return GenerationResult(text=out.text, tokens=tokens, finish_reason=out.finish_reason, stats=stats,
                            logprobs=None if lp is None else lp.entries[:n],
                            sources=sources(run.stats.from_draft[:n]))
