"""Choosing tokens: the warp applied identically to both models, and the
:class:`Sampler` that holds the one rule a generation verifies drafts by.

Before the warp (or the argmax), a row gets the generation's
:class:`~specgguf.ops.logits.LogitRules` (logit bias, penalties, grammar),
given the tokens before its position: the target's K+1 rows and the draft's
rows alike.

Warp order as llama-cpp-python's default sampler chain: top-k, then top-p and
min-p on the softmax of the (untempered) survivors, then temperature on what
is left. Temperature 0 means greedy and never reaches the warp.
"""

from __future__ import annotations

import numbers
import secrets
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from .drafter import Draft
from .logits import Cut, LogitRules, Logprobs, Penalties
from .verify import GeneratorLike, accept, accept_invariant, accept_onehot, as_generator, race_pick, verify_greedy

RULES = ("greedy", "exact", "invariant")


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
        TypeError: a setting of the wrong type.
        ValueError: bad settings, or a row with NaN/+inf or no finite logit.
    """
    if not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return _core.warp(logits, float(temperature), int(top_k), float(top_p), float(min_p))


def seed_fixes_text(rule: str, seed: Optional[int]) -> bool:
    """Exact p/q sampling with a seed: the one setting whose text the draft's logits to the last bit,
    and the K chosen each round, can change (each verdict weighs the draft's q, and K decides which
    uniforms are drawn), while the same seed and settings must give it again. Greedy and race
    verdicts never read the draft's rows; unseeded p/q sampling promises no text."""
    return rule == "exact" and seed is not None


