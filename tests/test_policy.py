"""The draft-length policy on synthetic costs and acceptance (no models, no clock)."""

import numpy as np
import pytest

from specgguf.policy import (AcceptanceEstimate, CostModel, CostTracker, DraftPolicy, ProbeSchedule, merge_evidence,
                             rate, rates)

# A memory-bound board: a batch of b target tokens costs little more than one.
CHEAP_BATCH = CostModel(draft=0.1, target=[1.0 + 0.05 * b for b in range(9)])
# This CI machine with the 135M pair: the draft costs half a target token and
# batches are compute-bound (measured: T(5) ~ 2.3 T(1)).
COMPUTE_BOUND = CostModel(draft=0.55, target=[1.0, 1.75, 2.0, 2.05, 2.35, 2.45, 2.7, 2.75, 2.9])


def simulate(policy, acceptance, rounds, rng):
    """Run rounds where each drafted position is accepted with `acceptance`;
    returns the K chosen each round."""
    ks = []
    for _ in range(rounds):
        k = policy.choose()
        n = 0
        while n < k and rng.random() < acceptance:
            n += 1
        policy.update(k, n)
        ks.append(k)
    return ks


def best_k_formula(costs, a, k_max=8):
    rate = lambda k: sum(a**i for i in range(k + 1)) / (k * costs.draft + costs.target_cost(k + 1))
    return max(range(k_max + 1), key=rate)


@pytest.mark.parametrize("a", [0.5, 0.7, 0.9, 0.97])
def test_picks_the_k_the_formula_says(a):
    policy = DraftPolicy(8, CostModel.from_dict(CHEAP_BATCH.to_dict()), decay=0.995)
    ks = simulate(policy, a, 3000, np.random.default_rng(0))
    want = best_k_formula(CHEAP_BATCH, a)
    assert want > 0
    # After learning, the usual choice is the formula's optimum (or a neighbour
    # with a rate within 2%: the estimates are statistical).
    chosen = max(set(ks[-500:]), key=ks[-500:].count)
    rate = lambda k: sum(a**i for i in range(k + 1)) / (k * CHEAP_BATCH.draft + CHEAP_BATCH.target_cost(k + 1))
    assert rate(chosen) >= 0.98 * rate(want)


def test_picks_zero_when_the_draft_cannot_pay():
    policy = DraftPolicy(8, CostModel.from_dict(COMPUTE_BOUND.to_dict()))
    ks = simulate(policy, 0.5, 1000, np.random.default_rng(1))
    assert best_k_formula(COMPUTE_BOUND, 0.5) == 0
    # Plain decoding, with a rare probe (a 99%-acceptance draft could pay here).
    assert ks[-800:].count(0) >= 0.99 * 800
    # A draft as slow as the target can never pay: no probe at all.
    hopeless = CostModel(draft=1.0, target=[1.0 + 0.5 * b for b in range(9)])
    policy = DraftPolicy(8, hopeless)
    assert not policy.could_pay()
    ks = simulate(policy, 0.5, 500, np.random.default_rng(1))
    assert ks[50:].count(0) == 450


def test_evidence_of_a_poor_draft_stops_probes_until_it_ages():
    policy = DraftPolicy(8, CostModel.from_dict(COMPUTE_BOUND.to_dict()))
    assert policy.could_pay()  # no evidence yet: the draft might be excellent
    rng = np.random.default_rng(0)
    accepted = [0 if rng.random() < 0.6 else 1 for _ in range(30)]
    assert 0 < sum(accepted) < 30  # a mix of rounds, as intended
    for n in accepted:
        policy.update(3, n)
    assert not policy.could_pay()  # seen: it is poor
    for _ in range(100):
        policy.choose()
    assert not policy.could_pay()  # still ruled out a while later
    for _ in range(1500):
        policy.choose()  # idle rounds thin the evidence: worth a look again
    assert policy.acceptance.optimistic() > 0.9 and policy.could_pay()


def test_recovers_when_acceptance_rises():
    policy = DraftPolicy(8, CostModel.from_dict(CHEAP_BATCH.to_dict()))
    rng = np.random.default_rng(2)
    bad = simulate(policy, 0.02, 300, rng)
    assert bad[-100:].count(0) > 90  # backed off to plain decoding, probing rarely
    good = simulate(policy, 0.95, 600, rng)
    assert best_k_formula(CHEAP_BATCH, 0.95) >= 4
    assert np.mean(good[-200:]) >= 4  # the probes noticed and K went back up
    # (one probe keeping all 3 tokens is not enough evidence after 300 poor
    # rounds; without halving the wait after it, the next came 512 rounds on)


