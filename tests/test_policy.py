"""The draft-length policy on synthetic forward costs and acceptance (no models, no clock)."""

from dataclasses import replace

import numpy as np
import pytest

from specgguf.engine.costs import Measured, Timed
from specgguf.engine.acceptance import Regime, expected_tokens
from specgguf.engine.policy import Policy, SlotView, Tuning

# Forward costs as lines in the tokens a forward evaluates (seconds).
# A memory-bound board: a target batch costs little more than one token, a draft token a twentieth.
BOARD = dict(target=lambda b: 0.098 + 0.002 * b, draft=lambda n: 0.004 + 0.001 * n)
# This CI machine with the default pair: a draft token costs about half a target token.
HERE = dict(target=lambda b: 0.027 + 0.005 * b, draft=lambda n: 0.004 + 0.009 * n)


def round_seconds(costs, k, lag=2):
    """A round's seconds: the draft's forwards (the first catches up on ``lag``), the target's batch of k + 1."""
    draft = costs["draft"](lag) + (k - 1) * costs["draft"](1) if k else 0.0
    return draft + costs["target"](k + 1)


def rate(a, costs, k):
    return expected_tokens(k, [a] * k)[k] / round_seconds(costs, k)


def best_k(a, costs):
    return max(range(9), key=lambda k: rate(a, costs, k))


class Player:
    """Rounds of one sequence: each drafted position accepted with ``acceptance``
    (misses end the round), forwards costing ``costs``' lines."""

    def __init__(self, policy, costs, rng, regime="greedy"):
        self.policy, self.costs, self.rng, self.regime = policy, costs, rng, regime
        self.lag, self.after_miss, self.first = 2, False, True

    def play(self, acceptance, rounds, remaining=1000, costs=None):
        costs = costs or self.costs
        ks = []
        for _ in range(rounds):
            view = SlotView(self.regime, 0 if self.first else 8, target_lag=40 if self.first else 1,
                            draft_lag=self.lag, remaining=remaining, after_miss=self.after_miss)
            k = self.policy.choose([view])[0]
            n = 0
            while n < k and self.rng.random() < acceptance:
                n += 1
            forwards = [(self.lag, costs["draft"](self.lag), 1)] + [(1, costs["draft"](1), 1)] * (k - 1) if k else []
            m = Measured(view.target_lag + k, costs["target"](view.target_lag + k), forwards, k + 1, 0.0002)
            self.policy.observe(self.regime, k, n, self.after_miss)
            self.policy.round_done([view], [k], m)
            self.after_miss = n < k
            self.lag = (1 if n < k else 2) if k else self.lag + 1
            self.first = False
            ks.append(k)
        return ks


def test_expected_tokens_is_the_formula():
    assert expected_tokens(3, [0.9, 0.8, 0.7]) == pytest.approx([1.0, 1.9, 1.9 + 0.72, 1.9 + 0.72 + 0.504])


@pytest.mark.parametrize("a", [0.5, 0.7, 0.9, 0.97])
def test_picks_the_k_the_formula_says(a):
    """Timing its own forwards, the policy settles on the K with the most
    tokens per second (or one within 3% of it: the estimates are statistical)."""
    policy = Policy(8)
    policy.measured("greedy", a, 32)
    ks = Player(policy, BOARD, np.random.default_rng(0)).play(a, 1500)
    want = best_k(a, BOARD)
    assert want > 0
    chosen = max(set(ks[-500:]), key=ks[-500:].count)
    assert rate(a, BOARD, chosen) >= 0.97 * rate(a, BOARD, want), (chosen, want)


def test_picks_zero_when_the_draft_cannot_pay():
    assert best_k(0.5, HERE) == 0
    policy = Policy(8)
    policy.measured("greedy", 0.5, 32)
    ks = Player(policy, HERE, np.random.default_rng(1)).play(0.5, 1000)
    assert ks[-800:].count(0) >= 0.99 * 800  # plain decoding, a rare try at most
    # A draft as slow as the target never pays: once measured, it is never drafted again.
    hopeless = dict(target=HERE["target"], draft=lambda n: 0.03 * n)
    policy = Policy(8)
    policy.measured("greedy", 0.9, 32)
    ks = Player(policy, hopeless, np.random.default_rng(1)).play(0.9, 500)
    assert sum(k > 0 for k in ks[20:]) <= 3


def test_nothing_is_drafted_before_a_forward_is_timed_and_an_unknown_draft_is_probed():
    policy = Policy(8)
    view = SlotView("greedy", 8, remaining=100)
    assert policy.choose([view]) == [0]  # no forward timed yet: plain
    policy.round_done([view], [0], Measured(1, 0.1, (), 1, 0.0))
    assert policy.choose([view]) == [Tuning.probe_k]  # acceptance unknown: a bounded probe
    # One sequence's probe informs every sequence of its regime: the others wait for it.
    many = [SlotView("greedy", 8, remaining=100, slot=i) for i in range(4)]
    assert sorted(policy.choose(many)) == [0, 0, 0, Tuning.probe_k]
    # No probe whose catch-up costs more than it could save.
    assert policy.choose([SlotView("greedy", 8, draft_lag=400, remaining=3)]) == [0]


def test_a_poor_draft_is_probed_rarely_until_its_evidence_ages():
    policy = Policy(8)
    player = Player(policy, HERE, np.random.default_rng(0))
    ks = player.play(0.3, 600)
    assert sum(k > 0 for k in ks[100:]) <= 10
    assert policy.regime("greedy").per_position()[0] < 0.5  # what its probes found
    for _ in range(2000):  # idle rounds thin the evidence: worth a look again
        policy.round_done([SlotView("greedy", 8)], [0], None)
    assert policy.regime("greedy").optimistic() > 0.9
    asks = []  # it asks every recheck rounds
    for _ in range(Tuning.recheck):
        asks.append(policy.choose([SlotView("greedy", 8, remaining=1000)])[0])
        policy.round_done([SlotView("greedy", 8)], [asks[-1]], None)
    assert max(asks) > 0


def test_recovers_when_acceptance_rises():
    policy = Policy(8)
    player = Player(policy, BOARD, np.random.default_rng(2))
    bad = player.play(0.02, 300)
    assert bad[-100:].count(0) > 90  # backed off to plain decoding, trying rarely
    good = player.play(0.95, 600)
    assert best_k(0.95, BOARD) >= 4
    assert np.mean(good[-200:]) >= 4  # the tries noticed and K went back up


