"""The draft-length policy on synthetic round times and acceptance (no models, no clock)."""

import numpy as np
import pytest

from specgguf.engine.acceptance import AcceptanceEstimate, merge_evidence
from specgguf.engine.arms import Arms, CostModel
from specgguf.engine.policy import DraftPolicy, Trials, expected_tokens

# Whole-round seconds by K. A memory-bound board: a batch costs little more
# than one token and a draft token a twentieth of a target step.
BOARD = [0.100 + 0.0075 * k for k in range(9)]
# This CI machine with the default pair (simulator.HERE): every K costs
# about 18 ms more than the one before.
HERE = [0.0321, 0.0510, 0.0685, 0.0876, 0.1066, 0.1236, 0.1445, 0.1590, 0.1750]


def play(policy, acceptance, rounds, rng, times, remaining=None):
    """Rounds whose drafted positions are each accepted with ``acceptance``
    and which take ``times[k]`` seconds; returns the K chosen each round."""
    ks = []
    for _ in range(rounds):
        k = policy.choose(remaining)
        n = 0
        while n < k and rng.random() < acceptance:
            n += 1
        policy.update(k, n, None, times[k])
        ks.append(k)
    return ks


def rate(a, times, k):
    return sum(a ** i for i in range(k + 1)) / times[k]


def best_k(a, times):
    return max(range(len(times)), key=lambda k: rate(a, times, k))


def recorded(times):
    """Round times as a stored record (what a clock-blind run keeps to)."""
    return CostModel(seconds=True, rounds=list(times))


def test_expected_tokens_is_the_formula():
    acc = [0.9, 0.8, 0.7]
    assert expected_tokens(3, acc) == pytest.approx([1.0, 1.9, 1.9 + 0.72, 1.9 + 0.72 + 0.504])


@pytest.mark.parametrize("a", [0.5, 0.7, 0.9, 0.97])
def test_picks_the_k_the_formula_says(a):
    """Timing its own rounds, the policy settles on the K with the most
    tokens per second (or a neighbour within 2%: the estimates are statistical)."""
    policy = DraftPolicy(8, online_costs=True, decay=0.995)
    ks = play(policy, a, 3000, np.random.default_rng(0), BOARD)
    want = best_k(a, BOARD)
    assert want > 0
    chosen = max(set(ks[-500:]), key=ks[-500:].count)
    assert rate(a, BOARD, chosen) >= 0.98 * rate(a, BOARD, want)


def test_picks_zero_when_the_draft_cannot_pay():
    policy = DraftPolicy(8, online_costs=True)
    ks = play(policy, 0.5, 1000, np.random.default_rng(1), HERE)
    assert best_k(0.5, HERE) == 0
    assert ks[-800:].count(0) >= 0.99 * 800  # plain decoding, a rare probe at most
    # A draft as slow as the target never pays: once a probe has timed it, no more probes.
    hopeless = [0.03 * (1 + k) for k in range(9)]
    policy = DraftPolicy(8, online_costs=True)
    ks = play(policy, 0.5, 500, np.random.default_rng(1), hopeless)
    assert ks[50:].count(0) == 450


def test_evidence_of_a_poor_draft_stops_probes_until_it_ages():
    policy = DraftPolicy(8, online_costs=True)
    policy.update(0, 0, None, HERE[0])
    assert policy.probe() > 0  # no evidence yet: the draft might be excellent
    rng = np.random.default_rng(0)
    for _ in range(30):
        policy.update(3, 0 if rng.random() < 0.6 else 1, None, HERE[3])
    assert policy.probe() == 0  # seen: it is poor
    for _ in range(100):
        policy.choose()
    assert policy.probe() == 0  # still ruled out a while later
    for _ in range(1500):
        policy.choose()  # idle rounds thin the evidence: worth a look again
    assert policy.acceptance.optimistic() > 0.9 and policy.probe() > 0


def test_recovers_when_acceptance_rises():
    policy = DraftPolicy(8, online_costs=True)
    rng = np.random.default_rng(2)
    bad = play(policy, 0.02, 300, rng, BOARD)
    assert bad[-100:].count(0) > 90  # backed off to plain decoding, probing rarely
    good = play(policy, 0.95, 600, rng, BOARD)
    assert best_k(0.95, BOARD) >= 4
    assert np.mean(good[-200:]) >= 4  # the probes noticed and K went back up


