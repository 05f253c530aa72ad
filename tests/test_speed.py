"""The bench command's arithmetic (specgguf.cli.bench), on stats with known answers."""

import pytest

from specgguf.engine.stats import DecoderStats
from specgguf.engine.acceptance import expected_tokens
from specgguf.cli.bench import Report, Runs, fixed_k_ceiling, position_rates


def stats_of(rounds, seconds_per_round, draft_per_round=0.0):
    """DecoderStats.as_dict() of rounds given as (drafted, accepted), each
    round's forwards timed as given; the first round is plain and reads the prompt."""
    s = DecoderStats()
    s.record(0, 0)
    for drafted, accepted in rounds:
        s.record(drafted, accepted)
    s.first_target_seconds = 0.5
    s.target_seconds = 0.5 + seconds_per_round * len(rounds)
    s.draft_seconds = draft_per_round * len(rounds)
    out = s.as_dict()
    n = 1 + sum(a + 1 for _, a in rounds)
    out.update(completion_tokens=n, seconds=s.target_seconds + s.draft_seconds)
    return out


def test_the_ceiling_is_what_rounds_delivered_over_their_forwards():
    """Bursty acceptance (rounds accept all or stop at once): E(K) from the
    per-position rates equals the tokens rounds delivered, where one
    per-token rate would understate a long K."""
    rounds = [(4, 4)] * 6 + [(4, 0)] * 4  # 6 rounds deliver 5, 4 deliver 1
    k4 = stats_of(rounds, 0.060, 0.040)
    plain = stats_of([(0, 0)] * 10, 0.030)
    assert position_rates([k4], 4) == pytest.approx([0.6, 1.0, 1.0, 1.0])
    delivered = (6 * 5 + 4 * 1) / 10
    assert expected_tokens(4, position_rates([k4], 4))[4] == pytest.approx(delivered)
    assert fixed_k_ceiling([k4], [plain], 4) == pytest.approx(delivered * 0.030 / 0.100)


def test_the_report_recommends_the_fastest_fixed_k_and_says_when_it_is_noise():
    runs = {k: Runs(k) for k in (0, 2, 4, "auto")}
    for k, per_turn in ((0, [30.0, 31.0]), (2, [33.0, 34.0]), (4, [40.0, 41.0]), ("auto", [38.0, 39.0])):
        runs[k].per_turn = per_turn
        runs[k].stats = [stats_of([(3, 1) if k == "auto" else (k, min(k, 1))] * 5, 0.03)]
    report = Report.of(runs)
    assert report.best_fixed() == 4 and report.recommendation().startswith("recommended: -k 4 (1.33x")
    assert "k=auto, the default, ran at 1.26x" in report.recommendation()
    runs[4].per_turn, runs[2].per_turn = [30.0, 31.2], [20.0, 20.0]
    assert "within the noise" in Report.of(runs).recommendation()
    runs[4].per_turn = [20.0, 20.0]
    assert "no drafting (-k 0)" in Report.of(runs).recommendation()
    assert len(Report.of(runs).table()) == 1 + len(runs)
