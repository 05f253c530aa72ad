"""SpeculativeDecoder with toy callbacks: greedy exactness, limits, stats, errors."""

import numpy as np
import pytest

import specgguf
from specgguf.ops.drafter import CallbackDrafter
from specgguf.engine.policy import Policy

V = 64


def toy_logits(seq):
    """A deterministic 'target model': logits from a hash of the last 3 tokens."""
    rng = np.random.default_rng(hash(tuple(seq[-3:])) % (2**32))
    return rng.standard_normal(V).astype(np.float32)


def target_step(prefix, proposed):
    seq = prefix + proposed
    return np.stack([toy_logits(seq[: len(prefix) + i]) for i in range(len(proposed) + 1)])


def make_draft(agree):
    """Greedy draft agreeing with the target's argmax with probability `agree`."""
    rng = np.random.default_rng(0)

    def draft_step(prefix, k):
        seq, toks = list(prefix), []
        for _ in range(k):
            t = int(np.argmax(toy_logits(seq))) if rng.random() < agree else int(rng.integers(V))
            toks.append(t)
            seq.append(t)
        return toks, None
    return draft_step


def plain_greedy(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(toy_logits(seq))))
    return seq[len(prompt):]


@pytest.mark.parametrize("agree,k", [(1.0, 4), (0.7, 4), (0.0, 3), (0.5, 1), (0.9, 0), (0.8, 8)])
def test_greedy_equals_plain_target_decoding(agree, k):
    prompt = [1, 2, 3]
    dec = specgguf.SpeculativeDecoder(make_draft(agree), target_step, k=k, greedy=True)
    for max_new in (1, 7, 50):
        assert dec.generate(prompt, max_new=max_new) == plain_greedy(prompt, max_new)
        assert dec.stats.emitted == max_new and dec.stats.finish_reason == "length"


def test_stop_token_inside_accepted_block():
    prompt = [5, 6]
    ref = plain_greedy(prompt, 40)
    stop = ref[10]
    first = ref.index(stop)
    dec = specgguf.SpeculativeDecoder(make_draft(1.0), target_step, k=8)
    out = dec.generate(prompt, max_new=40, stop_tokens=[stop])
    assert out == ref[: first + 1]
    assert dec.stats.finish_reason == "stop"


def test_stream_yields_tokens_as_generate():
    dec = specgguf.SpeculativeDecoder(make_draft(0.8), target_step, k=4)
    assert list(dec.stream([9], max_new=20)) == plain_greedy([9], 20)


def test_stats():
    dec = specgguf.SpeculativeDecoder(make_draft(1.0), target_step, k=4)
    dec.generate([1], max_new=20)
    s = dec.stats
    # A perfect draft: every round accepts all it drafted and emits k+1.
    assert s.drafted == s.accepted and s.acceptance_rate == 1.0
    assert s.rounds == 4 and s.accepted_hist == [0, 0, 0, 0, 4]
    assert s.position_acceptance == [1.0] * 4
    assert s.mean_accepted == 4.0
    dec = specgguf.SpeculativeDecoder(make_draft(0.0), target_step, k=2)
    dec.generate([1], max_new=10)
    s = dec.stats
    assert sum(s.accepted_hist) == s.rounds and s.accepted_hist[0] > 0
    assert s.drafted == sum(s.position_drafted) and s.accepted == sum(s.position_accepted)
    assert s.as_dict()["rounds"] == s.rounds


def test_callback_errors_are_clear():
    good_draft = make_draft(1.0)
    with pytest.raises(ValueError, match="more than the k"):
        specgguf.SpeculativeDecoder(lambda p, k: ([1] * (k + 1), None), target_step).generate([1], 5)
    with pytest.raises(TypeError, match=r"\(tokens, probs\) or \(tokens, probs, info\) tuple"):
        specgguf.SpeculativeDecoder(lambda p, k: [1] * k, target_step).generate([1], 5)
    with pytest.raises(TypeError, match="not a sequence of ints"):
        specgguf.SpeculativeDecoder(lambda p, k: (["a"] * k, None), target_step).generate([1], 5)
    with pytest.raises(ValueError, match="target_step returned shape"):
        specgguf.SpeculativeDecoder(good_draft, lambda p, d: np.zeros((1, V))).generate([1], 5)
    with pytest.raises(ValueError, match="probs=None"):
        specgguf.SpeculativeDecoder(good_draft, target_step, greedy=False).generate([1], 5)
    with pytest.raises(ValueError, match="probs of shape"):
        specgguf.SpeculativeDecoder(lambda p, k: ([1] * k, np.ones((1, V))), target_step,
                                    greedy=False).generate([1], 5)
    with pytest.raises(ValueError, match="prompt_ids"):
        specgguf.SpeculativeDecoder(good_draft, target_step).generate([], 5)
    with pytest.raises(ValueError, match="k must be >= 0"):
        specgguf.SpeculativeDecoder(good_draft, target_step, k=-1)
    with pytest.raises(TypeError, match="k must be an int"):
        specgguf.SpeculativeDecoder(good_draft, target_step, k=2.5)
    with pytest.raises(ValueError, match="max_new"):
        specgguf.SpeculativeDecoder(good_draft, target_step).generate([1], -1)
    with pytest.raises(TypeError, match="generator"):
        specgguf.SpeculativeDecoder(good_draft, target_step, generator="seed")