def test_a_good_draft_drafts_every_round_and_a_blind_policy_times_nothing():
    """No plain round is spent re-timing the target but one every ``reread_any`` drafting rounds (the
    machine's speed, which every reading moves, reprices the rest; a phase of the one-token forward alone
    it does not: ``test_drafting_long_reads_plain_decoding_again_whatever_the_gain``)."""
    policy = Policy(8)
    policy.measured("greedy", 0.97, 32)
    ks = Player(policy, BOARD, np.random.default_rng(3)).play(0.97, 600)
    assert ks[5:].count(0) <= 3 + 600 // Tuning.reread_any
    frozen = Policy(8, clock=False)  # seeded p/q runs: the timing must not change the text
    frozen.measured("greedy", 0.97, 32)
    ks = Player(frozen, BOARD, np.random.default_rng(0)).play(0.99, 300)
    assert 0 not in ks[1:] and not frozen.costs.target.s


def test_a_round_after_a_rejection_has_its_own_first_position():
    est = Regime(4)
    for _ in range(20):
        est.observe(1, 0, after_miss=True)   # after a miss the next first token misses
        est.observe(4, 4, after_miss=False)  # elsewhere it holds
    assert est.per_position(after_miss=True)[0] < 0.4
    assert est.per_position(after_miss=False)[0] > 0.8
    assert len(est.per_position(True)) == len(est.per_position(False)) == 4


def test_no_drafting_whose_catch_up_cannot_be_won_back():
    policy = Policy(8)
    policy.measured("greedy", 0.9, 32)
    Player(policy, BOARD, np.random.default_rng(5)).play(0.9, 60)
    lag = 2000  # the draft is far behind: its catch-up costs about a target forward of 2000 tokens' worth
    assert policy.choose([SlotView("greedy", 8, draft_lag=lag, remaining=2000)])[0] > 0  # rounds that cannot time
    policy.batches_to_time(SlotView("greedy", 8, draft_lag=lag, remaining=2000))  # rounds that can: on a guess,
    assert policy.choose([SlotView("greedy", 8, draft_lag=lag, remaining=2000)]) == [0]  # it waits for them
    policy.timed_draft([(n, BOARD["draft"](n)) for n in Tuning.batch_timing])  # as the rounds time it first
    assert policy.choose([SlotView("greedy", 8, draft_lag=lag, remaining=2)]) == [0]
    assert policy.choose([SlotView("greedy", 8, draft_lag=lag, remaining=2000)])[0] > 0
    assert policy.choose([SlotView("greedy", 1, draft_lag=2, remaining=2)])[0] == 1  # a usual lag is in the round


def test_a_prompt_does_not_price_a_round_and_a_catch_up_is_priced_as_timed():
    """A prompt's forward costs less per token than a round's: fitted with the
    rounds it flattened the prices (K=8 looked cheap: a promised 1.7x
    delivered 1.15x). A catch-up is priced as its own forward was timed, paid
    back over the tokens left: a draft 40 tokens behind still drafts."""
    p = Policy(8)
    target = lambda n: 0.030 + 0.006 * n  # noqa: E731  (rounds of 1..9 tokens)
    draft = lambda n: 0.007 + 0.009 * n  # noqa: E731
    view = SlotView("greedy", 8)
    for n in (1, 5, 9, 1, 9, 3):
        p.round_done([view], [n - 1], Measured(n, target(n), [(2, draft(2), 1)] + [(1, draft(1), 1)] * (n - 2), n, 0.0))
    p.round_done([SlotView("greedy", 0, target_lag=41)], [0], Measured(41, 0.2, [(40, 0.1, 1)], 1, 0.0))
    assert 41 not in p.costs.target.s and p.costs.target(5) == pytest.approx(target(5), rel=0.02)
    assert p.costs.draft(40) == pytest.approx(0.1, rel=0.02)
    p.measured("greedy", 0.9, 1000)
    assert p.choose([SlotView("greedy", 8, draft_lag=40, remaining=128)])[0] > 0  # a draft 40 tokens behind drafts


def test_a_single_token_forward_is_priced_as_timed_not_off_the_line():
    """llama.cpp runs a 1-token forward by another kernel. Through
    Llama(draft_model=...) a 2-token forward cost 31 ms and a 1-token one
    21.5; K=1 rounds alone left the line's slope to its prior, which priced
    plain decoding at 29 ms, and K=1 (1.6 tokens in 42 ms at sample-and-compare's
    0.6) looked like 1.35x plain where it gave 0.7x."""
    p = Policy(8)
    view = SlotView("greedy", 8)
    p.round_done([view], [0], Measured(1, 0.0215))
    for _ in range(20):
        p.round_done([view], [1], Measured(2, 0.031, [(1, 0.011, 1)], 2))
    assert p.costs.seconds([view], [0]) < 0.0225  # one token as timed, not off a line through the rounds
    p.measured("greedy", 0.6, 64)
    assert p.choose([SlotView("greedy", 8, remaining=100)]) == [0]


def test_p_min_auto_is_the_confidence_one_more_draft_token_needs():
    """A draft token the draft is less sure of than what one more draft
    token costs, in tokens at the best rate, is not drafted."""
    policy = Policy(4)
    policy.measured("greedy", 0.9, 32)
    view = SlotView("greedy", 4)
    policy.round_done([view], [0], Measured(1, 1.0, (), 1, 0.0))
    policy.round_done([view], [1], Measured(2, 1.1, [(1, 0.1, 1)], 2, 0.0))
    cheap = policy.p_min("greedy")
    policy.round_done([view], [1], Measured(2, 1.1, [(1, 0.9, 1)], 2, 0.0))
    assert 0.0 < cheap < policy.p_min("greedy") <= 1.0  # a dearer draft token needs more confidence
    with pytest.raises(ValueError, match="k_max"):
        Policy(0)


def test_a_stored_record_is_a_prior_and_a_measurement_outweighs_it():
    est = Regime(8)
    est.add_record({"accepted": [0.1 * 1000] * 9, "verified": [1000.0] * 9, "total": [100.0, 1000.0]})
    assert est.total[1] == pytest.approx(Tuning.prior)  # what was stored weighs a few observations
    for damaged in ({"accepted": "damaged"}, None, {"accepted": [1.0] * 3, "verified": [1.0] * 3, "total": [1, 1]}):
        est.add_record(damaged)  # an unreadable record (or one of another shape) adds nothing
    assert est.total[1] == pytest.approx(Tuning.prior)
    policy = Policy(8)
    policy.regime("greedy").add_record(est.record())
    assert not policy.regime("greedy").known and policy.regime("greedy").per_position()[0] < 0.3
    policy.measured("greedy", 0.95, 32)  # this process's prompt, scored by both models
    assert policy.regime("greedy").known and min(policy.regime("greedy").per_position()) > 0.85


