"""Model-free n-gram drafting: proposals, exactness through the decoder, and
a lookup in front of a model drafter (each with its own K and policy)."""

import time

import numpy as np
import pytest

import specgguf
from specgguf.ops.drafter import CallbackDrafter, Draft
from specgguf.engine.draft_length import FixedK
from specgguf.engine.lookup_first import LookupFirst, next_turn
from specgguf.engine.policy import Policy, SlotView
from specgguf.ops.ngram import NgramDrafter
from tests.conftest import ALPHA, chi2_pvalue


def test_proposes_the_continuation_of_a_repeated_passage():
    passage = [11, 12, 13, 14, 15, 16, 17, 18]
    d = NgramDrafter()
    draft = d.propose([1, 2] + passage + [3, 4] + passage[:3], 4)
    assert draft.tokens == passage[3:7] and draft.probs is None and draft.onehot and draft.stop == "max"
    # Incremental: the context grows by what was accepted; the latest match wins.
    assert d.propose([1, 2] + passage + [3, 4] + passage[:3] + [14, 99, 11, 12], 3).tokens == [13, 14, 99]
    draft = d.propose([5, 6, 7], 4)  # a new context, no repeat: nothing
    assert draft.tokens == [] and draft.stop == "end"
    draft = d.propose([1, 2, 3, 1, 2], 8)  # the continuation runs out: "end"
    assert draft.tokens == [3, 1, 2] and draft.stop == "end"
    assert d.lag([1, 2, 3]) == 0


VIEW = SlotView("greedy", 10, fixed=True, remaining=10)  # a sequence with room for 10 draft tokens


class CountingModel:
    """A model-like drafter that records its calls and keeps an exact lag."""

    def __init__(self):
        self.calls, self.seen = [], []

    def lag(self, context):
        n = 0
        while n < min(len(self.seen), len(context)) and self.seen[n] == context[n]:
            n += 1
        return len(context) - n

    def propose(self, context, k, p_min=None):
        self.calls.append(k)
        self.seen = list(context) + [0] * (k - 1)  # it evaluated the context and its first k - 1
        return Draft([0] * k, stop="max")


def test_the_lookup_drafts_only_with_a_match_and_its_own_k():
    model = CountingModel()
    lookup = LookupFirst(NgramDrafter(), FixedK(2))
    turn = next_turn([1, 2, 3, 1, 2], VIEW, model, FixedK(4), lookup)
    assert turn.drafter is lookup.lookup and turn.k == 2
    assert turn.drafter.propose([1, 2, 3, 1, 2], turn.k).tokens == [3, 1] and model.calls == []
    turn = next_turn([1, 2, 3, 4], VIEW, model, FixedK(4), lookup)  # no match: the model's turn, its own K
    assert turn.drafter is model and turn.k == 4
    assert next_turn([1, 2, 3, 1, 2], VIEW, model, FixedK(4), LookupFirst(NgramDrafter(), FixedK(0))).drafter is model


def test_the_models_lag_grows_while_the_lookup_drafts():
    """The draft's position behind the text is the model's own, whichever
    drafter proposed: after lookup rounds the model has evaluated nothing
    more, so its lag grows by every token emitted meanwhile, and its policy
    weighs that catch-up (the old decoder counted the lookup's proposal as
    the model's)."""
    model = CountingModel()
    lookup = LookupFirst(NgramDrafter(), FixedK(3))
    ctx = [5, 6, 7, 8]
    turn = next_turn(ctx, VIEW, model, FixedK(3), lookup)
    turn.drafter.propose(ctx, turn.k)  # no match: the model drafts and evaluates ctx + 2 tokens
    ctx = ctx + [0, 0, 9]  # two accepted, then a correction
    assert model.lag(ctx) == 1
    ctx = ctx + [5, 6, 7]  # ... the text repeats: the lookup proposes from now on
    turn = next_turn(ctx, VIEW, model, FixedK(3), lookup)
    assert turn.drafter.propose(ctx, turn.k).tokens == [8, 0, 0] and model.calls == [3]
    ctx = ctx + [8, 0, 0, 9]
    assert model.lag(ctx) == 1 + 3 + 4  # the model saw none of it