def test_cost_model_round_trips_and_rejects_damaged_round_times():
    c = CostModel(draft=0.01, target=[0.03, 0.04], seconds=True, draft_prefill=0.002, rounds=[0.03, 0.05])
    assert CostModel.from_dict(c.to_dict()) == c
    assert c.round_cost(1) == 0.05 and c.round_cost(3) == pytest.approx(0.01 * 3 + 0.04 + 0.01 * 2)
    assert CostModel.from_dict({"draft": 0.4, "target": [1.0]}).draft_prefill == 0.2  # older files
    for bad in ([], [0.03, -1.0], [0.03, "x"]):
        with pytest.raises(ValueError):
            CostModel.from_dict(dict(c.to_dict(), rounds=bad))


def test_a_k_is_judged_by_its_whole_rounds():
    """S(K) is the mean wall time of this run's rounds at K; a round that
    first caught up on skipped tokens is not one of them, but times the
    catch-up per token."""
    policy = DraftPolicy(8, online_costs=True)
    for s in (0.10, 0.12):
        policy.choose(lag=1)
        policy.update(3, 2, None, s)
    assert 0.10 < policy.arms.time(3) < 0.12 and policy.arms.timed[3] > 0
    before = policy.arms.time(3)
    policy.choose(lag=40)
    policy.update(3, 3, None, 0.5, first_seconds=0.4)
    assert policy.arms.time(3) == before
    assert policy.arms.catchup_cost(10) == pytest.approx(10 * 0.4 / 40)
    # A clock-blind policy times nothing.
    blind = DraftPolicy(8, recorded(HERE))
    blind.update(3, 2, None, 5.0)
    assert blind.arms.time(3) == pytest.approx(HERE[3]) and not any(blind.arms.timed)


def test_an_untimed_k_lies_on_the_line_through_the_timed_ones():
    arms = Arms(8, [CostModel()])
    arms.observe(0, 0.03)
    arms.observe(2, 0.05)  # one drafting K: the line through plain decoding
    assert arms.time(4) == pytest.approx(0.07)
    arms.observe(4, 0.07)
    arms.observe(6, 0.08)
    assert arms.time(5) == pytest.approx(arms.time(4) + (arms.time(6) - arms.time(4)) / 2, rel=1e-6)
    # Least squares over 2, 4 and 6: one K timed slow in a busy spell moves the line, not one K alone.
    line = arms._line()
    assert line[1] == pytest.approx(0.0075, rel=0.05)


def test_a_busy_spell_moves_every_k_alike():
    """A spell where every round takes 1.6x: drafting at K = 4 through it
    must not make K = 4 look slow against a plain time from before it."""
    arms = Arms(8, [CostModel()])
    for _ in range(3):
        arms.observe(0, 0.03)
        arms.observe(4, 0.06)
    for _ in range(10):
        arms.observe(4, 0.096)
    # Kept raw, plain decoding would still read 0.03 and K = 4 3.2x it. The
    # speed follows the spell; part of it is charged to K = 4 while it does.
    assert arms.time(0) > 0.042
    assert arms.time(4) / arms.time(0) == pytest.approx(2.0, rel=0.15)


def test_re_times_plain_decoding_while_drafting():
    policy = DraftPolicy(8, online_costs=True, prior=0.95)
    ks = play(policy, 0.95, 200, np.random.default_rng(3), BOARD)
    assert 0 in ks[:4]  # plain decoding is timed early (the first round also read the prompt)
    plain = [i for i, k in enumerate(ks) if k == 0]
    assert 1 < len(plain) < 12 and max(np.diff(plain)) <= DraftPolicy.BASELINE_EVERY + 1
    frozen = DraftPolicy(8, recorded(BOARD), prior=0.95)  # seeded p/q runs: no such rounds
    assert 0 not in play(frozen, 0.99, 200, np.random.default_rng(0), BOARD)