def test_the_record_a_run_leaves_is_the_next_processs_prior(tmp_path):
    from specgguf.config import GenerationConfig
    from specgguf.engine.learning import Learning
    from specgguf.state import PairState, Store
    state, config = PairState(Store(tmp_path), "t+d"), GenerationConfig(k="auto")
    first = Learning(state)
    view = SlotView(config.regime, 8, target_lag=40, draft_lag=40, remaining=200)
    policy = first.length(config)
    assert policy.worth_measuring(view)  # a prompt's round measures the draft on the prompt
    policy.measured(config.regime, 0.3, 32)
    assert policy.regime(config.regime).known
    Player(policy, HERE, np.random.default_rng(4)).play(0.3, 100)
    first.finish(policy, config)
    costs = state.costs()
    later = Learning(state).length(config)  # no measurement: it keeps to the record, a few observations' worth
    assert later.regime(config.regime).total[1] == pytest.approx(Tuning.prior)
    assert later.regime(config.regime).per_position()[0] < 0.5
    assert not later.regime(config.regime).known
    # The draft's forwards as that process timed them, against a target token, price it in the next
    # ones: a draft that cannot pay even at its optimistic acceptance is not measured again (a CLI
    # process paid 4% a call for that). Processes that time no draft forward age the stored price,
    # and `stale` of them later it is dropped: the next process measures the draft again.
    assert state.costs()["uses"] == 0 and state.costs()["draft"]
    assert "as an earlier process timed it" in Learning(state).length(config).explain(config.regime)
    for uses in range(1, Tuning.stale + 1):
        nxt = Learning(state)
        policy = nxt.length(config)
        assert not policy.worth_measuring(view)
        assert Player(policy, HERE, np.random.default_rng(uses)).play(0.3, 20) == [0] * 20
        nxt.finish(policy, config)
        assert state.costs()["uses"] == uses
    assert state.costs()["draft"] == {} and Learning(state).length(config).worth_measuring(view)
    state.save_evidence(config.regime, {"accepted": [9.0] * 9, "verified": [10.0] * 9, "total": [9.0, 10.0]})
    state.save_costs(costs)  # a good record: measured on its prompt, whatever the stored price
    assert Learning(state).length(config).worth_measuring(view)


def test_a_stored_draft_price_is_a_ratio_to_a_target_token_and_a_damaged_one_adds_nothing():
    from specgguf.engine.costs import Costs
    c = Costs(None, False, Tuning())
    c.timed_draft(1, 0.01)
    c.timed_draft(31, 0.05)
    assert c.record() is None  # plain decoding's token not read yet: no ratio to store
    for _ in range(Tuning.settle):
        c.target.observe(1, 0.02)
    rec = c.record()
    assert rec["uses"] == 0 and rec["draft"]["1"] == pytest.approx(0.5) and rec["draft"]["31"] == pytest.approx(2.5)
    later = Costs(None, False, Tuning(), rec)
    assert later.draft_priced() and later.longest_draft() == 31
    for _ in range(Tuning.settle):
        later.target.observe(1, 0.04)  # a process twice as slow: both models alike
    assert later.draft_forward(1) == pytest.approx(0.02) and later.draft_forward(31) == pytest.approx(0.1)
    later.timed_draft(1, 0.03)  # its own timing replaces the stored shape
    assert later.draft_forward(1) == pytest.approx(0.03)
    for bad in (None, [], {"draft": "x"}, {"draft": {}}, {"draft": {"0": 1.0}}, {"draft": {"1": -1.0}},
                {"draft": {"a": 1.0}}, {"draft": {"1": 0.5}, "uses": "x"}):
        assert not Costs(None, False, Tuning(), bad).draft_priced()
    assert Costs(None, True, Tuning(), rec).record() is None  # nothing timed: nothing to store


def test_a_target_batch_past_those_timed_is_priced_as_an_earlier_process_timed_it():
    """A lookup's first 33-token round on a fresh CLI call was hoped at a 4-token batch's price
    (17 ms where it took 45): past the counts timed here, the target's batches are priced on an
    earlier process's shape, scaled to this process's speed; a lookup's record is the target's alone."""
    from specgguf.engine.costs import Costs
    look = Costs(None, True, Tuning())
    for n, ms in ((1, 10.0), (4, 14.0), (33, 45.0)):
        for _ in range(Tuning.settle):
            look.target.observe(n, ms / 1e3)
    rec = look.record()
    assert set(rec) == {"target"} and rec["target"]["33"] == pytest.approx(4.5)
    hoped, fresh = Costs(None, True, Tuning()), Costs(None, True, Tuning(), rec)
    for costs in (hoped, fresh):
        for n, ms in ((1, 20.0), (4, 28.0)):  # a process twice as slow, that timed up to 4 tokens
            for _ in range(Tuning.settle):
                costs.target.observe(n, ms / 1e3)
    assert hoped.target(33) == pytest.approx(0.028)  # nothing known: flat past the largest count, hoping
    assert fresh.target(33) == pytest.approx(0.090) and fresh.target(4) == pytest.approx(0.028)


def test_a_probes_read_back_of_skipped_tokens_counts_as_evidence():
    est = Regime(8)
    est.observe(3, 3)
    est.read_back(31.0, 32)
    assert est.total[1] == pytest.approx(3 * Tuning.decay + 32)  # the round's counts decayed once, as a round's
    assert est.verified[0] > 30 and est.per_position()[0] > 0.9
    firm = Regime(8)
    firm.read_back(2.0, 32)  # read-backs that disagree rule the draft out as firmly
    assert firm.per_position()[0] < 0.2


def test_the_guard_forgets_an_estimate_the_text_contradicts():
    """Drafting rounds that deliver under GUARD of the tokens the estimate
    promised (the text stopped suiting the draft: deeper positions, rarely
    reached now, kept their old 0.9) make the policy mostly forget what it
    knew; without it a draft that had turned poor was retried after every
    plain round (simulator: 0.95 of plain)."""
    p = Policy(8)
    p.measured("greedy", 0.9, 1000)
    est = p.regime("greedy")
    before = est.total[1]
    for _ in range(5):
        p.observe("greedy", 6, 0, False)  # rejected at once, round after round
    assert est.total[1] < 0.3 * before
    q = Policy(8)
    q.measured("greedy", 0.9, 1000)
    for _ in range(20):  # what was promised, about
        q.observe("greedy", 4, 3, False)
        q.observe("greedy", 4, 4, False)
    assert q.regimes["greedy"].promised[2] > 4.9  # its record of 40 rounds never cleared: the guard kept quiet