def test_policy_is_told_what_remains_and_what_the_draft_has_not_seen():
    """The draft catches up on tokens it skipped; the policy weighs that
    against what is left, so the decoder must report both exactly."""
    schedule = [4, 4, 0, 0, 4, 3, 0, 2]

    class Recording(Policy):
        def __init__(self):
            super().__init__(8)
            self.calls, self.rounds = [], []

        def choose(self, slots):
            k = schedule[len(self.calls) % len(schedule)]
            self.calls.append((slots[0].remaining, slots[0].draft_lag))
            return [min(k, slots[0].cap)]

        def observe(self, regime, drafted, accepted, *args):
            self.rounds.append((drafted, accepted))

    prompt = [1, 2, 3, 4, 5, 6, 7]
    policy = Recording()
    dec = specgguf.SpeculativeDecoder(make_draft(0.6), target_step, k=policy, greedy=True)
    assert dec.generate(prompt, max_new=30) == plain_greedy(prompt, 30)
    emitted, seen = 0, 0
    for (remaining, skipped), (k, n) in zip(policy.calls, policy.rounds):
        assert remaining == 30 - emitted
        assert skipped == len(prompt) + emitted - seen
        if k > 0:  # it evaluated prefix + its first k - 1 proposals; the kept ones stay valid
            seen = len(prompt) + emitted + min(n, k - 1)
        emitted += n + 1
    assert policy.calls[0][1] == len(prompt)  # the first round: the whole prompt is unseen
    assert policy.calls[1][1] in (1, 2)       # right after a drafting round
    assert policy.calls[4][1] >= 3            # after two plain rounds the lag has grown


def test_a_drafts_read_back_and_its_forwards_reach_the_policy():
    """What a drafter read back while catching up (Draft.catchup) is handed
    to the policy with the round it belongs to, and each round's forwards
    as the policy prices rounds (a drafter that does not time its own: its
    time shared among its tokens, the first over its lag)."""
    class ReadingBack(CallbackDrafter):
        def propose(self, context, k, p_min=None):
            lag = self.lag(context)
            draft = super().propose(context, k, p_min)
            draft.catchup = (0.5 * lag, lag) if lag > 2 else None
            return draft

    class Recording(Policy):
        def __init__(self):
            super().__init__(8)
            self.lags, self.forwards = [], []

        def choose(self, slots):
            self.lags.append(slots[0].draft_lag)
            return [min(slots[0].cap, [0, 0, 0, 3, 3][len(self.lags) % 5])]

        def round_done(self, slots, ks, m):
            self.forwards.append((ks[0], [n for n, _, _ in m.draft_forwards]))
            super().round_done(slots, ks, m)

    policy = Recording()
    regime, read = policy.regime("greedy"), []
    skipped = regime.read_back
    regime.read_back = lambda a, n: (read.append((a, n)), skipped(a, n))
    dec = specgguf.SpeculativeDecoder(ReadingBack(make_draft(0.6)), target_step, k=policy, regime="greedy")
    dec.generate([1, 2, 3], max_new=20)
    drafted = [(lag, k, f) for lag, (k, f) in zip(policy.lags, policy.forwards) if k]
    assert drafted and all(f == [lag] + [1] * (k - 1) for lag, k, f in drafted)
    assert read == [(0.5 * lag, lag) for lag, _, _ in drafted if lag > 2] and read


def test_the_callback_decoder_needs_no_llama_cpp():
    """The decoder over callbacks is the package's core: it must run where
    llama-cpp-python is not installed (the aarch64 job runs these tests so).
    A module on its import path that imports llama_cpp breaks that.

    Where llama_cpp is installed, a child process blocks it and imports the
    decoder; where it is not (the aarch64 job, under qemu-user, which cannot
    start a child interpreter), this process itself is the proof."""
    import importlib.util
    import subprocess
    import sys
    code = ("import specgguf\n"
            "specgguf.SpeculativeDecoder(lambda p, k: ([], None), lambda p, d: None, k=2, greedy=True)\n"
            "import specgguf.engine.rounds, specgguf.engine.decoder, specgguf.ops.drafter\n")
    if importlib.util.find_spec("llama_cpp") is None:
        exec(code, {})
        return
    blocked = "import sys; sys.modules['llama_cpp'] = None\n" + code
    run = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