def test_probes_back_off_while_they_fail():
    policy = DraftPolicy(8, CostModel.from_dict(CHEAP_BATCH.to_dict()), probe_every=4)
    ks = simulate(policy, 0.0, 400, np.random.default_rng(3))
    probes = [i for i, k in enumerate(ks) if k > 0]
    # The first round drafts on the prior alone, and once drafting the policy
    # stops only when it expects a loss: after one miss, a second round.
    assert probes[:2] == [0, 1]
    gaps = list(np.diff(probes[1:]))
    assert gaps == [4, 8, 16, 32, 64, 128, 128]  # doubling after each failed probe, up to 32x


def test_cost_model_extrapolates_and_round_trips():
    c = CostModel(draft=0.2, target=[1.0, 1.5])
    assert c.target_cost(4) == pytest.approx(2.5)
    assert CostModel.from_dict(c.to_dict()) == c


def test_online_costs_rescale_relative_defaults():
    policy = DraftPolicy(4, online_costs=True)
    policy.update(0, 0, draft_cost=0.0, target_cost=0.020)  # 20 ms for one target token
    assert policy.costs.seconds and policy.costs.target_cost(1) == pytest.approx(0.020)
    # Every cost is rescaled, the draft's catch-up too (it stayed at 0.1, read as
    # 100 ms per token: about 100x the real catch-up of a small draft).
    prior = CostModel()
    assert policy.costs.draft_prefill == pytest.approx(0.020 * prior.draft_prefill / prior.target[0])
    assert policy.costs.draft == pytest.approx(0.020 * prior.draft / prior.target[0])
    frozen = DraftPolicy(4, online_costs=False)
    frozen.update(2, 1, draft_cost=5.0, target_cost=5.0)
    assert frozen.costs == CostModel()  # seeded runs ignore the clock


def test_a_rounds_first_draft_token_is_costed_apart():
    # Measured in k=1 runs: the first draft forward of a round (cold weights
    # after the target's forward, two tokens after a full accept) took about
    # twice a warm one. One cost per token called K = 1 a win here; it is not.
    one_cost = CostModel(draft=0.3, target=[1.0, 1.2, 1.4, 1.6, 1.8])
    two_costs = CostModel(draft=0.3, target=list(one_cost.target), draft_first=0.6)
    assert two_costs.draft_cost(0) == 0.0 and two_costs.draft_cost(3) == pytest.approx(1.2)
    assert one_cost.draft_cost(3) == pytest.approx(0.9)
    assert DraftPolicy(1, one_cost).best_k([0.8]) == 1  # 1.8 tokens for 1.5
    assert DraftPolicy(1, two_costs).best_k([0.8]) == 0  # 1.8 tokens for 1.8
    assert CostModel.from_dict(two_costs.to_dict()) == two_costs
    assert two_costs.scaled(2.0).draft_first == pytest.approx(1.2)


def test_online_costs_learn_the_first_draft_forward_apart_from_the_rest():
    policy = DraftPolicy(4, CostModel(draft=0.010, target=[0.040] * 5, seconds=True), online_costs=True)
    policy.update(0, 0, draft_cost=0.0, target_cost=0.040)  # a plain round: the draft now lags
    for _ in range(60):  # drafting rounds of 4: first forward 20 ms, the next three 10 ms each
        policy.choose()
        policy.update(4, 4, draft_cost=0.050, target_cost=0.060, first_cost=0.020)
    assert policy.costs.draft_first == pytest.approx(0.020, rel=0.02)
    assert policy.costs.draft == pytest.approx(0.010, rel=0.02)
    # After a plain round the first forward is a catch-up: not a round's usual
    # first forward, but the warm ones after it still count.
    policy.update(0, 0, draft_cost=0.0, target_cost=0.040)
    policy.update(4, 4, draft_cost=0.530, target_cost=0.060, first_cost=0.500)
    assert policy.costs.draft_first == pytest.approx(0.020, rel=0.02)
    assert policy.costs.draft == pytest.approx(0.010, rel=0.02)
    # A drafter that does not time its forwards: one cost per token, as before.
    policy.update(4, 4, draft_cost=0.080, target_cost=0.060)
    assert policy.costs.draft_first is None and policy.costs.draft_cost(4) == pytest.approx(
        4 * policy.costs.draft)


def test_cost_model_from_dict_defaults_to_the_dataclass():
    # A record without "seconds" is read as the dataclass says (relative), not as seconds.
    assert CostModel.from_dict({"draft": 0.4, "target": [1.0, 1.2]}).seconds is False
    assert CostModel.from_dict({"draft": 0.4, "target": [1.0], "seconds": True}).seconds is True