def test_drafting_priced_in_a_slow_phase_is_tried_again():
    """The draft's forwards slow for a while and the target's do not (this
    machine's phases): drafting is priced as losing and stops. Once the
    phase is over, a lone sequence that has waited retries with the draft
    priced at most ``doubt`` of the target, and drafting resumes (a retry
    in the phase cost 16 plain rounds: the next waits ``retry_max``);
    with retries off it stays plain for good."""
    fast = dict(target=lambda b: 0.015 + 0.0012 * b, draft=lambda n: 0.002 + 0.004 * n)
    slow = dict(target=fast["target"], draft=lambda n: 3 * fast["draft"](n))
    assert best_k(0.95, fast) >= 4 and best_k(0.95, slow) == 0

    def run(explore: bool):
        policy = Policy(8, tuning=Tuning() if explore else Tuning(retry=10 ** 9))
        policy.measured("greedy", 0.95, 32)
        player = Player(policy, fast, np.random.default_rng(1))
        phase = player.play(0.95, 80, costs=slow)
        return phase, player.play(0.95, 900)

    phase, after = run(True)
    assert sum(k > 0 for k in phase[20:]) <= 4  # priced as losing: stopped
    assert sum(k > 0 for k in after[-200:]) > 150  # tried again, and drafting again
    assert sum(k > 0 for k in run(False)[1]) == 0


def played_through(first, then, acceptance, seed, rounds, tuning):
    """K per round of a lone sequence, measured at ``acceptance``, after ``rounds`` rounds on ``first``'s
    costs, over 300 rounds on ``then``'s (a warm-up or a phase that ended)."""
    policy = Policy(8, tuning=tuning)
    policy.measured("greedy", acceptance, 32)
    player = Player(policy, first, np.random.default_rng(seed))
    player.play(acceptance, rounds)
    return player.play(acceptance, 300, costs=then)


def test_drafting_on_a_thin_margin_reads_plain_decoding_again():
    """Plain decoding read dear right after the prompt (a warm-up; or a phase that ended) and never
    again while every round drafts: drafting on a thin margin went on at 0.87x plain in real chat.
    Every ``reread`` rounds it drafts under ``reread_gain``, one plain round reads it again: once
    its price has come down, drafting stops; with re-reads off it goes on."""
    warm = dict(target=lambda b: 0.040 if b == 1 else 0.027 + 0.005 * b, draft=HERE["draft"])
    steady = dict(target=lambda b: 0.028 if b == 1 else 0.027 + 0.005 * b, draft=HERE["draft"])
    assert rate(0.8, warm, best_k(0.8, warm)) > 1.05 * rate(0.8, warm, 0) and best_k(0.8, steady) == 0

    def run(tuning):
        return played_through(warm, steady, 0.8, 2, 3, tuning)

    assert sum(k > 0 for k in run(Tuning())[-200:]) <= 20
    assert sum(k > 0 for k in run(Tuning(reread=10 ** 9, reread_any=10 ** 9))[-200:]) > 150


def test_drafting_long_reads_plain_decoding_again_whatever_the_gain():
    """After a slow phase, where drafting paid 1.3x and more, plain decoding sped up (this Zen 4's fast
    phase) and was never read again: no re-read on a thin margin came, for its price said drafting paid
    2x, and real chat drafted at 0.95x plain. After ``reread_any`` rounds drafted since a plain round was
    timed, one is read whatever the gain, and one well under its price (``reread_again``) is read once
    more at once: a reading moves the price half way. Off, drafting goes on for good."""
    slow = dict(target=lambda b: 0.060 if b == 1 else 0.027 + 0.005 * b, draft=HERE["draft"])
    fast = dict(target=lambda b: 0.020 if b == 1 else 0.027 + 0.005 * b, draft=HERE["draft"])
    assert rate(0.9, slow, best_k(0.9, slow)) > 1.3 * rate(0.9, slow, 0) and best_k(0.9, fast) == 0

    def run(tuning):
        return played_through(slow, fast, 0.9, 3, 40, tuning)

    ks = run(Tuning())
    first = ks.index(0)
    assert Tuning.reread_any - 40 <= first <= Tuning.reread_any and ks[first + 1] == 0  # read, and again
    assert sum(k > 0 for k in ks[-200:]) <= 20
    assert run(Tuning(reread_again=0.0))[first + 1] > 0  # a reading moved the price half way: drafting on
    assert sum(k > 0 for k in run(Tuning(reread_any=10 ** 9))[-200:]) > 150


def test_a_retry_weighs_its_gain_over_plain_decodings_recent_median():
    """A first decode after a prompt reads slow; priced on it, a retry at ``retry_gain`` paid a new
    prompt's catch-up for a draft that could not pay (in the simulator, the fast-phase trace with
    slow one-token forwards after each prompt: 0.907 of the best K, 0.942 so). The plain price
    moves with the reading; a retry's bet is over the median of the last ``plain_reads`` rounds (the
    pace, which every reading moves, moves it a little still)."""
    v = SlotView("greedy", 8, remaining=1000)

    def bets(tuning):
        p = Policy(8, tuning=tuning)
        p.measured("greedy", 0.9, 32)
        p.timed_draft([(1, 0.008), (2, 0.012)])
        for _ in range(15):
            p.round_done([v], [0], Measured(1, 0.010, [], 1, 0.0))
        p.round_done([v], [4], Measured(5, 0.016, [(2, 0.012, 1)] + [(1, 0.008, 1)] * 3, 5, 0.0))
        before = p._best([v], doubt=True)[1]
        p.round_done([v], [0], Measured(1, 0.014, [], 1, 0.0))  # the first decode after a prompt
        assert p.costs.target(1) > 0.0102  # plain decoding is priced as read
        return before, p._best([v], doubt=True)[1]

    (before, median), (same, last) = bets(Tuning()), bets(Tuning(plain_reads=1))
    assert before == pytest.approx(same) and last > 1.05 * median  # the bet is over plain's median, not its last


def test_a_retry_prices_a_catch_up_at_the_fastest_the_draft_read_one():
    """The draft read a prompt fast, then slowed alone for a while: timed so, its catch-up (growing
    with each plain round) priced every retry out. A retry prices a catch-up at the fastest the draft
    read such a length, not at a share of the target's: a draft that reads a long text slower than
    the target (a quantized draft without a fast batch kernel) stays as slow as it read."""
    fast = lambda n: 0.002 + 0.0005 * n  # noqa: E731
    p = Policy(8)
    _timed(p, HERE["target"], fast)
    p.timed_draft([(40, fast(40)), (300, 0.7)])  # a prompt; a long text the draft reads slowly
    view = SlotView("greedy", 8)
    for _ in range(40):  # the draft's forwards alone three times slower
        p.round_done([view], [2], Measured(3, HERE["target"](3), [(2, 3 * fast(2), 1), (1, 3 * fast(1), 1)], 3))
    c = p.costs
    assert c.catch_up(33) > 1.5 * fast(33)  # as timed: the slow spell moved the draft's pace
    assert c.catch_up(33, doubt=True) == pytest.approx(fast(33), rel=0.1)
    assert c.catch_up(300, doubt=True) >= 0.69 > c.doubt * c.target(300)
    assert Policy(8, free_draft=True).costs.catch_up(33, doubt=True) == 0.0  # a lookup's costs nothing