def test_lookup_rounds_and_model_rounds_teach_their_own_policies():
    """Greedy over a target that repeats one passage, drafted by a lookup
    (which copies it: always accepted) in front of a model that proposes a
    wrong token every time: the lookup's policy learns acceptance 1 from
    its rounds only, the model's learns 0 from its own, and plain rounds
    time plain decoding for both. Pooled, one policy read the mixture (and
    stored it as the model's)."""
    passage = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]

    def target_step(prefix, proposed):
        # A forward's cost as a real target's (1 ms, +10% a token): timed in microseconds of
        # Python, a pause of the process could price the lookup's rounds out (1 run in 25 did).
        time.sleep(0.001 * (1 + 0.1 * len(proposed)))
        rows = np.zeros((len(proposed) + 1, 32), np.float32)
        for i, ctx in enumerate(prefix[-1:] + proposed):
            nxt = passage[(passage.index(ctx) + 1) % len(passage)] if ctx in passage else passage[0]
            rows[i, nxt] = 1.0
        return rows

    model = CallbackDrafter(lambda prefix, k: ([31] * k, None))
    model_policy = Policy(8)
    lookup = LookupFirst(NgramDrafter(n_min=2), Policy(8, free_draft=True))
    model_policy.measured("greedy", 0.9, 32)  # make the model draft at first: it is wrong every time
    model_acc0 = model_policy.regime("greedy").total[0]
    dec = specgguf.SpeculativeDecoder(model, target_step, k=model_policy, lookup=lookup, regime="greedy")
    out = dec.generate([1, 2], 120)
    assert out == [passage[i % 10] for i in range(120)]  # exact: greedy target decoding
    look_acc, look_ver = lookup.length.regime("greedy").total
    assert look_ver > 50 and look_acc == pytest.approx(look_ver)  # every lookup token was the passage's
    assert model_policy.regimes["greedy"].seen > 32  # the model drafted too ...
    assert model_policy.regime("greedy").total[0] < 0.5 * model_acc0  # ... and was wrong every time
    assert lookup.length.costs.target.s and model_policy.costs.target.s  # both timed plain rounds


def test_ngram_draft_is_exact_through_the_decoder():
    """A repetitive Markov target drafted by n-gram lookup (one-hot proposals,
    verified by accept_onehot): emitted sequences follow the target's law."""
    T = np.array([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.7, 0.2, 0.1]], np.float32)

    def target_step(prefix, proposed):
        return T[(prefix + proposed)[len(prefix) - 1:]]

    dec = specgguf.SpeculativeDecoder(NgramDrafter(n_min=1), target_step, k=3, greedy=False, generator=7)
    prompt, length = [0, 1, 2, 0, 1, 2, 0], 4
    counts = np.zeros(3**length)
    drafted = 0
    for _ in range(12000):
        out = dec.generate(prompt, max_new=length)
        drafted += dec.stats.drafted
        counts[sum(t * 3**i for i, t in enumerate(out))] += 1
    law = np.zeros(3**length)
    for code in range(3**length):
        seq = [prompt[-1]] + [(code // 3**i) % 3 for i in range(length)]
        law[code] = np.prod([T[a, b] for a, b in zip(seq, seq[1:])])
    assert drafted > 10000  # the lookup really proposed
    assert chi2_pvalue(counts, law) > ALPHA


def test_callback_drafter_infers_its_lag_from_the_next_context():
    d = CallbackDrafter(lambda prefix, k: ([7] * k, None))
    assert d.lag([1, 2, 3]) == 3  # nothing evaluated yet
    d.propose([1, 2, 3], 4)  # evaluated [1, 2, 3, 7, 7, 7]
    assert d.lag([1, 2, 3, 7, 7, 9]) == 1  # two accepted, then a correction
    assert d.lag([1, 2, 3, 7, 7, 7, 7, 5]) == 2  # all four accepted, then a bonus
