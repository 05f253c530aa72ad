"""Replaying ``k="auto"`` offline, against the best fixed K in hindsight.

A policy is judged here before any benchmark: the models are taken out and
what decides a policy's speed is replayed.

* **Agreement** (per call): ``agree[i]`` says whether the draft, given the
  true text before output position i, proposes the token the target emits
  there. A round starting at position i that drafts K then accepts the
  longest run of agreements from i, at most K, and emits one more token:
  exact for greedy decoding and for the drafter-invariant race, whose
  output is fixed whatever the draft. Recorded from the real pair
  (``bench/record_trace.py``) or drawn (:func:`synthetic_agreement`).
* **Costs**: seconds of a target forward over b = 1..9 tokens, of a draft
  forward over n = 1..9 tokens (a round's first draft forward evaluates
  what the draft skipped: 1 after a rejection, 2 after a full accept, the
  whole lag after plain rounds; past 9, a cost per token), and of
  everything else in a round; each round's
  are scaled by lognormal noise, and bursts slow a stretch of time alike
  (another process on the machine).

:func:`replay_engine` does the same as the engine runs it (``serve``): one request
at a time, each a new request in a slot (round 0 reads the prompt, the
draft catches up on all of it when it first drafts).

:func:`replay` runs calls in order through a real
:class:`~specgguf.engine.learning.Learning` on a private store, as a
:class:`~specgguf.SpeculativeLlama` does (the prompt measurement, the
decoder's timings and lag, the catch-up read-back, the state handed to the
store after each call), so stored state carries from call to call and can
be poisoned on purpose. :func:`score` divides a policy's tokens per second
by the best fixed K's on the same trace and noise.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import numpy as np

from ..config import AUTO_K_MAX, GenerationConfig
from ..llama.adapter import SlotDrafter
from ..engine.draft_length import DraftLength, draft_length
from ..engine.learning import Learning
from ..engine.costs import Measured
from ..engine.lookup_first import LookupFirst, next_turn, report
from ..ops.drafter import Draft
from ..engine.policy import Policy, SlotView, Tuning
from ..state import PairState, Store

CHECK_ROWS = SlotDrafter.CHECK_ROWS  # the read-back covers at most the last skipped tokens


@dataclass
class Costs:
    """Seconds of each part of a round (see the module docstring)."""

    target: List[float]              # target forward over b = 1.. tokens
    draft: List[float]               # draft forward over n = 1.. tokens (its first in a round: the catch-up)
    catchup_per_token: float         # past the table, each further token of a catch-up
    target_per_token: float = 0.0    # past the table, each further token the target reads (0: the table's last step)
    other: float = 0.0003            # warp, verify, Python, per round
    noise: float = 0.05              # lognormal sigma, per round
    bursts: Sequence[tuple] = ()     # (from, to: seconds into the trace, factor): all costs times factor
    draft_bursts: Sequence[tuple] = ()  # (first round, last round, factor): the draft's forwards alone (a warm-up)
    # The target's one-token forwards alone: (first call, last call, factor), calls counted from 0 (a phase
    # in which the memory-bound decode speeds up and batches do not), and (forwards, factor) after each prompt
    one_token: Sequence[tuple] = ()
    warm_up: tuple = (0, 1.0)
    # A batch's price grows with the context before it, a token's hardly (Zen 4, F32, 2 / 8 tokens after 80 and
    # 600 tokens: +9 / +22 ms of a 21.6 ms token): per token past the prompt, a b-token forward (b > 1) grows by
    # context x (0.0008 + 0.0002 (b - 2)) one-token forwards (1: as measured; 0: as the recordings price it)
    context: float = 0.0

    def target_cost(self, b: int) -> float:
        t = self.target
        step = self.target_per_token or t[-1] - t[-2]
        return t[b - 1] if b <= len(t) else t[-1] + step * (b - len(t))

    def draft_cost(self, n: int) -> float:
        d = self.draft
        return d[n - 1] if n <= len(d) else d[-1] + self.catchup_per_token * (n - len(d))


@dataclass
class Call:
    """One generation: its prompt length, tokens asked for, agreement per
    output position, and what measuring the draft on its prompt finds."""

    prompt: int
    agree: List[bool]
    max_tokens: int = 0  # 0: len(agree)
    measure: Optional[List[float]] = None  # (acceptance, positions) on the prompt, recorded; None: see _prompt_measure
    # per output position, what the lookup proposes given the true text before it: [the length of
    # the suffix it matched (0: none), tokens proposed (at most LOOKUP_K_MAX), how many of them are
    # the true text's next ones] (bench/record_trace.py --workload); None: no lookup recorded
    lookup: Optional[List[List[int]]] = None
    budget: int = 0  # the tokens the caller asked for, which the answer may end before (0: n)
    workload: str = ""  # which kind of work it is (bench/record_trace.py --workload)

    @property
    def n(self) -> int:
        return self.max_tokens or len(self.agree)

    @property
    def asked(self) -> int:
        return max(self.budget, self.n)


class RecordedLookup:
    """A lookup that proposes what the call's record says it proposed at the
    current position (``pos``, set by the replay): a drafter for
    :class:`~specgguf.engine.lookup_first.LookupFirst` (its tokens are
    placeholders; :func:`_run_call` counts the recorded run as accepted).
    ``n_min``: matches of shorter suffixes propose nothing."""

    model_free = True

    def __init__(self, call: Call, n_min: int = 2) -> None:
        self.call, self.n_min, self.pos, self.matched = call, n_min, 0, 0

    def lag(self, context) -> int:
        return 0

    def propose(self, context, k: int, p_min=None) -> Draft:
        matched, have, _ = self.call.lookup[self.pos] if self.pos < len(self.call.lookup) else (0, 0, 0)
        n = min(k, have) if matched >= self.n_min else 0
        self.matched = matched if n else 0
        return Draft([0] * n, onehot=True, stop="max" if n == k else "end", forwards=[])

    def accepted(self, k: int) -> int:
        return min(k, self.call.lookup[self.pos][2])


@dataclass
class Trace:
    name: str
    costs: Costs
    calls: List[Call]
    config: GenerationConfig = field(default_factory=GenerationConfig)


def synthetic_agreement(n: int, rate: float, rng: np.random.Generator, stickiness: float = 0.5) -> List[bool]:
    """Agreement flags with mean ``rate`` whose misses come in runs (a
    two-state Markov chain: ``stickiness`` 0 is independent draws, near 1
    long runs), as drafts miss on hard stretches of text."""
    out, state = [], rng.random() < rate
    for _ in range(n):
        p_stay = stickiness + (1 - stickiness) * (rate if state else 1 - rate)
        state = state if rng.random() < p_stay else not state
        out.append(bool(state))
    return out


class _Clock:
    """Seconds of round parts under the trace's noise, bursts and phases."""

    def __init__(self, costs: Costs, rng: np.random.Generator) -> None:
        # now: seconds into the trace. A busy spell lasts a while, not a count of rounds: keyed on rounds,
        # a spell fell on other text for a policy that drafts (fewer rounds a token) than for a fixed K.
        self.c, self.rng, self.now, self.round, self.call, self.ones = costs, rng, 0.0, 0, -1, 0

    def new_call(self) -> None:
        self.call, self.ones = self.call + 1, 0

    def target(self, b: int, f: float, past: int = 0) -> float:
        """The target's forward over ``b`` tokens at the round's factor ``f``, ``past`` tokens after
        the prompt (and a one-token forward's phase and warm-up)."""
        grown = self.c.context * past * (0.0008 + 0.0002 * (b - 2)) * self.c.target[0] if 1 < b <= 64 else 0.0
        s = (self.c.target_cost(b) + grown) * f
        if b == 1:
            self.ones += 1
            s *= self.c.warm_up[1] if self.ones <= self.c.warm_up[0] else 1.0
            for first, last, x in self.c.one_token:
                s *= x if first <= self.call <= last else 1.0
        return s

    def next_round(self) -> tuple:
        """A new round's factors: every part's (noise, a busy spell), the draft's forwards' further one."""
        f = math.exp(self.rng.normal(0.0, self.c.noise)) if self.c.noise else 1.0
        f *= math.prod(x for first, last, x in self.c.bursts if first <= self.now <= last)
        self.round += 1
        return f, math.prod(x for first, last, x in self.c.draft_bursts if first <= self.round - 1 <= last)