def test_a_lone_sequence_past_its_wait_asks_to_retry_every_recheck_rounds(monkeypatch):
    """Past ``retry`` plain rounds a lone sequence asks whether a retry would pay every ``recheck``
    rounds, not every round: each ask prices every K twice more (0.3 ms of a 15-20 ms plain round
    here, where a draft that does not pay left auto 3% behind k=0). A lookup, whose asks cost
    little, asks every round. An ask neither of whose bets pays makes no usual choice besides."""
    for free, every in ((False, Tuning.recheck), (True, 1)):
        p = Policy(8, free_draft=free)
        _timed(p, HERE["target"], lambda n: 2 * HERE["target"](n))  # a draft dearer than the target
        p.measured("greedy", 0.0, 1000)  # and one that is never right: no retry pays
        asks = []
        real = p._best
        monkeypatch.setattr(p, "_best", lambda views, **kw: (asks.append(kw), real(views, **kw))[1])
        view = SlotView("greedy", 8, remaining=1000)
        for _ in range(Tuning.retry + 40):
            before = len(asks)
            assert p.choose([view]) == [0]
            p.round_done([view], [0], Measured(1, HERE["target"](1)))
            if not free and any(kw.get("optimistic") for kw in asks[before:]):
                assert len(asks) - before == 2, asks[before:]  # both bets, and no usual choice
        retries = sum(1 for kw in asks if kw.get("optimistic"))
        assert retries == len(range(Tuning.retry, Tuning.retry + 40, every)), (free, retries)


def test_a_retry_that_did_not_hold_waits_till_plain_rounds_ran_a_multiple_of_its_cost():
    """A retry pays the draft's catch-up on all it skipped (real chat here: 37 tokens, 106 ms where a
    plain round took 9.5). Where no K paid, retries at doubling waits came once a chat request and cost
    7-15% of it; one that did not hold now waits till what it cost past a plain round is ``retry_share`` of
    what the plain rounds since would have won at the gain it bet on (at most ``retry_max``): a bet on a large
    gain waits less (a draft slow while warming up on Zen 5, where plain decoding was slow too, failed its
    retry and waited 225 rounds at 0.88x the best K). A cheap one doubles its wait as before."""
    view = SlotView("greedy", 8, remaining=1000)

    def wait_after(retry: Measured, bet: float = Tuning.retry_gain) -> int:
        p = Policy(8)
        p.measured("greedy", 0.9, 32)
        for _ in range(8):
            p.round_done([view], [0], Measured(1, 0.010))
        r = p.regime("greedy")
        r.retried, r.bet = 2, bet  # as choose() starts a retry
        p.round_done([view], [retry.target_tokens - 1], retry)
        p.round_done([view], [0], Measured(1, 0.010))  # drafting did not hold
        return r.wait

    costly = Measured(3, 0.013, [(3, 0.012, 1), (1, 0.004, 1)], 3)
    spent = (0.013 + 0.016 - 0.010) / 0.010  # plain rounds past one
    assert wait_after(costly) == pytest.approx(spent / Tuning.retry_share / (Tuning.retry_gain - 1), rel=0.01)
    chat = Measured(9, 0.025, [(40, 0.106, 1)] + [(1, 0.007, 1)] * 7, 9)
    assert wait_after(chat) == Tuning.retry_max
    spent = (0.025 + 0.106 + 0.049 - 0.010) / 0.010
    assert wait_after(chat, 1.6) == pytest.approx(spent / Tuning.retry_share / 0.6, rel=0.01)
    assert wait_after(chat, 1.6) < Tuning.retry_max
    assert wait_after(Measured(2, 0.011, [(1, 0.002, 1)], 2)) == 2 * Tuning.retry


def test_a_draft_known_only_from_a_record_is_asked_about_every_recheck_rounds(monkeypatch):
    """A CLI call whose record and stored price say the draft cannot pay does not measure it, so its
    regime stays unknown (no verdict yet): it rests as a known one does, asking every ``recheck``
    rounds, not every round (every round cost such a call 2% of its time against ``-k 0``)."""
    p = Policy(8, costs={"draft": {"1": 2.0, "2": 2.2}})  # a draft dearer than the target
    p.begin("greedy", record={"accepted": [1.0] * 9, "verified": [10.0] * 9, "total": [1.0, 10.0]})
    asks = []
    real = p._best
    monkeypatch.setattr(p, "_best", lambda views, **kw: (asks.append(kw), real(views, **kw))[1])
    view = SlotView("greedy", 8, remaining=1000)
    for _ in range(Tuning.retry):
        assert p.choose([view]) == [0]
        p.round_done([view], [0], Measured(1, HERE["target"](1)))
    assert not p.regime("greedy").known and len(asks) <= Tuning.recheck + Tuning.retry // Tuning.recheck


def test_explain_says_what_the_choice_rests_on():
    policy = Policy(8)
    assert "no forward timed yet" in policy.explain("greedy")
    policy.measured("greedy", 0.95, 32)
    Player(policy, BOARD, np.random.default_rng(0)).play(0.95, 20)
    line = policy.explain("greedy")
    assert "predicted at" in line and "acceptance" in line and "this process's rounds" in line


def test_a_forward_timed_in_a_busy_spell_does_not_make_drafting_look_boundless():
    """Tried on a busy machine: the one plain round after the prompt timed a
    one-token forward in a spike (here 10x), every round after drafted K=8 and
    never timed one token again, and --stats read "K=8 is predicted at
    49.35x plain decoding". A shorter forward is priced at most ``spike`` of a
    longer one as timed, so no prediction passes (K + 1) x spike."""
    p = Policy(8)
    view = SlotView("greedy", 8)
    p.round_done([view], [0], Measured(1, 0.25))  # 10x the 0.025 it costs
    for _ in range(20):
        p.round_done([view], [8], Measured(9, 0.045, [(2, 0.008, 1)] + [(1, 0.004, 1)] * 7, 9))
    p.measured("greedy", 0.97, 64)
    assert p.costs.target(1) <= Tuning.spike * p.costs.target(9)
    rates = p.rates("greedy")
    assert max(rates) / rates[0] <= 9 * Tuning.spike


