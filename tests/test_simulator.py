"""The offline simulator: its own arithmetic, then k="auto" judged on it.

The simulator drives the real Learning and Policy (with a private store),
so these tests judge the shipped policy without any model running.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specgguf.testing import simulator
from specgguf.testing.simulator import Call, Costs, Trace

QUIET = Costs(target=[0.03 + 0.002 * b for b in range(9)], draft=[0.01 + 0.004 * n for n in range(9)],
              catchup_per_token=0.004, other=0.0, noise=0.0)
DATA = Path(__file__).parent / "data"


def test_plain_decoding_costs_the_prompt_then_one_target_forward_per_token():
    trace = Trace("plain", QUIET, [Call(prompt=5, agree=[True] * 20)])
    want = 20 / (QUIET.target_cost(5) + 19 * QUIET.target_cost(1))
    assert simulator.replay(trace, 0) == pytest.approx(want)


def test_phases_price_the_target_s_one_token_forwards_and_spells_last_a_time():
    """A one-token phase from the second call, a warm-up after each prompt, and a busy spell
    over the first 0.1 s (it slows the first prompt's round, which ends past it), by hand; a
    batch's growth with the context past the prompt."""
    c = replace(QUIET, one_token=((1, 9, 0.5),), warm_up=(2, 2.0), bursts=((0.0, 0.1, 3.0),))
    trace = Trace("phases", c, [Call(prompt=6, agree=[True] * 5)] * 2)
    one, prompt = QUIET.target_cost(1), QUIET.target_cost(6)
    first = 3 * prompt + 2 * (one * 2.0) + 2 * one
    second = prompt + 2 * (0.5 * one * 2.0) + 2 * (0.5 * one)
    assert simulator.replay(trace, 0) == pytest.approx(10 / (first + second))
    clock = simulator._Clock(replace(QUIET, context=1.0), np.random.default_rng(0))  # a batch grows with context
    assert clock.target(8, 1.0, 100) == pytest.approx(QUIET.target_cost(8) + 100 * 0.002 * QUIET.target[0])
    assert clock.target(1, 1.0, 100) == QUIET.target_cost(1)  # a token does not


def test_each_calls_best_k_is_the_least_time_of_any_k_call_by_call():
    """The best fixed K per call in hindsight, by hand: a draft that always agrees pays in the calls
    where plain decoding is slow, not after (this Zen 4's slow phase, then its fast one)."""
    c = replace(QUIET, draft=[0.04] * 9, one_token=((0, 0, 3.0),))  # a draft dearer than a token, then
    trace = Trace("flip", c, [Call(prompt=6, agree=[True] * 17)] * 2)
    per_k = []
    for k in range(9):
        calls: list = []
        simulator.replay(trace, k, calls=calls)
        per_k.append([s for _, s, _ in calls])
    assert min(range(9), key=lambda k: per_k[k][0]) > 0 and min(range(9), key=lambda k: per_k[k][1]) == 0
    want = 34 / (min(s[0] for s in per_k) + min(s[1] for s in per_k))
    assert simulator.oracle_per_call(trace) == pytest.approx(want)
    assert want > simulator.oracle(trace)[1]


def test_a_fixed_k_round_accepts_the_run_of_agreements_and_pays_its_catch_up():
    """K = 2 over agree = [T, T, F, T, ...]: the rounds and the draft's lag by hand."""
    agree = [True, True, False, True, True, True, True]
    trace = Trace("k2", QUIET, [Call(prompt=4, agree=agree)])
    c = QUIET
    # round 0: plain (prompt of 4), emits position 0. The draft has seen nothing: lag 5.
    # round 1 at pos 1: catch-up of 5, then 1 draft; agree[1], agree[2]=F -> accepts 1, emits 2 (pos 1-2).
    #   The draft evaluated context (5) + d1: the next lag is 1 (the correction).
    # round 2 at pos 3: 1 forward + 1; agree[3], agree[4] -> accepts 2, emits 3 (pos 3-5). Lag 2.
    # round 3 at pos 6: remaining 1 -> K = 0, emits pos 6.
    s = (c.target_cost(4)
         + c.draft_cost(5) + c.draft_cost(1) + c.target_cost(3)
         + c.draft_cost(1) + c.draft_cost(1) + c.target_cost(3)
         + c.target_cost(1))
    assert simulator.replay(trace, 2) == pytest.approx(7 / s)


def test_a_draft_that_never_agrees_loses_at_every_k():
    trace = Trace("never", QUIET, [Call(prompt=8, agree=[False] * 60)])
    plain = simulator.replay(trace, 0)
    assert all(simulator.replay(trace, k) < plain for k in range(1, 9))
    assert simulator.oracle(trace)[0] == 0


def test_synthetic_agreement_has_its_rate_and_runs():
    rng = np.random.default_rng(0)
    flags = simulator.synthetic_agreement(20000, 0.8, rng, stickiness=0.6)
    assert abs(np.mean(flags) - 0.8) < 0.02
    misses_after_miss = np.mean([not b for a, b in zip(flags, flags[1:]) if not a])
    assert misses_after_miss > 0.4  # misses come in runs (independent draws: 0.2)


# ---- k="auto" judged against the best fixed K in hindsight ----------------

def traces():
    return simulator.regimes() + [simulator.load_trace(p) for p in sorted(DATA.glob("trace_*.json"))]


# The bound: k="auto" at least 0.95 of the best fixed K in hindsight on every trace.
BOUND = 0.95


# Short of BOUND, known and measured (BENCHMARKS.md, the simulator): Zen 4 Q2_K. The draft's prompts
# read 0.5 where its output accepts 0.67, so K=2 beats plain by 6% while every estimate says it loses
# (auto: 0.99x plain; the 654-line policy read 0.931 too). A prompt measured is the one evidence on
# the text at hand: weighed less, a stored record of a poor draft would decide instead.
SHORT = {"recorded on Zen 4: F32 target, Q2_K draft (poor)"}


def _marked(trace):
    reason = "measured short of the bound; see SHORT"
    return pytest.param(trace, marks=pytest.mark.xfail(strict=True, reason=reason)) if trace.name in SHORT else trace


@pytest.mark.parametrize("trace", [_marked(t) for t in traces()], ids=lambda t: t.name)
def test_auto_k_against_the_best_fixed_k(trace):
    """k="auto" reaches BOUND of the best fixed K on every trace (median over 3
    noise seeds), from a fresh state, from a poisoned one (stored evidence
    that the draft accepts 0.1) and through the engine (serve: one request
    at a time, each new to its slot, no store); a poor draft that no K
    pays for runs at least 0.97 of plain decoding."""
    for how in (dict(), dict(poison=simulator.poor_record(trace)), dict(engine=True)):
        got = simulator.score(trace, seeds=(0, 1, 2), **how)
        assert np.median(got["vs_oracle"]) >= BOUND, (how, got)
        if "poor" in trace.name and set(got["best_k"]) == {0}:
            assert np.median(got["vs_plain"]) >= 0.97, (how, got)


# Each call a new process on one store, as the CLI runs them: each re-learns the draft every
# Tuning.stale + 1 processes (2 of a trace's 6 calls), so it reads a little under BOUND on some traces.
CLI_BOUND = 0.94


@pytest.mark.parametrize("trace", [t for t in traces() if t.name not in SHORT], ids=lambda t: t.name)
def test_auto_k_as_the_cli_runs_it_one_process_a_call(trace):
    """k="auto" with each call in a new process (the CLI) reaches CLI_BOUND of the best
    fixed K, and a poor draft no K pays for at least 0.97 of plain decoding: later
    processes price the draft as an earlier one timed it (every process measured a poor
    draft on its prompt before: 0.95 of plain here, 0.89-0.91 in real CLI runs)."""
    got = simulator.score(trace, seeds=(0, 1, 2), processes=True)
    assert np.median(got["vs_oracle"]) >= CLI_BOUND, got
    if "poor" in trace.name and set(got["best_k"]) == {0}:
        assert np.median(got["vs_plain"]) >= 0.97, got


def test_engine_replay_of_a_fixed_k_is_the_decoders():
    """One request alone, fixed K: the engine's rounds cost what the decoder's
    do (a round 0 that reads the prompt, a catch-up on the first draft)."""
    trace = Trace("k2", QUIET, [Call(prompt=4, agree=[True, True, False, True, True, True, True])])
    for k in (0, 2, 3):
        assert simulator.replay_engine(trace, k) == pytest.approx(simulator.replay(trace, k))


def test_a_stored_record_that_says_drafting_loses_is_a_prior_not_a_verdict():
    """Stored evidence that the draft accepts 0.1 (left by a run whose text
    did not suit it) is outweighed by the first call's measurement of its
    prompt: the run drafts within its first call, and the first two calls
    already run well ahead of plain decoding."""
    trace = simulator.load_trace(DATA / "trace_good_draft.json")
    got = simulator.score(trace, seeds=(0, 1, 2), poison=simulator.poor_record(trace))
    assert min(got["vs_oracle"]) >= 0.95, got
    two = Trace(trace.name, trace.costs, trace.calls[:2], trace.config)
    assert np.median(simulator.score(two, seeds=(0, 1, 2), poison=simulator.poor_record(trace))["vs_plain"]) > 1.05


def test_a_recorded_prompt_measurement_is_what_the_first_run_measures():
    """A trace may carry what measuring the draft on each prompt found
    (bench/record_trace.py); the first run's policy starts from it, so the
    same text drafts less after a poor measurement than after a good one."""
    rng = np.random.default_rng(0)
    agree = list(rng.random(96) < 0.9)

    def speed(measure):
        return simulator.replay(Trace("m", QUIET, [Call(prompt=40, agree=agree, measure=measure)]), "auto")
    assert speed([0.05, 32]) < 0.95 * speed([0.95, 32])
    assert simulator._prompt_measure(Call(prompt=40, agree=agree, measure=[0.0, 0])) is None  # too short to say
    assert simulator._prompt_measure(Call(prompt=40, agree=[True] * 40)) == (1.0, 32)  # not recorded: the text's start


# Short of the bound, known and measured (BENCHMARKS.md, "Real work"): open chat where the draft costs
# 0.69 of a 14 ms token, so no K pays (the ceiling in hindsight is 1.07x): the first call's measurement
# of the draft on its prompt (135 ms of 2 s) is most of the 0.96x, over three calls.
CHAT_SHORT = pytest.mark.xfail(strict=True, reason="the draft cannot pay; learning it costs 4% of three calls")


@pytest.mark.parametrize("name", ["workloads_here.json", "workloads_here_t08.json",
                                  pytest.param("workloads_here_chat.json", marks=CHAT_SHORT)])
def test_the_defaults_on_real_work_keep_the_better_of_their_two_drafts(name):
    """Replayed from real work recorded here (code edits, quotes, second turns
    greedy; edits and quotes at T = 0.8 seeded; open chat; bench/record_trace.py
    --workload): with the lookup in front of the draft model, as a user gets
    them, each workload runs at least 0.98x plain decoding and at least 0.95
    of the better of the draft model alone and the lookup alone. A first
    edit's catch-up priced per round, and on a guessed price, kept the
    defaults at 0.88 of the lookup alone on code edits."""
    trace = simulator.load_trace(DATA / name)
    for workload, got in simulator.by_workload(trace, seeds=(0, 1)).items():
        mid = {m: np.median(v) for m, v in got.items()}
        assert mid["default"] >= 0.98, (workload, mid)
        assert mid["default"] >= 0.95 * max(mid["model"], mid["lookup"]), (workload, mid)


def test_the_ceiling_in_hindsight_is_plain_decoding_without_drafts_and_bounds_every_k():
    """simulator.hindsight: with nothing to draft it is plain decoding's time;
    a draft that agrees everywhere drafts AUTO_K_MAX a round (the drafter's forwards
    priced as steady ones); and no fixed K, replayed without noise, beats it
    on the real work recorded here (the lookup's proposals and the model's)."""
    call = Call(prompt=5, agree=[True] * 19)
    plain = QUIET.target_cost(5) + 18 * (QUIET.target_cost(1) + QUIET.other)
    assert simulator.hindsight(call, QUIET, model=False, lookup=None) == pytest.approx(plain)
    # the prompt's round emits 1 token, then two rounds of K = 8 (AUTO_K_MAX) emit 9 each
    rounds = QUIET.target_cost(5) + 2 * (QUIET.draft_cost(2) + 7 * QUIET.draft_cost(1) + QUIET.target_cost(9))
    assert simulator.hindsight(call, QUIET) == pytest.approx(rounds)
    trace = simulator.load_trace(DATA / "workloads_here.json")
    quiet = Trace(trace.name, replace(trace.costs, noise=0.0), trace.calls)
    tokens = sum(c.n for c in trace.calls)
    best = tokens / sum(simulator.hindsight(c, quiet.costs) for c in trace.calls)
    for k in (0, 4, 16):
        for lookup in (None, 2):
            assert simulator.replay(quiet, k, lookup=lookup) <= best