def _accepted(call: Call, pos: int, k: int) -> int:
    """Draft tokens a round at output position ``pos`` that drafts ``k`` keeps:
    the run of agreements from ``pos``, at most ``k``."""
    a = 0
    while a < k and pos + a < call.n and call.agree[pos + a]:
        a += 1
    return a


def _round(call: Call, pos: int, view: SlotView, k: int, clock: _Clock) -> tuple:
    """One round at output position ``pos`` drafting ``k`` for ``view``'s
    sequence: ``(accepted, its Measured, the read-back of skipped tokens)``."""
    c = clock.c
    f, fd = clock.next_round()
    lag = view.draft_lag
    forwards = [(lag, c.draft_cost(lag) * f * fd, 1)] + [(1, c.draft_cost(1) * f * fd, 1)] * (k - 1) if k else []
    checked = 0 if not k or lag <= 2 else max(0, min(CHECK_ROWS, lag - 1, pos))  # as SlotDrafter's read-back
    catchup = (float(sum(call.agree[pos - checked:pos])), checked) if checked else None
    m = Measured(view.target_lag + k, clock.target(view.target_lag + k, f, pos), forwards, k + 1, c.other * f)
    return _accepted(call, pos, k), m, catchup


def _run_call(call: Call, length: DraftLength, regime: str, clock: _Clock, evaluated: int = 0,
              lookup: Optional[LookupFirst] = None, alone: bool = False) -> tuple:
    """One call; returns (tokens, seconds, tokens the lookup gave). ``length``: its K object;
    ``lookup``: a :class:`RecordedLookup` of the call's and its K object, tried first as
    the engine does (:func:`~specgguf.engine.lookup_first.next_turn`), or with ``alone``
    the only drafter (``draft="ngram"``; then ``length`` is the lookup's). Round 0 reads
    the prompt; the draft, which has evaluated ``evaluated`` tokens of the context,
    catches up when it first drafts, reading back the skipped tokens
    (:class:`~specgguf.llama.adapter.SlotDrafter`)."""
    seconds, pos, rounds, n, after_miss, looked = 0.0, 0, 0, call.n, False, 0
    while pos < n:
        context, remaining = call.prompt + pos, call.asked - pos
        cap = 0 if rounds == 0 else min(length.k_max, remaining - 1)
        view = SlotView(regime, cap, False, call.prompt if rounds == 0 else 1, context - evaluated,
                        remaining, after_miss, emitted=pos)
        counts = length.batches_to_time(view)
        if counts:  # the draft's batches timed on the context's head, which it keeps (Rounds._time_batches)
            forwards = [(c, clock.c.draft_cost(c)) for c in counts]
            length.timed_draft(forwards)
            seconds, evaluated = seconds + sum(s for _, s in forwards), evaluated + sum(counts)
            clock.now += sum(s for _, s in forwards)
            view = replace(view, draft_lag=context - evaluated)
        if lookup is not None:
            lookup.lookup.pos = pos
        turn = next_turn([], view, lookup.lookup if alone else _MODEL, length, None if alone else lookup)
        kk = turn.k
        if turn.drafter is _MODEL:
            accepted, m, catchup = _round(call, pos, view, kk, clock)
        else:
            f = clock.next_round()[0]
            accepted, catchup = lookup.lookup.accepted(kk), None
            m = Measured(view.target_lag + kk, clock.target(view.target_lag + kk, f, pos), [], kk + 1,
                         clock.c.other * f)
            looked += accepted
        spent = m.target_seconds + m.rest_seconds + sum(x[1] for x in m.draft_forwards)
        seconds, clock.now = seconds + spent, clock.now + spent
        draft = Draft([0] * kk, catchup=catchup, forwards=[])
        report(turn, lookup, draft, accepted, m)
        after_miss = accepted < kk
        if kk and turn.drafter is _MODEL:  # the draft evaluated up to its last proposal but one
            evaluated = context + min(accepted, kk - 1)
        pos += accepted + 1
        rounds += 1
    length.ended(min(pos, n), n >= call.asked)
    return min(pos, n), seconds, looked