def test_each_token_count_is_priced_as_timed_and_follows_the_machines_speed():
    """On Zen 4 a target forward of 1, 2, 5 and 9 tokens took 20.5, 29.0, 36.7
    and 43.7 ms: concave, so a line through the rounds priced K=8 too dear
    (0.944 of the best fixed K in the simulator). Each count is priced as
    timed; one not timed between its timed neighbours; past every count
    timed at the largest (the target: hopeful, one round times it) or on
    the last secant (a draft's catch-up); and every count moves with the
    machine's speed, which any reading moves."""
    pace = [1.0]
    table, draft = Timed(0.06, True, pace), Timed(0.06, False, pace)
    assert table(1) == 1.0 and table(3) == pytest.approx(1.12)  # nothing timed: a unit, the slope guessed
    table.observe(5, 0.0367)
    assert table(1) == pytest.approx(0.0367 / 5)  # below every count timed: in proportion
    assert table(7) == pytest.approx(0.0367 * (1 + 0.06 * 2))  # one count timed: the slope guessed
    for b, ms in ((1, 20.5), (2, 29.0)):
        for _ in range(Tuning.settle):  # read as often as rounds read them
            table.observe(b, ms / 1000)
    assert table(2) == pytest.approx(0.029)
    assert table(3) == pytest.approx(0.029 + (0.0367 - 0.029) / 3)
    assert table(9) == pytest.approx(0.0367)  # past every count timed: the largest's price
    for n, ms in ((1, 9.0), (2, 12.0)):
        draft.observe(n, ms / 1000)
    assert draft(40) == pytest.approx(0.012 + 0.003 * 38)  # a catch-up on the last secant
    assert pace[0] == 1.0  # each count's shape settled on its own readings
    table.observe(1, 0.0205 * 0.8)  # the machine got faster: the price moves half way, 0.9 ...
    assert table(1) == pytest.approx(0.0205 * 0.9)
    assert pace[0] == pytest.approx(0.9 ** 0.5)  # ... and half of that move (in ratio) is the pace's,
    assert table(9) == pytest.approx(0.0367 * 0.9 ** 0.5)  # which the counts not re-timed carry
    assert draft(1) == pytest.approx(0.009 * 0.9 ** 0.5)
    p = Policy(8)
    view = SlotView("greedy", 8)
    for b in (1, 5, 9, 1, 5, 9):
        p.round_done([view], [b - 1], Measured(b, {1: 0.0205, 5: 0.0367, 9: 0.0437}[b], [(1, 0.009, 1)] * (b - 1), b))
    assert p.costs.seconds([view], [0]) == pytest.approx(0.0205, rel=0.02)
    assert p.costs.seconds([view], [8]) == pytest.approx(0.0437 + 8 * 0.009, rel=0.02)


def test_a_count_read_once_is_priced_at_most_on_its_neighbours_line_until_it_settles():
    """A new shape's first forward may build its graph: on Zen 4 a first
    4-token verification read 41 ms where it takes 22, and priced so, short
    lookups never drafted again and ran plain for the rest of the process.
    Until a count has settled it is priced at most on the line through its
    neighbours; then as timed."""
    t = Timed(0.06, True, [1.0])
    for n, ms in ((1, 16.3), (33, 57.0)):
        for _ in range(Tuning.settle):
            t.observe(n, ms / 1000)
    t.observe(4, 0.041)
    line = 0.0163 + (0.057 - 0.0163) * 3 / 32
    assert t(4) == pytest.approx(line)
    for _ in range(Tuning.settle - 1):
        t.observe(4, 0.022)
    assert t(4) == pytest.approx(t.s[4] * t.pace[0]) and t(4) > line  # settled: as timed


def test_a_first_decode_timed_slow_does_not_price_plain_decoding_above_a_batch():
    """After a draft read the prompt, a first one-token forward read 15.5 ms
    where one takes 10; a lone sequence that then drafts K = 1 every round
    never reads one token again, and plain decoding, priced at 15.5, made a
    poor draft's K = 1 look 1.3x where it ran 0.8x. Until the count settles,
    one token is priced at most as the 2-token forwards read since."""
    p = Policy(8)
    view = SlotView("greedy", 8, draft_lag=2, remaining=1000)
    p.round_done([view], [0], Measured(1, 0.0155))
    for _ in range(8):  # K = 1 rounds as timed here: the target's 2 tokens, the Q2_K draft's 2
        p.round_done([view], [1], Measured(2, 0.0117, [(2, 0.0081, 1)], 2, 0.0004))
    assert p.costs.target(1) == pytest.approx(p.costs.target(2))
    c = p.costs  # K = 1 at the Q2_K draft's acceptance on T = 0.8 chat, 0.68: 1.68 tokens a round
    assert 1.68 * c.seconds([view], [0]) / c.seconds([view], [1]) < 1.02  # priced at 15.5 ms: 1.29x
    for _ in range(Tuning.settle):
        p.round_done([view], [0], Measured(1, 0.0100))
    assert p.costs.target(1) < 0.011  # settled: as read


def test_noise_in_one_count_does_not_move_the_others_prices():
    """Plain rounds at four slots read one count (4 tokens) hundreds of times.
    Moving the pace half way to each reading and then that count's shape to
    the reading over the new pace ratcheted: noise alone drove the pace to a
    third and every count not read with it (the drafting rounds' 8 and 12
    tokens, the draft's forwards) to a third of its time, so drafting looked
    nearly free and four slots ran 0.74x their plain decoding. A slow first
    reading (a warm-up) leaves the others' prices too."""
    import random
    rng = random.Random(0)
    pace = [1.0]
    table, draft = Timed(0.06, True, pace), Timed(0.06, False, pace)
    table.observe(8, 0.045)
    draft.observe(8, 0.042)
    table.observe(4, 0.060)  # a first reading, slow
    for _ in range(2000):
        table.observe(4, rng.uniform(0.033, 0.041))
    assert table(4) == pytest.approx(0.035, rel=0.08)  # the count read follows its faster readings ...
    assert table(8) == pytest.approx(0.045, rel=0.1)  # ... the others stay near their own
    assert draft(8) == pytest.approx(0.042, rel=0.1)
    assert table(8) > table(4)


def test_a_round_that_ran_no_forward_times_nothing():
    """A first round whose target already held the prompt and the row after it
    (the prompt's measurement left it so) runs no forward: timed as a
    one-token forward it priced plain decoding at 0.4 ms, and every K looked
    like 0.4x plain until a hundred readings had moved it."""
    p = Policy(8)
    p.round_done([SlotView("greedy", 0, target_lag=0)], [0], Measured(0, 0.0004))
    assert not p.costs.target.s
    p.round_done([SlotView("greedy", 8)], [0], Measured(1, 0.025))
    assert p.costs.target(1) == pytest.approx(0.025)


def test_a_reading_of_no_time_is_not_a_price():
    """A lookup's draft takes no forward: a draft 'forward' of 0 s (or a
    clock too coarse to see one) is no price, and no later reading divides by it."""
    pace = [1.0]
    t = Timed(0.06, False, pace)
    t.observe(2, 0.0)
    t.observe(0, 0.01)
    assert not t.s
    t.observe(2, 0.01)
    t.observe(2, 0.0)
    assert t(2) == pytest.approx(0.01) and pace == [1.0]