def test_stored_costs_are_a_prior_not_a_verdict():
    """A record written while another process held the CPU says the draft
    costs more than a target token. A K the run has not timed borrows the
    cheaper of that record and the built-in prior, so the run drafts, times
    the draft, and from then on goes by what it measured."""
    t1 = 0.03
    busy = CostModel(draft=1.2 * t1, target=[t1 * (1 + 0.1 * b) for b in range(9)], seconds=True,
                     draft_prefill=0.5 * t1, draft_first=1.5 * t1)
    policy = DraftPolicy(8, busy, online_costs=True, prior=0.95)
    policy.update(0, 0, None, t1)
    assert policy.choose() > 0
    policy.update(3, 3, None, 1.9 * t1)
    assert policy.arms.time(3) == pytest.approx(1.9 * t1)
    assert policy.best_k() > 0
    # A clock-blind run cannot measure: it keeps to the record.
    assert DraftPolicy(8, busy, prior=0.95).choose() == 0


def test_the_record_a_run_leaves_is_the_next_runs_prior(tmp_path):
    from specgguf.config import GenerationConfig
    from specgguf.engine.learning import Learning
    from specgguf.state import PairState, Store
    state, config = PairState(Store(tmp_path), "t+d", "machine"), GenerationConfig(k="auto")
    first = Learning(state).policy(config)
    play(first, 0.9, 60, np.random.default_rng(4), HERE)
    Learning(state).finish(first, config)
    stored = CostModel.from_dict(state.costs())
    assert stored.seconds and len(stored.rounds) == 9
    assert stored.rounds[3] == pytest.approx(HERE[3], rel=0.1)
    # A later process 20% slower: its first plain round scales the stored shape.
    later = Learning(state).policy(config)
    later.update(0, 0, None, 1.2 * HERE[0])
    assert later.arms.time(4) == pytest.approx(1.2 * min(stored.rounds[4] / stored.rounds[0],
                                                         CostModel().round_cost(4) / CostModel().round_cost(0))
                                               * HERE[0], rel=0.02)
    state.save_costs(dict(stored.to_dict(), rounds=[0.0, 1.0]))  # damaged: the built-in prior
    assert Learning(state).policy(config).arms.priors == [CostModel()]


def test_a_round_after_a_rejection_has_its_own_first_position():
    est = AcceptanceEstimate(4)
    for _ in range(20):
        est.observe(1, 0, after_miss=True)   # after a miss the next first token misses
        est.observe(4, 4, after_miss=False)  # elsewhere it holds
    assert est.per_position(after_miss=True)[0] < 0.3
    assert est.per_position(after_miss=False)[0] > 0.8
    assert len(est.per_position(True)) == len(est.per_position(False)) == 4
    policy = DraftPolicy(4)
    policy.update(4, 1)
    assert policy.after_miss
    policy.update(4, 4)
    assert not policy.after_miss
    policy.update(2, 2)  # a round cut short by p_min, kept whole: no miss
    assert not policy.after_miss


def test_no_drafting_whose_catch_up_cannot_be_won_back():
    policy = DraftPolicy(8, online_costs=True, prior=0.9)
    play(policy, 0.9, 40, np.random.default_rng(5), BOARD)
    k = policy.best_k()
    assert k > 0
    r = policy.rates()
    per_token = 1.0 / r[0] - 1.0 / r[k]
    skipped = 2 + 500
    even = 500 * policy.arms.catchup_cost(1) / per_token  # tokens that repay the catch-up
    assert policy.choose(remaining=int(even * 0.5), lag=skipped) == 0
    assert policy.choose(remaining=int(even * 2), lag=skipped) > 0
    assert policy.choose(remaining=1, lag=2) > 0  # a drafting round's usual lag is in its time


def test_no_probe_whose_catch_up_costs_more_than_it_could_save():
    policy = DraftPolicy(8, online_costs=True)
    play(policy, 0.5, 100, np.random.default_rng(6), HERE)  # plain decoding by now
    policy.acceptance.rounds_without_evidence = 10 ** 4  # evidence long aged: a probe is tempting
    assert policy.probe(remaining=100000, lag=400) == Trials.PROBE_K
    assert policy.probe(remaining=10, lag=400) == 0