_MODEL = object()  # the draft model's place in a Turn: its rounds are played from the agreement flags


def _prompt_measure(call: Call) -> Optional[tuple]:
    """What measuring the draft on the call's prompt finds: as recorded
    (bench/record_trace.py scores the real prompt as the first run does);
    else the prompt is taken to look like the text: its first agreements (at most 32)."""
    if call.measure is not None:
        return (float(call.measure[0]), int(call.measure[1])) if call.measure[1] else None
    sample = call.agree[:min(32, len(call.agree))]
    return (float(np.mean(sample)), len(sample)) if len(sample) >= 4 else None


def _decoder_call(call: Call, k, learning: Learning, config: GenerationConfig, clock: _Clock,
                  lookup: Optional[int] = None) -> tuple:
    """One call as :class:`~specgguf.SpeculativeLlama` runs it: the policy
    from ``learning``; the prompt's round measures the draft on the prompt
    while the policy has seen too little of it (as
    :func:`~specgguf.engine.rounds.to_measure` has it: the draft evaluates
    the prompt); the store updated after it. ``lookup``: the shortest match
    of a lookup in front of the draft (the call's record; None: no lookup;
    with ``k=0``, the lookup alone). Returns (tokens, seconds, the lookup's tokens)."""
    seconds, evaluated = 0.0, 0
    view = SlotView(config.regime, AUTO_K_MAX, target_lag=call.prompt, draft_lag=call.prompt, remaining=call.asked)
    length = learning.length(replace(config, k=k))
    length.batches_to_time(view)  # asked first, as the rounds do (nothing to time before the target is)
    if length.worth_measuring(view):
        seconds, evaluated = clock.c.draft_cost(call.prompt - 1), call.prompt - 1
        clock.now += seconds
        length.timed_draft([(evaluated, seconds)])  # the draft read the prompt: its forward is timed
        got = _prompt_measure(call)
        if got is not None:
            length.measured(config.regime, *got)
    front = None
    if lookup is not None and call.lookup is not None:
        front = LookupFirst(RecordedLookup(call, lookup), learning.lookup_length(replace(config, k="auto")))
    alone = front is not None and length.k_max == 0  # the lookup alone (draft="ngram"): k=0 with a lookup
    if alone:
        length, front = learning.lookup, LookupFirst(front.lookup, learning.lookup)
    tokens, spent, looked = _run_call(call, length, config.regime, clock, evaluated, front, alone)
    learning.finish(length, config)
    return tokens, seconds + spent, looked