def test_p_min_auto_learns_a_cutoff():
    policy = DraftPolicy(4, CostModel.from_dict(CHEAP_BATCH.to_dict()), p_min="auto")
    rng = np.random.default_rng(4)
    for _ in range(2000):
        conf = rng.random(4)
        # Tokens the draft is unsure of (confidence < 0.4) are always rejected.
        n = 0
        while n < 4 and conf[n] >= 0.4:
            n += 1
        policy.update(4, n, conf)
    assert 0.3 <= policy.p_min() <= 0.5
    assert DraftPolicy(4, p_min=0.25).p_min() == 0.25
    assert DraftPolicy(4).p_min() is None
    with pytest.raises(ValueError, match="p_min"):
        DraftPolicy(4, p_min=2.0)


def test_learned_evidence_carries_over_as_a_weak_prior():
    policy = DraftPolicy(8, CostModel.from_dict(CHEAP_BATCH.to_dict()))  # drafts every round
    simulate(policy, 0.3, 300, np.random.default_rng(5))
    stored = merge_evidence(None, policy.acceptance.hand_over())
    assert stored["total"][1] > 2 * AcceptanceEstimate.PRIOR_CAP
    fresh = DraftPolicy(8, CostModel.from_dict(COMPUTE_BOUND.to_dict()))
    assert fresh.could_pay()  # knows nothing: worth a probe
    fresh.acceptance.add_before(stored)
    assert fresh.acceptance.totals()[1] == pytest.approx(AcceptanceEstimate.PRIOR_CAP)
    assert fresh.acceptance.per_position()[0] < 0.5 and not fresh.could_pay()  # knows the draft is poor
    fresh.acceptance.add_before({"accepted": "damaged"})  # an unreadable record is ignored
    fresh.acceptance.add_before(None)
    assert fresh.acceptance.totals()[1] == pytest.approx(AcceptanceEstimate.PRIOR_CAP)
    # With a measured prior the stored evidence adds to it: positions the
    # evidence barely saw keep the measurement instead of a shrunken guess.
    sparse = {"accepted": [3.0, 2.0, 0.0] + [0.0] * 5, "verified": [3.0, 3.0, 1.0] + [0.0] * 5,
              "total": [5.0, 7.0]}  # one early rejection, nothing deeper
    good = DraftPolicy(8, CostModel.from_dict(CHEAP_BATCH.to_dict()), prior=0.95)
    good.acceptance.add_before(sparse)
    assert good.acceptance.totals()[1] == pytest.approx(AcceptanceEstimate.PRIOR_CAP + 7.0)
    assert all(a > 0.85 for a in good.acceptance.per_position()[3:])
    alone = DraftPolicy(8, CostModel.from_dict(CHEAP_BATCH.to_dict()))
    alone.acceptance.add_before(sparse)
    assert alone.acceptance.per_position()[2] < 0.6  # what replacing the prior would have believed


def test_the_prior_is_never_handed_to_the_store():
    """A measured prior and loaded evidence shape the estimate but are not
    part of what a run hands over: stored evidence never counts them twice."""
    est = AcceptanceEstimate(4, prior=0.9)
    est.add_before({"accepted": [2.0] * 4, "verified": [2.0] * 4, "total": [8.0, 8.0]})
    assert sum(est.hand_over()["counts"]["verified"]) == 0  # nothing observed yet
    est.observe(3, 2)
    out = est.hand_over()
    assert out["counts"]["verified"] == [1.0, 1.0, 1.0, 0.0] and out["counts"]["accepted"] == [1.0, 1.0, 0.0, 0.0]
    assert out["decay"] == pytest.approx(est.decay)
    assert est.hand_over()["counts"]["total"] == [0.0, 0.0]  # handed over once only


def test_concurrent_runs_lose_no_evidence():
    """Two runs that started from the same stored evidence each merge their
    own counts: the result holds both (last-writer-wins would drop one)."""
    a, b = AcceptanceEstimate(4), AcceptanceEstimate(4)
    for _ in range(5):
        a.observe(2, 1)
    for _ in range(3):
        b.observe(4, 4)
    start = {"accepted": [1.0] * 4, "verified": [2.0] * 4, "total": [4.0, 8.0]}
    ca, cb = a.hand_over(), b.hand_over()
    both = merge_evidence(merge_evidence(start, ca), cb)
    # Each run's own counts are all there, the earlier one decayed by the later
    # one's observations, beside the decayed start.
    expect_v = np.array(start["verified"]) * ca["decay"] * cb["decay"] + np.add(
        np.array(ca["counts"]["verified"]) * cb["decay"], cb["counts"]["verified"])
    np.testing.assert_allclose(both["verified"], expect_v)
    assert both["total"][1] == pytest.approx(sum(expect_v))
    assert merge_evidence("corrupt", ca)["verified"] == ca["counts"]["verified"]