def test_once_drafting_it_stops_only_when_it_expects_a_loss():
    """The entry margin guards against noisy estimates; leaving costs the
    catch-up to come back, so once drafting the policy stays as long as
    drafting is expected to win at all."""
    a = next(x / 100 for x in range(50, 100)
             if 1.01 < max(rate(x / 100, HERE, k) for k in range(1, 9)) / rate(x / 100, HERE, 0) < 1.09)

    def policy_at(drafting):
        p = DraftPolicy(8, recorded(HERE))
        p.acceptance.add_prior(a, 1000.0)
        p.drafting = drafting
        return p
    assert policy_at(False).choose() == 0   # not drafting: the margin is not met
    assert policy_at(True).choose() > 0     # drafting: still expected to win, so it stays
    lower = policy_at(True)
    lower.acceptance.add_prior(a - 0.15, 10000.0)
    assert lower.choose() == 0              # expected to lose: it stops


def test_exploration_favours_a_k_not_tried_for_long():
    arms = Arms(8, [CostModel()])
    for _ in range(5):
        arms.observe(5, 0.1)
    fresh = arms.bonus(5)
    assert arms.bonus(6) > fresh
    for _ in range(100):
        arms.observe(4, 0.1)
    assert arms.bonus(5) > 1.5 * fresh  # its counts decayed: worth a round again


def test_p_min_auto_learns_a_cutoff():
    policy = DraftPolicy(4, CostModel(draft=0.1, target=[1.0 + 0.05 * b for b in range(9)]), p_min="auto")
    rng = np.random.default_rng(4)
    for _ in range(2000):
        conf = rng.random(4)
        n = 0  # tokens the draft is unsure of (confidence < 0.4) are always rejected
        while n < 4 and conf[n] >= 0.4:
            n += 1
        policy.update(4, n, conf)
    assert 0.3 <= policy.p_min() <= 0.5
    assert DraftPolicy(4, p_min=0.25).p_min() == 0.25
    assert DraftPolicy(4).p_min() is None
    with pytest.raises(ValueError, match="p_min"):
        DraftPolicy(4, p_min=2.0)
    with pytest.raises(ValueError, match="k_max"):
        DraftPolicy(0)


def test_learned_evidence_carries_over_as_a_weak_prior():
    policy = DraftPolicy(8, recorded(BOARD))  # drafts every round
    play(policy, 0.3, 300, np.random.default_rng(5), BOARD)
    stored = merge_evidence(None, policy.acceptance.hand_over())
    assert stored["total"][1] > 2 * AcceptanceEstimate.PRIOR_CAP
    fresh = DraftPolicy(8, recorded(HERE))
    assert fresh.probe() > 0  # knows nothing: worth a probe
    fresh.acceptance.add_before(stored)
    assert fresh.acceptance.totals()[1] == pytest.approx(AcceptanceEstimate.PRIOR_CAP)
    assert fresh.acceptance.per_position()[0] < 0.5 and fresh.probe() == 0  # knows the draft is poor
    fresh.acceptance.add_before({"accepted": "damaged"})  # an unreadable record is ignored
    fresh.acceptance.add_before(None)
    assert fresh.acceptance.totals()[1] == pytest.approx(AcceptanceEstimate.PRIOR_CAP)
    # A record from before the after-a-rejection slot (k_max values) still reads.
    sparse = {"accepted": [3.0, 2.0, 0.0] + [0.0] * 5, "verified": [3.0, 3.0, 1.0] + [0.0] * 5,
              "total": [5.0, 7.0]}  # one early rejection, nothing deeper
    good = DraftPolicy(8, prior=0.95)
    good.acceptance.add_before(sparse)
    assert good.acceptance.totals()[1] == pytest.approx(AcceptanceEstimate.PRIOR_CAP + 7.0)
    assert all(a > 0.85 for a in good.acceptance.per_position()[3:])  # the measured prior stays where evidence is thin
    alone = DraftPolicy(8)
    alone.acceptance.add_before(sparse)
    assert alone.acceptance.per_position()[2] < 0.6  # what replacing the prior would have believed