def replay(trace: Trace, k, seed: int = 0, store: Optional[Store] = None,
           poison: Optional[Callable[[PairState], None]] = None, tuning: Tuning = Tuning(),
           lookup: Optional[int] = None, calls: Optional[list] = None, processes: bool = False) -> float:
    """Tokens per second over the trace's calls with draft length ``k`` (an
    int, or "auto"), under noise drawn from ``seed``. ``store``: the state
    store (default: a fresh temporary one: a new user); ``poison(state)``
    writes records before the first call; ``tuning``: the policy's numbers;
    ``lookup``: a lookup in front of the draft, its shortest match (see
    :func:`_decoder_call`); ``calls``: if a list, each call's (tokens,
    seconds, the lookup's tokens) is appended to it; ``processes``: each call
    a new process on the same store, as the CLI runs them."""
    with tempfile.TemporaryDirectory(prefix="specgguf-sim-") as tmp:
        state = PairState(store or Store(tmp), f"sim|{trace.name}")
        if poison is not None:
            poison(state)
        learning = Learning(state, tuning=tuning)
        clock = _Clock(trace.costs, np.random.default_rng(seed))
        tokens = seconds = 0.0
        for call in trace.calls:
            clock.new_call()
            if processes:
                learning = Learning(state, tuning=tuning)
            t, s, looked = _decoder_call(call, k, learning, trace.config, clock, lookup)
            tokens, seconds = tokens + t, seconds + s
            if calls is not None:
                calls.append((t, s, looked))
        return tokens / seconds