def test_online_policy_re_times_plain_decoding_while_drafting():
    policy = DraftPolicy(8, CostModel(draft=0.1, target=[3.0] + [1.05 + 0.05 * b for b in range(8)],
                                      seconds=True), online_costs=True)
    ks = []
    for _ in range(200):
        k = policy.choose()
        ks.append(k)
        # Plain rounds really take 1.0, not the 3.0 the stale table says.
        policy.update(k, k, draft_cost=0.1 * k, target_cost=1.0 if k == 0 else 1.05 + 0.05 * k)
    assert ks[:31].count(0) == 0 and 0 in ks[31:40]  # a plain round within the first 32
    assert policy.costs.target_cost(1) < 2.0  # and the estimate came down
    frozen = DraftPolicy(8, CostModel.from_dict(CHEAP_BATCH.to_dict()))  # seeded runs: no such rounds
    assert 0 not in simulate(frozen, 0.99, 200, np.random.default_rng(0))[10:]


def test_a_measured_prior_decides_the_first_rounds():
    # A calibration of the default pair on this machine (ms).
    measured = CostModel(draft=7.7, target=[21.6, 30.0, 32.9, 33.1, 36.8, 38.4, 41.1, 42.5, 43.9])
    costs = lambda: CostModel.from_dict(measured.to_dict())
    # Without a prior the draft might be excellent: worth probing.
    assert DraftPolicy(8, costs()).could_pay()
    # A draft measured as poor: plain decoding from the first round, no probe
    # until the prior has aged.
    poor = DraftPolicy(8, costs(), prior=0.4)
    assert not poor.could_pay()
    assert [poor.choose() for _ in range(64)] == [0] * 64
    # A draft measured as good: drafting from the first round, at the K the
    # formula gives for that acceptance.
    good = DraftPolicy(8, costs(), prior=0.95)
    assert good.choose() == best_k_formula(measured, good.acceptance.per_position()[0]) > 0
    # It is evidence, not a setting: observations outweigh it.
    for _ in range(40):
        poor.update(4, 4)
    assert poor.choose() > 0
    with pytest.raises(ValueError, match="prior"):
        DraftPolicy(8, costs(), prior=1.5)


def test_no_probe_whose_catch_up_costs_more_than_it_could_save():
    # Plain decoding chosen (acceptance 0.5 cannot pay at compute-bound costs),
    # but an excellent draft could: a probe is worth it when enough tokens remain.
    costs = CostModel(draft=0.55, target=list(COMPUTE_BOUND.target), draft_prefill=0.2)
    policy = DraftPolicy(8, costs)
    assert policy.best_k() == 0 and policy.could_pay()
    acc = [policy.acceptance.optimistic()] * 8
    best = max(policy.rate(k, acc) for k in range(1, 9))
    per_token = 1.0 / policy.rate(0) - 1.0 / best  # the most a probe could save per token
    skipped = 400  # a long prompt the draft has not seen
    break_even = skipped * costs.draft_prefill / per_token / DraftPolicy.PROBE_ODDS  # a chance, not a promise
    assert not policy.could_pay(remaining=int(break_even * 0.9), lag=skipped)
    assert policy.could_pay(remaining=int(break_even * 1.1) + 1, lag=skipped)
    # Through choose(): on schedule, the probe runs only where it could pay back.
    ks = [policy.choose(remaining=10, lag=skipped) for _ in range(100)]
    assert ks == [0] * 100
    assert policy.choose(remaining=100000, lag=skipped) == DraftPolicy.PROBE_K
    # The catch-up cost round-trips with a stored calibration (older files: half a draft token).
    assert CostModel.from_dict(costs.to_dict()) == costs
    assert CostModel.from_dict({"draft": 0.4, "target": [1.0]}).draft_prefill == 0.2