def test_the_prior_is_never_handed_to_the_store():
    """A measured prior and loaded evidence shape the estimate but are not
    part of what a run hands over: stored evidence never counts them twice."""
    est = AcceptanceEstimate(4, prior=0.9)
    est.add_before({"accepted": [2.0] * 5, "verified": [2.0] * 5, "total": [8.0, 8.0]})
    assert sum(est.hand_over()["counts"]["verified"]) == 0  # nothing observed yet
    est.observe(3, 2)
    out = est.hand_over()
    assert out["counts"]["verified"] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert out["counts"]["accepted"] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert out["decay"] == pytest.approx(est.decay)
    assert est.hand_over()["counts"]["total"] == [0.0, 0.0]  # handed over once only


def test_concurrent_runs_lose_no_evidence():
    """Two runs that started from the same stored evidence each merge their
    own counts: the result holds both (last-writer-wins would drop one)."""
    a, b = AcceptanceEstimate(4), AcceptanceEstimate(4)
    for _ in range(5):
        a.observe(2, 1, after_miss=True)
    for _ in range(3):
        b.observe(4, 4)
    start = {"accepted": [1.0] * 5, "verified": [2.0] * 5, "total": [4.0, 8.0]}
    ca, cb = a.hand_over(), b.hand_over()
    both = merge_evidence(merge_evidence(start, ca), cb)
    expect_v = np.array(start["verified"]) * ca["decay"] * cb["decay"] + np.add(
        np.array(ca["counts"]["verified"]) * cb["decay"], cb["counts"]["verified"])
    np.testing.assert_allclose(both["verified"], expect_v)
    assert both["verified"][-1] > both["verified"][0] * 0.5  # the after-a-rejection slot is merged too
    assert merge_evidence("corrupt", ca)["verified"] == ca["counts"]["verified"]


def test_a_probes_read_back_of_skipped_tokens_counts_as_evidence():
    """A probe that read back the draft's agreement on the tokens it caught up
    on learns from all of them; one that drafted three learns little."""
    times = [0.03 + 0.012 * k + (0.01 if k else 0.0) for k in range(9)]  # pays from acceptance ~0.7

    def after_bad_spell():
        policy = DraftPolicy(8, recorded(times))
        for n in (0, 1, 0, 0, 2, 0, 1, 0):
            policy.update(3, n)
        assert policy.best_k() == 0
        return policy
    without, with_readback = after_bad_spell(), after_bad_spell()
    without.update(3, 3)
    with_readback.update(3, 3, catchup=(31.0, 32))
    assert without.best_k() == 0
    assert with_readback.best_k() >= 2
    run = with_readback.acceptance.hand_over()["counts"]
    assert run["total"][1] > 32 and run["verified"][0] > 30  # decayed once, as a round
    firm = DraftPolicy(8, recorded(times))
    firm.update(3, 3, catchup=(2.0, 32))  # read-backs that disagree rule the draft out as firmly
    assert firm.best_k() == 0 and firm.probe() == 0


def test_the_guard_stops_drafting_that_delivers_less_than_plain():
    """When recent drafting rounds deliver under GUARD of plain decoding's
    rate, drafting stops and the acceptance counts are mostly forgotten:
    the estimate lagged a change (greedy calls, then sampling at 0.8 by
    sample-and-compare: 13 losing rounds before the counts caught up)."""
    policy = DraftPolicy(8, online_costs=True)
    play(policy, 0.97, 200, np.random.default_rng(7), BOARD)
    assert policy.drafting and policy.acceptance.per_position()[0] > 0.9
    before = policy.acceptance.totals()[1]
    for _ in range(30):  # one token per K = 8 round
        policy.delivered.add(1, BOARD[8])
    policy.since_plain = 0  # no plain round due to re-time it
    assert policy.choose() == 0 and not policy.drafting
    assert policy.acceptance.totals()[1] < 0.5 * before and policy.delivered.rounds == 0
    # Through rounds: where a draft token costs half a target step, a draft
    # that turns poor is dropped within a few rounds.
    policy = DraftPolicy(8, online_costs=True)
    play(policy, 0.97, 200, np.random.default_rng(7), HERE)
    ks = play(policy, 0.2, 40, np.random.default_rng(8), HERE)
    assert 0 in ks[:10]
    assert all(k <= Trials.PROBE_K for k in ks[-30:])  # plain decoding, and short probes at most