def replay_engine(trace: Trace, k, seed: int = 0, tuning: Tuning = Tuning()) -> float:
    """:func:`replay` as the engine runs it (``serve`` with several slots), one
    request at a time, from a fresh engine: no store; each
    request is new to its slot, so its draft catches up on all of it (in
    its prompt round, when that round measures the draft on the prompt)."""
    policy, regime = Policy(AUTO_K_MAX, tuning=tuning), trace.config.regime
    clock = _Clock(trace.costs, np.random.default_rng(seed))
    tokens = seconds = 0.0
    for call in trace.calls:
        clock.new_call()
        evaluated, got = 0, None
        view = SlotView(regime, 0, target_lag=call.prompt, draft_lag=call.prompt, remaining=call.asked)
        policy.batches_to_time(view)
        length = draft_length(k, lambda: policy)
        if length.worth_measuring(view):
            got = _prompt_measure(call)
        if got is not None:
            policy.measured(regime, *got)
            policy.timed_draft([(call.prompt - 1, clock.c.draft_cost(call.prompt - 1))])
            seconds, evaluated = seconds + clock.c.draft_cost(call.prompt - 1), call.prompt - 1
            clock.now += clock.c.draft_cost(call.prompt - 1)
        t, s, _ = _run_call(call, length, regime, clock, evaluated=evaluated)
        tokens, seconds = tokens + t, seconds + s
    return tokens / seconds


# How a user runs a pair, as (k, the lookup's shortest match or None): the draft model alone
# (lookup=False), the lookup alone (draft="ngram"), both (the defaults).
MODES = {"plain": (0, None), "model": ("auto", None), "lookup": (0, 2), "default": ("auto", 2)}


def by_workload(trace: Trace, seeds: Sequence[int] = (0, 1, 2), modes: dict = MODES) -> dict:
    """``{workload: {mode: [tokens/s over plain decoding's, per seed]}}`` over a
    trace recorded with the lookup (each workload's calls pooled; the calls
    replayed in order in one process, as ``bench/workloads.py`` runs them)."""
    runs = {m: [] for m in modes}
    for name, (k, lookup) in modes.items():
        for s in seeds:
            calls: list = []
            replay(trace, k, s, lookup=lookup, calls=calls)
            runs[name].append(calls)
    out: dict = {}
    for w in dict.fromkeys(c.workload for c in trace.calls):
        idx = [i for i, c in enumerate(trace.calls) if c.workload == w]
        rate = lambda calls: sum(calls[i][0] for i in idx) / sum(calls[i][1] for i in idx)  # noqa: E731
        out[w] = {m: [rate(c) / rate(p) for c, p in zip(runs[m], runs["plain"])] for m in modes}
    return out