def test_no_drafting_whose_catch_up_cannot_be_won_back():
    # A good draft on a memory-bound board: drafting pays, by this much per token.
    policy = DraftPolicy(8, CostModel.from_dict(CHEAP_BATCH.to_dict()), prior=0.9)
    k = policy.best_k()
    assert k > 0
    per_token = 1.0 / policy.rate(0) - 1.0 / policy.rate(k)
    # A long prompt the draft has not seen, and a few tokens left: plain decoding.
    skipped = 2 + 500
    few = int(500 * CHEAP_BATCH.draft_prefill / per_token * 0.9)
    assert policy.choose(remaining=few, lag=skipped) == 0
    # Enough tokens left to repay the catch-up: draft.
    assert policy.choose(remaining=int(few / 0.9 * 1.1) + 1, lag=skipped) == k
    # The usual lag of a drafting round (up to 2 tokens) is part of the draft's cost.
    assert policy.choose(remaining=1, lag=2) == k
    assert policy.choose() == k  # nothing known about the run: the formula alone


def test_untimed_batches_follow_the_timed_ones_not_the_priors_shape():
    # From the relative prior (a batch of 9 at 2.6 T(1)), a run that has timed
    # T(1) and T(5) reads the larger sizes on the line through them, not on
    # the prior's shape scaled to T(1) (which puts T(9) at 104 ms here), and
    # the sizes between them at T(5): a batch never costs less than a smaller one.
    policy = DraftPolicy(8, online_costs=True)
    policy.update(0, 0, draft_cost=0.0, target_cost=0.040)
    for _ in range(20):
        policy.update(4, 4, draft_cost=0.040, target_cost=0.060)
    t = policy.costs.target
    assert t[0] == pytest.approx(0.040) and t[4] == pytest.approx(0.060, rel=0.01)
    assert t[1:4] == [t[4]] * 3 and t[8] == pytest.approx(t[0] + 2 * (t[4] - t[0]))
    assert t[8] < 0.085 and all(a <= b for a, b in zip(t, t[1:]))
    # Stored or calibrated costs were all measured: left as they are.
    measured = CostModel(draft=0.01, target=[0.04, 0.07, 0.05, 0.09, 0.1], seconds=True)
    fixed = DraftPolicy(4, measured, online_costs=True)
    fixed.update(0, 0, draft_cost=0.0, target_cost=0.040)
    fixed.update(4, 4, draft_cost=0.040, target_cost=0.100)
    assert fixed.costs.target[1:4] == measured.target[1:4]


def test_a_probe_does_not_make_small_batches_look_cheap():
    # The poor (Q2_K) draft in a run here, per round (fixed-K runs): T(1)
    # 32.5 ms, T(2) 43.6, T(4) 47.3; the draft's forwards 10.3 ms warm, 19.3
    # for a round's first; acceptance 0.65. K = 1 ran at 0.85x plain. After
    # one probe (K = 3, whose first forward is a catch-up), T(2) on the line
    # through T(1) and T(4) read 37.4 ms and the first forward read as a
    # warm one: K = 1 looked like +12%, past the entry margin, and a run
    # without calibration drafted into 15-20% losses. T(2) guessed at T(4)
    # errs high instead.
    policy = DraftPolicy(8, online_costs=True, prior=0.65)
    for _ in range(20):
        policy.update(0, 0, draft_cost=0.0, target_cost=0.0325)
    policy.update(3, 1, draft_cost=0.160 + 2 * 0.0103, target_cost=0.0473, first_cost=0.160)  # the probe
    t = policy.costs.target
    assert t[1] == t[2] == t[3] == pytest.approx(0.0473, rel=0.05)
    assert policy.best_k(margin=1.0) == 0
    t[1:3] = [t[0] + (t[3] - t[0]) * i / 3 for i in (1, 2)]  # the line through T(1) and T(4), as it was
    assert policy.best_k() == 1


def test_a_slow_spell_seen_only_in_plain_rounds_does_not_start_drafting():
    # The poor (Q2_K) draft's costs as calibrated here, and its acceptance.
    # Plain rounds then run 30% slower (a shared machine): judged against the
    # stale drafting costs, K = 1 would look like a 5% win; measured, it was a
    # loss. Every cost follows T(1), so only the measured ratios decide.
    poor = CostModel(draft=0.0159, target=[0.0425, 0.0560, 0.0605, 0.0633, 0.0711], seconds=True,
                     draft_prefill=0.0034, draft_first=0.0227)
    policy = DraftPolicy(4, poor.copy(), online_costs=True, prior=0.67)
    assert policy.best_k() == 0
    stale = DraftPolicy(4, CostModel.from_dict(dict(poor.to_dict(), target=[0.0553] + poor.target[1:])),
                        prior=0.67)
    assert stale.best_k() > 0  # what T(1) moving alone would do
    for _ in range(30):
        policy.update(0, 0, draft_cost=0.0, target_cost=0.0553)
    c = policy.costs
    assert c.target[0] == pytest.approx(0.0553, rel=0.05) and policy.best_k() == 0
    assert c.draft_first / c.target[1] == pytest.approx(poor.draft_first / poor.target[1])
    assert c.draft / c.target[0] == pytest.approx(poor.draft / poor.target[0])