def test_a_catch_up_timed_at_a_short_lag_does_not_price_a_long_one_per_token():
    """A forward's fixed part dominates a short catch-up: 35 ms for 3
    tokens measured after a first call must not price a chat prompt's 40
    tokens at 12 ms each, which kept every later chat from drafting."""
    policy = DraftPolicy(8, online_costs=True)
    for _ in range(12):  # a good draft: K=4 rounds deliver 5 tokens in 75 ms, plain 1 in 33 ms
        policy.choose(lag=1)
        policy.update(0, 0, None, 0.033)
        policy.choose(lag=1)
        policy.update(4, 4, None, 0.075, first_seconds=0.013)
    policy.choose(lag=3)
    policy.update(4, 4, None, 0.097, first_seconds=0.035)  # the catch-up: 3 tokens in 35 ms
    assert policy.arms.catchup_cost(3) == pytest.approx(0.035)
    assert policy.arms.catchup_cost(38) < 0.5 * 38 * 0.035 / 3
    assert policy.choose(remaining=20, lag=40) > 0
    assert "predicted" in policy.explain() and "measured in this process" in policy.explain()


def test_an_untimed_k_never_costs_nothing():
    """Two close K timed far apart (one in a busy spell) drew a line that
    crossed zero: K=1 was priced at minus 120 ms and its rate came out
    negative (the why line read "K 1:-6.01"). A drafting round is priced
    at least as a plain one."""
    arms = Arms(8, [CostModel()])
    arms.observe(2, 0.150)
    arms.observe(3, 0.450)
    assert all(arms.time(k) >= arms.time(0) > 0 for k in range(9))
    assert arms.time(1) <= arms.time(2) < arms.time(3)


def test_drafting_priced_in_a_slow_phase_is_tried_again():
    """The draft's forwards slow for a while and the target's do not (this
    machine's phases): drafting is priced as losing and stops. Once the
    phase is over, after Retries.WAIT plain rounds a retry probes and times
    K = k_max with the old prices aged, and drafting resumes; with retries
    off it stays plain for good, which is what the retry is for."""
    fast = [0.015 + 0.0075 * k for k in range(9)]  # K=8 at 0.95: about 1.5x plain
    slow = [fast[0]] + [3 * t for t in fast[1:]]

    def run(retries: bool):
        policy = DraftPolicy(8, online_costs=True)
        if not retries:
            policy.trials.retries.WAIT = policy.trials.retries.wait = 10 ** 9
        rng = np.random.default_rng(1)
        phase = play(policy, 0.95, 80, rng, slow)
        return phase, play(policy, 0.95, 300, rng, fast)

    phase, after = run(True)
    assert sum(k > 0 for k in phase[10:]) <= 4  # priced as losing: stopped (one retry, K=3 then 8)
    assert sum(k > 0 for k in after[-200:]) > 150  # tried again, and drafting again
    assert sum(k > 0 for k in run(False)[1]) == 0


def test_a_poor_draft_is_retried_rarely():
    """Retries ask the estimated acceptance, not the optimistic one: a draft
    known to be poor is not retried every Retries.WAIT rounds."""
    policy = DraftPolicy(8, online_costs=True)
    ks = play(policy, 0.3, 1200, np.random.default_rng(2), [0.015 + 0.0075 * k for k in range(9)])
    assert sum(k > 0 for k in ks[200:]) <= 12


def test_a_long_k_is_timed_only_if_it_could_pay():
    """A drafting policy times K = k_max once (Arms.unspanned), but not a K
    that would lose even at the optimistic acceptance and the prior's price:
    with a middling draft (the Q2_K here) that round cost a first call 3-4%
    for nothing. A good draft still gets its long K timed."""
    times = [0.015] + [0.010 + 0.008 * k for k in range(1, 9)]  # at 0.7, K=1 wins (1.4x plain); K=8 cannot (0.65x)

    def first_call(a: float):
        policy = DraftPolicy(8, online_costs=True)
        policy.acceptance.observe_skipped(a * 40, 40)  # a first probe's read-back of a 40-token prompt
        return play(policy, a, 150, np.random.default_rng(3), times)

    middling = first_call(0.7)
    assert sum(k > 0 for k in middling) > 100 and 8 not in middling
    assert 8 in first_call(0.95)[:40]