def test_a_scan_prices_each_k_as_a_call_does_and_as_the_formula_says():
    """The policy prices a round two ways (a whole ``ks``, and one sequence's
    every K at once): both are the round's seconds as Costs.seconds defines
    them, on rounds of several slots with catch-ups, doubt and extra passes."""
    from specgguf.llama.model import ubatches
    rng = np.random.default_rng(5)
    for trial in range(60):
        costs = Policy(8, ubatches if trial % 2 else None).costs
        for _ in range(int(rng.integers(0, 6))):
            n = int(rng.integers(1, 30))
            costs.observe(Measured(n, 0.02 + 0.001 * n * rng.random(), [(int(rng.integers(1, 9)), 0.005, 1)], n),
                          False, 1)
        views = [SlotView("g", 8, target_lag=int(rng.choice([1, 1, 5])), draft_lag=int(rng.integers(0, 40)),
                          remaining=[None, 3, 100][int(rng.integers(3))], slot=i) for i in range(int(rng.integers(1, 5)))]
        doubt = bool(trial % 3 == 0)
        price = costs.pricer(views, doubt)
        ks = [int(k) for k in rng.integers(0, 9, len(views))]
        i = int(rng.integers(len(views)))
        for k, seconds in enumerate(price.scan(ks, i, 8)):
            each = ks[:i] + [k] + ks[i + 1:]
            assert seconds == pytest.approx(price(each), rel=1e-12)
            assert seconds == pytest.approx(formula(costs, views, each, doubt), rel=1e-12)


def formula(costs, views, ks, doubt):
    """Costs.seconds written out: the target's passes, the draft's first forward over each drafting
    sequence's steady lag, one forward per further position, each catch-up over the tokens left;
    past the largest count timed the target's forward is flat for a lone sequence only."""
    t = costs.target(max(1, sum(v.target_lag for v in views) + sum(ks)), len(views) == 1)
    t += (costs.passes(views, ks) - 1) * costs.target(1)
    drafting = [(v, k) for v, k in zip(views, ks) if k]
    if not drafting:
        return t
    steady = [min(max(1, v.draft_lag), costs.steady) for v, _ in drafting]
    t += costs.draft_forward(sum(steady), doubt)
    t += sum(costs.draft_forward(sum(k >= j for _, k in drafting), doubt) for j in range(2, max(ks) + 1))
    for (v, _), s in zip(drafting, steady):
        t += max(0.0, costs.catch_up(v.draft_lag, doubt) - costs.catch_up(s, doubt)) / max(1, v.remaining or 128)
    return t


def _timed(p, target, draft, lags=(2,)):
    """Rounds of 1..9 target tokens and their draft forwards, timed as ``target`` and ``draft`` say."""
    view = SlotView("greedy", 8)
    for lag in lags:
        for n in range(1, 10):
            forwards = [(lag, draft(lag), 1)] + [(1, draft(1), 1)] * (n - 2) if n > 1 else []
            p.round_done([view], [n - 1], Measured(n, target(n), forwards, n, 0.0))


def test_a_catch_up_is_paid_once_for_the_tokens_left():
    """A catch-up of C seconds buys drafting for the n tokens left: over them it
    runs at E / (s + C E / n), so each drafted token is worth 1 - rate C / n of
    one. Priced per round (C / n a round, as if a round gave one token), a
    300-token catch-up looked 8x cheaper, and first code edits paid it for
    answers plain decoding gave sooner. The tokens left are what recent
    answers suggest: code edits ended at 80 of a 128-token budget."""
    target = lambda n: 0.025 + 0.003 * n  # noqa: E731
    draft = lambda n: 0.010 + 0.003 * n  # noqa: E731  (300 tokens: 0.91 s, as a quantized draft here)
    p = Policy(8)
    _timed(p, target, draft, lags=(2, 300))
    p.measured("greedy", 0.95, 1000)
    behind = SlotView("greedy", 8, draft_lag=300, remaining=100)
    # Drafting K=5 at 0.95: 5.3 tokens a 0.111 s round (47.7 tokens/s); plain decoding 1 in 0.028
    # (35.7). Over 100 tokens the 0.89 s catch-up makes it 100 / (0.89 + 100 / 47.7) = 33.5 tokens/s;
    # priced per round (8.9 ms) it looked 44.
    assert p.choose([behind]) == [0]
    assert p.choose([replace(behind, remaining=2000)])[0] > 0  # over 2000 tokens it pays
    for _ in range(3):
        p.ended(100, at_budget=False)  # ... unless answers end long before their budget
    assert p.left(replace(behind, remaining=2000)) == 100
    assert p.choose([replace(behind, remaining=2000)]) == [0]
    assert p.left(replace(behind, remaining=2000, emitted=150)) == 2000  # longer than any: all it may
    p.ended(400, at_budget=True)  # a budget cut it: it would have gone on
    assert p.left(replace(behind, remaining=2000)) == round((3 * 100 + 2000) / 4)
    assert p.choose([SlotView("greedy", 8, remaining=127)])[0] > 0  # no catch-up: it drafts as ever


def test_a_prompt_beside_others_is_measured_only_where_a_good_draft_pays_in_that_batch():
    """Guessed prices said a good draft pays at every load, so each fresh
    server at 4-8 slots had the draft read a prompt (0.25 s on Zen 4) it would
    never draft on. Beside others the draft is measured on a prompt only once
    rounds were timed, and only if drafting would pay in that batch were the
    draft good; alone, as before."""
    prompt = SlotView("greedy", 8, target_lag=40, draft_lag=40, remaining=127)
    others = [SlotView("greedy", 8, slot=i, remaining=100) for i in range(1, 4)]

    def timed(target, draft):
        p = Policy(8)
        for n in (1, 4, 8, 16, 36):
            for _ in range(3):
                p.costs.target.observe(n, target(n))
        for n in (1, 2, 4, 8, 40):
            p.costs.draft.observe(n, draft(n))
        return p

    fresh = Policy(8)
    assert fresh.worth_measuring(prompt) and not fresh.worth_measuring(prompt, others)
    here = timed(lambda n: 0.015 + 0.0015 * n, lambda n: 0.003 * n)  # pays alone, not beside three
    assert here.worth_measuring(prompt) and not here.worth_measuring(prompt, others)
    board = timed(lambda n: 0.1 * (1 + 0.01 * n), lambda n: 0.005 * (1 + 0.1 * n))  # memory-bound: batches cheap
    assert board.worth_measuring(prompt, others)