def hindsight(call: Call, c: Costs, model: bool = True, lookup: Optional[int] = 2) -> float:
    """Seconds of ``call``'s fastest schedule in hindsight, without noise: the
    ceiling no draft-length rule can pass with these drafts at these costs.
    Round 0 reads the prompt; then each round, from where the text stands,
    the best of: plain decoding; the lookup's recorded proposal (a match of
    ``lookup`` or more tokens; None: no lookup) cut to the tokens of it the
    text keeps; the draft model (``model``) drafting exactly its run of
    agreements (at most AUTO_K_MAX, as k="auto" may), each forward priced as a
    steady round's and no catch-up ever
    paid. Nothing is drafted that is rejected: an upper bound, not a policy."""
    n, other = call.n, c.other
    best = [math.inf] * (n + 2)
    best[1] = c.target_cost(max(1, call.prompt)) + other  # the prompt's round emits the first token
    for pos in range(1, n):
        if best[pos] == math.inf:
            continue
        runs = {0: 0}  # draft tokens kept -> the cheapest drafter's own seconds for them
        if lookup is not None and call.lookup and pos < len(call.lookup):
            matched, have, right = call.lookup[pos]
            for k in range(1, min(have, right) + 1) if matched >= lookup else ():
                runs[k] = 0.0
        if model:
            for k in range(1, _accepted(call, pos, AUTO_K_MAX) + 1):
                runs.setdefault(k, c.draft_cost(2) + (k - 1) * c.draft_cost(1))
        for k, drafter in runs.items():
            end = min(n, pos + k + 1)
            best[end] = min(best[end], best[pos] + drafter + c.target_cost(1 + k) + other)
    return best[n]


def oracle(trace: Trace, seed: int = 0, ks: Sequence[int] = tuple(range(AUTO_K_MAX + 1)), run=None) -> tuple:
    """(best fixed K, its tokens per second) in hindsight, on the same noise;
    ``run``: :func:`replay` (default) or :func:`replay_engine`."""
    rates = {k: (run or replay)(trace, k, seed) for k in ks}
    best = max(rates, key=rates.get)
    return best, rates[best]


def oracle_per_call(trace: Trace, seed: int = 0, ks: Sequence[int] = tuple(range(AUTO_K_MAX + 1))) -> float:
    """Tokens per second with each call at its own best fixed K in hindsight, on the same noise: where a
    phase changes between calls, so does the best K (plain decoding 40% slower in the first calls: K = 8
    pays there, K = 0 after), and a policy that keeps drafting after the change loses to it, not to
    :func:`oracle`, which one K over the trace matches as badly."""
    per_k = []
    for k in ks:
        calls: list = []
        replay(trace, k, seed, calls=calls)
        per_k.append(calls)
    tokens = sum(t for t, _, _ in per_k[0])
    return tokens / sum(min(calls[i][1] for calls in per_k) for i in range(len(trace.calls)))


def score(trace: Trace, seeds: Sequence[int] = (0, 1, 2), poison=None, engine: bool = False,
          tuning: Tuning = Tuning(), processes: bool = False) -> dict:
    """``k="auto"`` against the best fixed K and plain decoding, per seed:
    ``{"auto": [...], "best_k": [...], "vs_oracle": [...], "vs_plain": [...]}``;
    ``engine``: through the engine's policy (no stored state to poison);
    ``processes``: each call a new process (the CLI)."""
    run = ((lambda t, k, s: replay_engine(t, k, s, tuning)) if engine else
           (lambda t, k, s: replay(t, k, s, poison=poison if k == "auto" else None, tuning=tuning,
                                   processes=processes)))
    out = {"auto": [], "best_k": [], "vs_oracle": [], "vs_plain": []}
    for s in seeds:
        auto = run(trace, "auto", s)
        k, best = oracle(trace, s, run=replay_engine if engine else None)
        out["auto"].append(auto)
        out["best_k"].append(k)
        out["vs_oracle"].append(auto / best)
        out["vs_plain"].append(auto / run(trace, 0, s))
    return out