def test_rates_in_one_pass_are_the_formulas():
    costs = CostModel(draft=0.3, target=[1.0, 1.2, 1.5], draft_first=0.5)
    acc = [0.9, 0.8, 0.7, 0.6]
    want = [sum(np.prod(acc[:i]) for i in range(k + 1)) / (costs.draft_cost(k) + costs.target_cost(k + 1))
            for k in range(5)]
    assert rates(4, acc, costs) == pytest.approx(want, rel=1e-12)
    assert [rate(k, acc, costs) for k in range(5)] == rates(4, acc, costs)


class _AlwaysFollow(CostTracker):
    """The tracker as it was: the untimed batches recomputed after every round."""

    def observe(self, *args, **kwargs):
        super().observe(*args, **kwargs)
        if self.online and not self.start.seconds:
            self._follow_timed()


def test_untimed_batches_are_recomputed_only_when_a_timed_size_moves():
    # A plain round scales every cost alike, which leaves the interpolated
    # batches where they were: the tracker skips that recomputation (it was
    # ~30 us of a plain round's Python), and must end where recomputing would.
    rng = np.random.default_rng(5)
    fast, ref = CostTracker(online=True), _AlwaysFollow(online=True)
    for _ in range(300):
        k = int(rng.choice([0, 0, 0, 2, 4]))
        args = (k, 0.01 * k * rng.uniform(0.8, 1.2), 0.04 * (1 + 0.1 * k) * rng.uniform(0.8, 1.2), k == 0)
        fast.observe(*args)
        ref.observe(*args)
        assert fast.costs.target == pytest.approx(ref.costs.target, rel=1e-9)
        assert fast.costs.draft == pytest.approx(ref.costs.draft, rel=1e-9)


def test_probe_schedule_backs_off_resets_and_retries_an_empty_probe():
    s = ProbeSchedule(4)
    assert [s.plain_round() for _ in range(4)] == [False, False, False, True]
    s.start()
    s.outcome(drafted=3, kept_all=False, stays_plain=True)
    assert s.every == 8 and not any(s.plain_round() for _ in range(7)) and s.plain_round()
    s.start()
    s.outcome(drafted=3, kept_all=True, stays_plain=True)  # kept everything: look again sooner
    assert s.every == 4
    for _ in range(10):
        s.start()
        s.outcome(drafted=3, kept_all=False, stays_plain=True)
    assert s.every == 4 * ProbeSchedule.BACKOFF_CAP
    s.start()
    s.outcome(drafted=0, kept_all=False, stays_plain=True)  # no n-gram match: nothing learned
    assert s.every == 4 * ProbeSchedule.BACKOFF_CAP and s.plain_round()  # due again at once
    s.drafting()
    assert s.every == 4 and not s.probing and s.waited == 0


# This machine's default pair, roughly: batches concave in size, a draft token
# at 0.45 T(1) (its round's first at 0.65): the rate is nearly flat from K = 3
# to 8, and the cost of the sizes not yet timed decides which K a run keeps.
CONCAVE = [0.0383, 0.0502, 0.0557, 0.0599, 0.0668, 0.0699, 0.0750, 0.0780, 0.0800]
FIRST, LATER = 0.025, 0.017


def _realized(policy, a, rounds, rng):
    """Expected tokens per second of the K the policy chose after 200 rounds
    (timed with 5% noise, from the true costs), over the best K's."""
    e = lambda k: sum(a ** i for i in range(k + 1))  # noqa: E731
    cost = lambda k: (FIRST + (k - 1) * LATER if k else 0.0) + CONCAVE[k]  # noqa: E731
    tokens = seconds = 0.0
    for r in range(rounds):
        k = policy.choose()
        n = 0
        while n < k and rng.random() < a:
            n += 1
        jitter = rng.normal(1, 0.05)
        policy.update(k, n, None, (FIRST + (k - 1) * LATER) * jitter if k else 0.0,
                      CONCAVE[k] * rng.normal(1, 0.05), FIRST * jitter if k else None)
        if r >= 200:
            tokens, seconds = tokens + e(k), seconds + cost(k)
    return tokens / seconds / max(e(k) / cost(k) for k in range(9))