def test_a_long_catch_up_is_priced_on_timed_batches_not_on_a_guess():
    """Guessed, a quantized draft's 345-token batch cost 54 ms where it took a
    second, and a first code edit paid it. Before a long catch-up is first
    priced, the rounds time two draft forwards on the prompt's head (which the
    draft keeps); until then the draft is not measured on that prompt nor run
    on it; a chat prompt is measured as before."""
    p = Policy(8)
    long = SlotView("greedy", 8, target_lag=345, draft_lag=345, remaining=127)
    assert p.batches_to_time(long) == () and not p.worth_measuring(long)  # nothing timed: prices are relative
    assert p.worth_measuring(SlotView("greedy", 8, target_lag=40, draft_lag=40, remaining=127))
    p.round_done([SlotView("greedy", 8)], [0], Measured(1, 0.025))
    p.measured("greedy", 0.95, 1000)
    assert p.batches_to_time(long) == Tuning.batch_timing
    assert p.choose([replace(long, target_lag=1)]) == [0]  # not run on a guessed catch-up
    assert p.batches_to_time(replace(long, remaining=20)) == ()  # fewer tokens left than the timing reads
    p.timed_draft([(1, 0.012), (31, 0.110)])
    assert p.batches_to_time(long) == ()
    assert p.costs.draft(345) == pytest.approx(0.110 + 314 * 0.098 / 30, rel=0.01)  # on the line through them


def test_a_draft_timed_in_a_busy_spell_before_it_ever_drafted_is_tried_again():
    """Its batches timed on a prompt's head while the machine was busy (3x),
    a draft whose acceptance was never measured looked too slow to probe, and
    was never run (nor timed) again: a process drafted nothing all day. A lone
    sequence that has not drafted for ``retry`` rounds probes at a doubted
    price, as a known draft retries, and the draft's timings are read anew."""
    p = Policy(8)
    view = SlotView("greedy", 8, draft_lag=2, remaining=1000)
    p.round_done([view], [0], Measured(1, 0.025))
    p.timed_draft([(1, 3 * 0.013), (31, 3 * 0.101)])  # timed busy: slower than the target
    assert p.choose([view]) == [0] and not p.regime("greedy").known
    ks = []
    for _ in range(Tuning.retry + 1):
        ks.append(p.choose([view])[0])
        p.round_done([view], [ks[-1]], Measured(1 + ks[-1], 0.025))
    assert ks[-1] > 0 and not p.costs.draft.s  # a probe, its timings dropped to be read again


def test_beside_other_sequences_no_forward_is_priced_hopefully_and_every_round_is_timed():
    """Past the largest count timed, a lone sequence's target forward is priced
    flat (hopeful: the round that tries it times it); beside others it rises at
    the slope guessed (a failed hope is paid by every slot). A round of several
    passes (a KV stream per slot) is timed too, as priced: one pass over its
    tokens and a token's per further pass; left untimed, its hopeful price was
    never corrected."""
    p = Policy(passes=lambda counts: 2 if max(n for _, n in counts) > 5 else 1)
    _timed(p, lambda n: 0.02 + 0.002 * n, lambda n: 0.005 * n)  # one sequence, counts 1..9
    c, nine = p.costs, p.costs.target(9)
    assert c.target(20) == pytest.approx(nine)
    assert c.target(20, False) == pytest.approx(nine * (1 + p.t.slope_guess * 11))
    four = [SlotView("greedy", 8, draft_lag=1, slot=i, remaining=100) for i in range(4)]
    assert c.seconds(four, [4, 4, 4, 4]) > c.seconds(four[:1], [4]) + c.target(20, False) - c.target(5)
    one = c.target(1)
    p.round_done(four, [5, 5, 5, 5], Measured(24, 0.3, [], 24, 0.0))  # 6 tokens a slot: two passes
    assert c.target(24) == pytest.approx(0.3 - one) and c.target(24, False) == pytest.approx(0.3 - one)


def test_a_batch_that_drafted_nothing_asks_again_every_recheck_rounds():
    """Where the draft does not pay, the choice over a batch is what it costs
    (2.5% of a round at 8 slots): a batch of a known regime that chose to draft
    nothing keeps that for ``recheck`` - 1 rounds, then asks again. A lone
    sequence asks every round until ``recheck`` rounds in a row chose nothing
    (a plain round after a miss is often one), then as a batch does (a poor
    draft's choice took 0.13 ms of a 9 ms round here)."""
    p = Policy(8)
    _timed(p, BOARD["target"], BOARD["draft"])
    p.measured("greedy", 0.05, 32)  # a draft nearly always wrong: nothing pays
    four = [SlotView("greedy", 8, draft_lag=1, slot=i, remaining=500) for i in range(4)]
    assert p.choose(four) == [0] * 4
    p.measured("greedy", 0.99, 640)  # now it would pay on this board
    chosen = [p.choose(four) for _ in range(p.t.recheck)]
    assert chosen[:-1] == [[0] * 4] * (p.t.recheck - 1)  # resting
    assert all(chosen[-1])  # the recheck sees it
    lone = Policy(8)
    _timed(lone, BOARD["target"], BOARD["draft"])
    lone.measured("greedy", 0.05, 32)
    assert lone.choose(four[:1]) == [0]
    lone.measured("greedy", 0.99, 640)
    assert lone.choose(four[:1])[0] > 0  # one plain choice: it asks again at once
    lone = Policy(8)
    _timed(lone, BOARD["target"], BOARD["draft"])
    lone.measured("greedy", 0.05, 32)
    assert [lone.choose(four[:1]) for _ in range(p.t.recheck + 1)] == [[0]] * (p.t.recheck + 1)
    lone.measured("greedy", 0.99, 640)
    chosen = [lone.choose(four[:1])[0] for _ in range(p.t.recheck)]
    assert chosen[:-1] == [0] * (p.t.recheck - 1) and chosen[-1] > 0  # resting, then the recheck


def test_a_retry_bets_on_acceptance_not_on_the_flat_price_of_an_untimed_batch():
    """A lookup that verdicts on two positions made optimistic retries a whole
    copy at a time: on seeded T = 0.8 chat, K = 27 priced as the 4-token batch,
    the longest timed (a 28-token batch costs 3x that). A retry prices batches
    longer than any timed at the slope guessed; a steady choice still hopes, so
    that one round times them (revisions replayed 7% slower without it)."""
    p = Policy(32, free_draft=True)
    view = SlotView("greedy", 27, remaining=1000)
    for n in (1, 2, 4) * 4:
        p.round_done([view], [n - 1], Measured(n, HERE["target"](n), (), n, 0.0))
    p.observe("greedy", 2, 1)  # one verdict: half of two tokens kept
    for _ in range(Tuning.retry):
        p.round_done([view], [0], Measured(1, HERE["target"](1), (), 1, 0.0))
    assert 0 < p.choose([view])[0] <= 8  # retried, without betting the copy on an unpriced batch
    assert p.costs.pricer([view], hope=False)([27]) > 2 * p.costs.pricer([view])([27])
