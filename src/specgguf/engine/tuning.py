"""The draft policy's numbers, in one place (:mod:`~specgguf.engine.policy`).

Each was kept because the offline simulator (``bench/simulate.py --ablate``)
loses more than 0.01 of its speed on some trace without it, or because a test
holds a case the traces do not (BENCHMARKS.md, "`k="auto"` in the offline
simulator", says what each is worth).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    """The policy's numbers (what each is worth: the module's docstring)."""

    decay: float = 0.95        # acceptance counts kept per round with verdicts: a memory of ~20 rounds
    shrink: float = 8.0        # a position's rate is pulled to the overall one by this many observations
    prior: float = 8.0         # what was known before the process (a record, a calibration) weighs this many
    guard: float = 0.6         # drafting that delivers under this of its promise (the text changed) ...
    forget: float = 0.2        # ... keeps this of the counts, as a measurement on this process's own prompt does
    thin: float = 0.995        # per plain round, what the optimistic rate keeps of the evidence
    probe_k: int = 3           # draft tokens of a probe of a regime not known
    odds: float = 0.2          # the chance a probe or a retry finds the draft good: its catch-up weighs 1/odds
    retry: int = 16            # plain rounds in a row before a lone sequence retries, doubled after
    retry_max: int = 256       # a retry that did not hold, up to this (a draft as slow as the target); if longer,
    retry_share: float = 0.2   # till its cost past a plain round is this of the plain rounds' loss at its bet
    retry_gain: float = 1.05   # a retry's predicted gain over plain decoding must reach this
    doubt: float = 0.5         # a retry may price the draft at this of the target (timed in a slow phase?)
    draft_guess: float = 0.1   # a draft forward, of a target token, before one is timed (hopeful)
    slope_guess: float = 0.06  # a forward's price per token past one count timed, of that count's
    unknown_left: int = 128    # tokens a sequence is taken to have left when it does not say
    steady: int = 2            # draft tokens a sequence has in a forward without catch-up
    spike: float = 1.5         # a shorter forward is priced at most this of a longer one as timed
    pace_share: float = 0.5    # of a count's move in price, the share taken as the machine's pace (all counts)
    settle: int = 4            # readings of a count before its moves are the pace's (a first may be a warm-up)
    stale: int = 3             # processes a stored draft price serves that time no draft forward to renew it
    batch_timing: tuple = (1, 31)  # draft forwards timed (tokens) before a long catch-up is first priced
    reread: int = 16           # rounds in a row drafting on a gain under reread_gain, then one plain round: priced
    reread_gain: float = 1.3   # on early readings (a warm-up, a phase since), plain decoding looked dearer than it ran
    reread_any: int = 64       # whatever the gain, after this many rounds drafted since a plain round was timed
    reread_again: float = 0.9  # and a re-read under this of its price at once again (one moves it half way)
    plain_reads: int = 16      # a retry's gain is over the median of this many last plain rounds
    recheck: int = 4           # a batch that drafted nothing, a lone sequence once this many rounds in a
    # row did, and its retries (not a lookup's: cheap) ask again every this many rounds (a choice over 8
    # slots takes 0.8 ms of a 47 ms round, a lone one's 0.13 ms of 9 ms, a retry's 0.3: 1-3% where the
    # draft does not pay)