# Measured on this project's 2-core AMD EPYC with the default pair (F32
# SmolLM2-135M target, Q4_1 draft, 2 threads, flash attention):
# bench/record_trace.py. Batches cost much more than one token here, and the
# quantized draft's batches most: a catch-up is expensive.
HERE = Costs(target=[0.0317, 0.0377, 0.0427, 0.0489, 0.0550, 0.0591, 0.0671, 0.0690, 0.0720],
             draft=[0.0129, 0.0232, 0.0306, 0.0402, 0.0465, 0.0514, 0.0579, 0.0647, 0.0722],
             catchup_per_token=0.00246, other=0.0004)
# The same pair on a 2-core AMD Zen 5 (tests/data/trace_zen5_good_draft.json, its noise left out): the
# target is cheap in batches and the draft's catch-ups are cheap, so long K pay (K=8: 1.5x plain).
ZEN5 = Costs(target=[0.0153, 0.0165, 0.0186, 0.0200, 0.0200, 0.0225, 0.0231, 0.0251, 0.0244],
             draft=[0.0057, 0.0108, 0.0125, 0.0145, 0.0164, 0.0189, 0.0237, 0.0231, 0.0251],
             catchup_per_token=0.00067, other=0.0004)
# A board's regime: a 1-8B target is memory-bound (a batch of 9 costs little
# more than one token), and a small draft costs a twentieth of a step.
BOARD = Costs(target=[0.100 * (1 + 0.02 * b) for b in range(9)], draft=[0.005 * (1 + 0.1 * n) for n in range(9)],
              catchup_per_token=0.0006, other=0.0004)


def regimes(n_calls: int = 6, tokens: int = 96, prompt: int = 40, seed: int = 0) -> List[Trace]:
    """The synthetic traces every policy change is scored on: this machine
    with a good and a poor draft, a board, acceptance that collapses
    halfway through, bursts of a busy machine, and a phase in which the
    draft's forwards alone are slow (then drafting wins again)."""
    rng = np.random.default_rng(seed)

    def calls(rates):
        return [Call(prompt, synthetic_agreement(tokens, r, rng)) for r in rates]

    bursts = Costs(**{**HERE.__dict__, "bursts": ((0.8, 2.4, 1.6), (6.0, 8.0, 1.6))})
    # The draft's forwards slowed alone for the first 30 rounds (seen on the Zen 5 machine: in its
    # fast phases the memory-bound target speeds up and the draft does not): drafting is priced
    # while it loses, and must be tried again once the phase is over.
    draft_phase = Costs(**{**ZEN5.__dict__, "draft_bursts": ((2, 30, 2.5),)})
    return [
        Trace("here, good draft (0.9)", HERE, calls([0.9] * n_calls)),
        Trace("here, poor draft (0.55)", HERE, calls([0.55] * n_calls)),
        Trace("board, draft 0.75", BOARD, calls([0.75] * n_calls)),
        Trace("here, acceptance 0.9 then 0.35", HERE, calls([0.9] * (n_calls // 2) + [0.35] * (n_calls - n_calls // 2))),
        Trace("here, good draft, busy bursts", bursts, calls([0.9] * n_calls)),
        Trace("Zen 5, good draft, its forwards slow early", draft_phase, calls([0.9] * n_calls)),
    ]


def load_trace(path) -> Trace:
    """A trace recorded by bench/record_trace.py (JSON)."""
    d = json.loads(Path(path).read_text())
    cfg = GenerationConfig.from_kwargs(**d.get("config", {}))
    return Trace(d["name"], Costs(**d["costs"]), [Call(**c) for c in d["calls"]], cfg)


def poor_record(trace: Trace, acceptance: float = 0.1, positions: float = 1000.0):
    """A poison for :func:`replay`: stored evidence that the draft is poor
    (``acceptance`` over ``positions``), as a run whose text did not suit the
    draft leaves it: a record that says drafting loses. Stored state is a
    prior: the run must overturn it."""
    def write(state: PairState) -> None:
        n = AUTO_K_MAX + 1
        state.save_evidence(trace.config.regime, {"accepted": [acceptance * positions] * n,
                            "verified": [positions] * n, "total": [acceptance * positions, positions]})
    return write