def test_a_flat_rate_curve_is_climbed_to_its_top():
    # Before: the first probe timed a batch of 4, the larger sizes sat on the
    # line through T(1) and T(4) (too high for concave costs), a first sample
    # only halved a guess, and no round ever tried them: 3 runs in 10 kept
    # K = 3, the worst at 0.80 of the best rate. Now a guess counts as no
    # sample and one round in 32 times the next untimed size.
    effs = [_realized(DraftPolicy(8, online_costs=True), 0.95, 1000, np.random.default_rng(s)) for s in range(10)]
    assert min(effs) > 0.95 and np.mean(effs) > 0.97


def test_a_guess_yields_to_the_first_measurement_a_measured_cost_does_not():
    guessed = CostTracker(online=True)  # the relative prior
    guessed.observe(0, 0.0, 0.040, True)
    guessed.observe(4, 0.040, 0.070, False)
    assert guessed.costs.target[4] == pytest.approx(0.070)
    stored = CostTracker(CostModel(draft=0.01, target=[0.04, 0.05, 0.055, 0.06, 0.065], seconds=True), online=True)
    stored.observe(4, 0.040, 0.075, False)
    # A stored cost is a prior worth START_WEIGHT of one timing here: the measurement mostly replaces it.
    assert stored.costs.target[4] == pytest.approx(0.065 + (0.075 - 0.065) / (1 + CostTracker.START_WEIGHT))
    assert CostTracker.START_WEIGHT < 0.5


def test_a_probes_read_back_of_skipped_tokens_counts_as_evidence():
    """A probe that read back the draft's agreement on the tokens it caught up
    on learns from all of them; one that drafted three learns little."""
    costs = CostModel(draft=0.3, target=list(COMPUTE_BOUND.target))  # pays from acceptance ~0.8

    def after_bad_spell():
        policy = DraftPolicy(8, costs.copy())
        simulate(policy, 0.6, 10, np.random.default_rng(4))  # a spell at 0.6 ends drafting
        assert policy.best_k() == 0
        return policy
    without, with_readback = after_bad_spell(), after_bad_spell()
    without.update(3, 3)
    with_readback.update(3, 3, catchup=(31.0, 32))
    assert without.best_k() == 0
    assert with_readback.best_k() >= 3
    # It decays like a round's evidence and is handed to the store with it.
    run = with_readback.acceptance.hand_over()["counts"]
    assert run["total"][1] > 32 and run["verified"][0] > 32
    # Read-backs that disagree rule the draft out as firmly.
    firm = DraftPolicy(8, costs.copy())
    firm.update(3, 3, catchup=(2.0, 32))
    assert firm.best_k() == 0 and not firm.could_pay()


def test_once_drafting_it_stops_only_when_it_expects_a_loss():
    """The entry margin (DRAFT_MARGIN) guards against noisy estimates; leaving
    costs the catch-up to come back, so while drafting the policy stays
    as long as drafting is expected to beat plain decoding at all."""
    costs = CostModel.from_dict(COMPUTE_BOUND.to_dict())
    a = next(x / 100 for x in range(50, 100)  # an acceptance whose best K wins by 1-10%
             if 1.01 < max(rates(8, [x / 100] * 8, costs)[1:]) / rates(8, [x / 100] * 8, costs)[0] < 1.09)
    def policy_at(drafting):
        p = DraftPolicy(8, CostModel.from_dict(costs.to_dict()), prior=a)
        p.acceptance.add_prior(a, 1000.0)
        p.drafting = drafting
        return p
    assert policy_at(False).choose() == 0      # not drafting: the margin is not met
    assert policy_at(True).choose() > 0        # drafting: still expected to win, so it stays
    lower = policy_at(True)
    lower.acceptance.add_prior(a - 0.15, 10000.0)
    assert lower.choose() == 0                 # expected to lose: it stops