class Sampler:
    """The rule by which one generation picks and verifies tokens.

    Args:
        rule: ``"greedy"`` (argmax; rows may be logits), ``"exact"`` (the
            min(1, p/q) rule of Leviathan et al., with ``generator``) or
            ``"invariant"`` (the shared-noise race with ``seed``: the output
            is plain seeded sampling's, whatever the draft).
        warping: ``(temperature, top_k, top_p, min_p)``; unused when greedy.
        generator: the verifier's random source (exact rule).
        draft_generator: the draft's own random source (exact rule).
        seed: the race's seed (invariant rule; None: fresh entropy).
        origin: the prompt's length; output position = context length - origin.
        rules: :class:`~specgguf.ops.logits.LogitRules` applied to every row
            before the warp (None: none).
        logprobs: record the emitted tokens' log-probabilities with this many
            alternatives each (None: do not record).
    """

    def __init__(self, rule: str = "greedy", warping: Tuple[float, int, float, float] = (1.0, 0, 1.0, 0.0), *,
                 generator: GeneratorLike = None, draft_generator: GeneratorLike = None,
                 seed: Optional[int] = None, origin: int = 0, rules: Optional[LogitRules] = None,
                 logprobs: Optional[int] = None) -> None:
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
        self.rule = rule
        self.warping = warping
        self.generator = as_generator(generator)
        self.draft_generator = as_generator(draft_generator)
        self.seed = secrets.randbits(64) if seed is None and rule == "invariant" else seed
        self.origin = origin
        self.emitted_p: Dict[int, float] = {}  # exact rule: the target's p(x) of each token emitted, by position
        self.rules = rules if rules is not None and rules.active else None
        self.logprobs = Logprobs(logprobs) if logprobs is not None else None
        # What of a row the warp reads: what a grammar must check.
        self.cut = Cut(1) if rule == "greedy" else Cut(max(0, warping[1]), warping[2], warping[3])
        # Rows with no top-k under a grammar, verified by the race: check race winners, not the whole row.
        self.race_grammar = (rule == "invariant" and self.cut.top_k == 0 and self.rules is not None
                             and self.rules.grammar is not None)

    @property
    def reads_draft_bits(self) -> bool:
        """Whether the draft's logits, to the last bit, can change a text that the
        same settings must give again (:func:`seed_fixes_text`)."""
        return seed_fixes_text(self.rule, self.seed)

    @classmethod
    def from_config(cls, config, origin: int = 0, grammar=None) -> "Sampler":
        """The sampler a :class:`~specgguf.config.GenerationConfig` asks for.
        With the exact rule and a seed, the verifier draws from ``seed`` and
        the draft from ``seed + 1`` (two independent streams). ``grammar``:
        ``config.grammar`` compiled for the target's vocabulary (a
        :class:`~specgguf.llama.grammar.Grammar`), which the sampler then owns."""
        seed = config.seed
        if (config.grammar is None) != (grammar is None):
            raise ValueError("config.grammar and the compiled grammar must come together")
        rules = LogitRules(dict(config.logit_bias), Penalties(config.repeat_penalty, config.frequency_penalty,
                                                             config.presence_penalty, config.penalty_last_n),
                           grammar)
        return cls(config.verification, (config.temperature, config.top_k, config.top_p, config.min_p),
                   generator=seed, draft_generator=None if seed is None else (seed + 1) % 2**64,
                   seed=seed, origin=origin, rules=rules, logprobs=config.logprobs)

    def restart(self) -> None:
        """A new generation from the same prompt length: the rules' state
        (the grammar's) and the recorded logprobs start over."""
        if self.rules is not None:
            self.rules.restart()
        if self.logprobs is not None:
            self.logprobs.restart()

    def close(self) -> None:
        """Free the grammar's states (also done when the sampler is collected)."""
        if self.rules is not None:
            self.rules.close()

    @property
    def greedy(self) -> bool:
        return self.rule == "greedy"

    def warp(self, logits: np.ndarray) -> np.ndarray:
        """``[n, V]`` logits to what the verifier reads, without the rules (for
        estimates only): the logits themselves when greedy, else the warped
        probabilities."""
        return logits if self.greedy else warp(logits, *self.warping)

    def _ruled(self, logits: np.ndarray, context: Sequence[int]) -> np.ndarray:
        if self.rules is None:
            return logits
        return self.rules.apply(logits, context, self.origin, self.cut, grammar=not self.race_grammar)

    def _rows(self, logits: np.ndarray, context: Sequence[int]) -> Tuple[np.ndarray, Optional[List[int]]]:
        """The verifier's rows, and under :attr:`race_grammar` each row's race winner."""
        rows = self.warp(self._ruled(logits, context))
        wins = self.rules.race_mask(rows, context, self.origin, self.seed) if self.race_grammar else None
        return rows, wins

    def target_rows(self, logits: np.ndarray, context: Sequence[int]) -> np.ndarray:
        """The target's ``[n, V]`` logits to what the verifier reads: the
        rules applied (row i given ``context[:len(context) - n + 1 + i]``),
        then the logits themselves when greedy, else the warped
        probabilities. Records the rows for logprobs when asked."""
        if self.logprobs is not None:
            self.logprobs.record(logits, len(context) - len(logits) + 1 - self.origin)
        return self._rows(logits, context)[0]

    def pick(self, logits: np.ndarray, context: Sequence[int]) -> Tuple[int, float, Optional[np.ndarray]]:
        """The draft's token after ``context`` (prompt and tokens so far), from
        its ``[V]`` logits: ``(token, confidence, q)``; q (``[V]`` float32)
        only for the exact rule, which verifies against it."""
        context_len = len(context)
        if self.race_grammar:  # the grammar's race check names the winner: no second race
            rows, wins = self._rows(logits[None, :], context)
            return wins[0], float(rows[0, wins[0]] / rows[0].sum()), None
        logits = self._ruled(logits[None, :], context)[0]
        if self.greedy:
            tok = int(np.argmax(logits))
            return tok, float(1.0 / np.exp(logits - logits[tok]).sum()), None
        q = warp(logits[None, :], *self.warping)[0]
        if self.rule == "invariant":
            tok = int(race_pick(q[None, :], self.seed, context_len - self.origin)[0])
            return tok, float(q[tok]), None
        cum = np.cumsum(q, dtype=np.float64)
        tok = int(min(np.searchsorted(cum, self.draft_generator.random() * cum[-1], side="right"), len(q) - 1))
        return tok, float(q[tok]), q

    def verify(self, target: np.ndarray, draft: Draft, position: int) -> Tuple[int, int]:
        """``(n_accepted, next_token)`` for target rows ``[len(draft.tokens)+1, V]``
        (from :meth:`target_rows`) at output ``position`` (tokens generated
        before this round)."""
        n, nxt = self._verify(target, draft, position)
        emitted = list(draft.tokens[:n]) + [nxt]
        if self.rules is not None:
            self.rules.commit(emitted)
        if self.logprobs is not None:
            self.logprobs.emit(emitted)
        return n, nxt

    def _verify(self, target: np.ndarray, draft: Draft, position: int) -> Tuple[int, int]:
        if self.rule == "greedy":
            return verify_greedy(target, draft.tokens)
        if self.rule == "invariant":
            return accept_invariant(target, draft.tokens, self.seed, position)
        if draft.onehot:
            n, nxt = accept_onehot(target, draft.tokens, self.generator)
        else:
            n, nxt = accept(target, draft.probs, draft.tokens, self.generator)
        # What the target gave each emitted token, for agreement(): row i scores position + i.
        for i, t in enumerate(list(draft.tokens[:n]) + [nxt]):
            self.emitted_p[position + i] = float(target[i, t])
        return n, nxt


