"""Model-free n-gram drafting: proposals, exactness through the decoder, and
the fallback drafter's lag."""

import numpy as np

import specgguf
from specgguf.ops.drafter import CallbackDrafter, Draft
from specgguf.ops.ngram import FallbackDrafter, NgramDrafter
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


def test_fallback_uses_the_model_only_without_a_match():
    model = CountingModel()
    d = FallbackDrafter(NgramDrafter(), model)
    assert d.propose([1, 2, 3, 1, 2], 2).tokens == [3, 1] and model.calls == []
    assert d.propose([1, 2, 3, 4], 2).tokens == [0, 0] and model.calls == [2]


def test_fallback_lag_is_the_models_own():
    """The draft's position behind the text is the model's, whichever drafter
    proposed: after an n-gram proposal the model has evaluated nothing more,
    so its lag grows by every token emitted meanwhile (the old decoder counted
    the n-gram's proposal as the model's)."""
    model = CountingModel()
    d = FallbackDrafter(NgramDrafter(), model)
    ctx = [5, 6, 7, 8]
    d.propose(ctx, 3)  # no match: the model drafts and evaluates ctx + 2 tokens
    ctx = ctx + [0, 0, 9]  # two accepted, then a correction
    assert d.lag(ctx) == 1
    ctx = ctx + [5, 6, 7]  # ... the text repeats: the lookup proposes from now on
    assert d.propose(ctx, 3).tokens == [8, 0, 0] and model.calls == [3]
    ctx = ctx + [8, 0, 0, 9]
    assert d.lag(ctx) == 1 + 3 + 4  # the model saw none of it


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