def test_the_cached_choice_is_always_the_fresh_one():
    """choose() recomputes best_k only when the counts or the costs' shape
    changed; across drafting, plain, probing and re-timing rounds with noisy
    timings, what it used equals best_k computed afresh at that moment."""
    rng = np.random.default_rng(8)
    for a in (0.3, 0.75, 0.95):
        policy = DraftPolicy(8, online_costs=True)
        stale = 0
        seen = None
        for i in range(600):
            margin = policy.STAY_MARGIN if policy.drafting else policy.DRAFT_MARGIN
            fresh = policy.best_k(margin=margin)
            # What best_k reads, up to a common scale of the costs, changes only with the key.
            c = policy.costs
            now = (np.array([c.draft, c.draft_cost(1), *[c.target_cost(b) for b in range(1, 10)]]) / c.target[0],
                   policy.acceptance.per_position())
            key = (policy.acceptance.version, policy.tracker.shape)
            if seen is not None and key == seen[0]:
                np.testing.assert_allclose(now[0], seen[1][0], rtol=1e-9)
                assert now[1] == seen[1][1]
            seen = (key, now)
            k = policy.choose(remaining=100, lag=1)
            stale += policy._best[1] != fresh
            n = 0
            while n < k and rng.random() < (a if i < 300 else 1.2 - a):  # and a change midway
                n += 1
            noise = rng.normal(1.0, 0.05)
            policy.update(k, n, None, 0.4 * k * noise if k else None, (1.0 + 0.2 * k) * noise,
                          0.5 * noise if k else None, (0.7 * 10, 10) if i % 97 == 0 else None)
        assert stale == 0
    # And it is cached: a plain round (costs scaled alike, no evidence) recomputes nothing.
    before = (policy.acceptance.version, policy.tracker.shape)
    policy.update(0, 0, None, None, 1.3)
    assert (policy.acceptance.version, policy.tracker.shape) == before
    policy.update(2, 1, None, 0.8, 1.4, 0.5)  # a drafting round changes both
    assert policy.acceptance.version > before[0] and policy.tracker.shape > before[1]


def test_stored_costs_say_which_batch_sizes_were_timed(tmp_path):
    # A first process times T(1) and T(4) (a probe); the other sizes are
    # guesses. Stored as they were, a later process took them for measured:
    # it never put the larger sizes to the test and never placed them on the
    # line through the timed ones again.
    from specgguf.config import GenerationConfig
    from specgguf.learning import Learning
    from specgguf.state import PairState, Store
    state, config = PairState(Store(tmp_path), "t+d", "machine"), GenerationConfig(k="auto")
    first = Learning(state).policy(config)
    first.update(0, 0, draft_cost=0.0, target_cost=0.032)
    first.update(3, 3, draft_cost=0.05, target_cost=0.047, first_cost=0.03)
    Learning(state).finish(first, config)
    stored = CostModel.from_dict(state.costs())
    assert stored.measured == [1, 4] and stored.seconds
    later = Learning(state).policy(config).tracker
    assert [b for b in range(1, 10) if later.timed(b)] == [1, 4]
    later.observe(0, 0.0, 0.032, True)
    later.observe(5, 0.07, 0.060, False)  # a first batch of 6: the larger sizes follow it
    t = later.costs.target
    assert t[5] == pytest.approx(0.060) and t[4] == t[5] and t[8] > t[5]
    assert later.measured_costs().measured == [1, 4, 6]
    # A guess yields to the first measurement; a measured size counts as one sample.
    later.observe(1, 0.02, 0.040, False)
    assert t[1] == pytest.approx(0.040)
    later.observe(3, 0.04, 0.057, False)
    assert t[3] == pytest.approx(stored.target[3] + (0.057 - stored.target[3]) / (1 + CostTracker.START_WEIGHT))
    # A calibration (every size measured) or a record from before the field: all timed.
    state.save_costs(dict(stored.to_dict(), measured=None))
    assert all(Learning(state).policy(config).tracker.timed(b) for b in range(1, 10))
    assert Learning(state).policy(config).tracker.measured_costs().measured is None
    state.save_costs(dict(stored.to_dict(), measured=[0, 12]))  # damaged: the prior
    assert not Learning(state).policy(config).tracker.start.seconds


def test_stored_costs_that_say_drafting_loses_do_not_stop_probes():
    """Stored costs with the draft dearer than a target token would veto
    every probe of a draft that agrees 95% of the time, so the run would
    never time the draft and the record would stand forever. Until the run
    has timed the draft, probes are gated on costs no dearer than the
    built-in prior; once it has, on the starting costs again (its timings
    now move the live ones)."""
    t1 = 0.03
    stored = CostModel(draft=1.2 * t1, target=[t1 * (1 + 0.1 * b) for b in range(9)], seconds=True,
                       draft_prefill=0.5 * t1, draft_first=1.5 * t1)
    policy = DraftPolicy(8, stored, online_costs=True, prior=0.95)
    acc = [policy.acceptance.optimistic()] * 8
    r = rates(8, acc, stored)
    assert max(r[1:]) < DraftPolicy.PROBE_MARGIN * r[0]  # the stored costs alone: no probe, ever
    policy.update(0, 0, None, None, t1)  # a plain round timed here
    assert policy.could_pay()
    policy.update(3, 3, None, 3 * 0.3 * t1, 1.3 * t1, 0.3 * t1)  # the probe times the draft: cheap after all
    assert policy.tracker.drafting_timed() and policy.tracker.gate_costs() is policy.tracker.start
    assert policy.costs.draft < 0.5 * stored.draft  # the timing mostly replaced the stored cost