def agreement(sampler: Sampler, rows: np.ndarray, context: Sequence[int], first: int) -> Tuple[float, int]:
    """How a draft would have fared on tokens already emitted, by ``sampler``'s rule.

    Args:
        rows: ``[m, V]`` float32, the draft's logits; row i predicts
            ``context[first + i]`` from the tokens before it.
        context: the prompt and the tokens emitted after it.
        first: index in ``context`` of the token row 0 predicts.

    Returns:
        ``(acceptances, positions)``: the expected number of the draft's
        tokens verification would have accepted there, and over how many
        positions. Only emitted tokens count (index >= ``origin``): the
        prompt was not drawn from the target. Per position, the acceptance
        event or an unbiased estimate of its probability:

        * greedy: the draft's argmax is the emitted token (the target's);
        * invariant: the draft's race pick, with the position's own
          noise, is the emitted token: exactly the race's acceptance;
        * exact: ``min(1, q(x) / p(x))`` for the emitted x with p(x)
          recorded at emission. Emitted tokens follow p whatever K was,
          so its mean is ``sum_x min(p(x), q(x))``, the acceptance of a
          draft token sampled from q.
    """
    skip = max(0, sampler.origin - first)
    rows, first = rows[skip:], first + skip
    if len(rows) == 0:
        return 0.0, 0
    tokens = np.asarray(context[first:first + len(rows)], dtype=np.int64)
    if sampler.rule == "greedy":
        return float(np.count_nonzero(np.argmax(rows, axis=1) == tokens)), len(tokens)
    q = warp(rows, *sampler.warping)
    if sampler.rule == "invariant":
        picks = race_pick(q, sampler.seed, first - sampler.origin)
        return float(np.count_nonzero(picks == tokens)), len(tokens)
    p = np.array([sampler.emitted_p.get(first - sampler.origin + i, 0.0) for i in range(len(tokens))])
    kept = np.flatnonzero(p > 0)  # positions whose p(x) was recorded
    qx = q[kept, tokens[kept]].astype(np.float64)
    return float(np.minimum(1.0, qx / p[kept]).sum()), len(kept)


def rows_agreement(sampler: Sampler, t_rows: np.ndarray, d_rows: np.ndarray) -> float:
    """The draft's acceptance over paired rows ``[n, V]`` of the target and the
    draft (logits for the same positions), as the sampler's rule would
    accept: argmax agreement (greedy), sum(min(p, q)) (exact), or the race's
    lower bound s / (2 - s) (drafter-invariant)."""
    if sampler.greedy:
        return float(np.mean(np.argmax(t_rows, axis=1) == np.argmax(d_rows, axis=1)))
    # Warped rows are float32: a row the two models share sums to 1 give or take rounding (1 + 4e-9
    # was measured, and a policy rightly refuses an acceptance above 1).
    overlap = np.minimum(np.minimum(sampler.warp(t_rows), sampler.warp(d_rows)).sum(axis=1, dtype=np.float64), 1.0)
    return float(np.mean(overlap if sampler.rule == "exact" else overlap / (2.0 - overlap)))
