"""Model-free n-gram drafting: proposals, and exactness through the decoder."""

import numpy as np

import specgguf
from specgguf.ngram import FallbackDraft, NgramDraft
from tests.test_verify_law import ALPHA, chi2_pvalue


def test_proposes_the_continuation_of_a_repeated_passage():
    passage = [11, 12, 13, 14, 15, 16, 17, 18]
    d = NgramDraft()
    toks, probs, info = d.draft_step([1, 2] + passage + [3, 4] + passage[:3], 4)
    assert toks == passage[3:7] and probs is None and info["onehot"] and info["stop"] == "max"
    # Incremental: the context grows by what was accepted; the latest match wins.
    toks, _, _ = d.draft_step([1, 2] + passage + [3, 4] + passage[:3] + [14, 99, 11, 12], 3)
    assert toks == [13, 14, 99]
    toks, _, info = d.draft_step([5, 6, 7], 4)  # a new context, no repeat: nothing
    assert toks == [] and info["stop"] == "end"
    toks, _, info = d.draft_step([1, 2, 3, 1, 2], 8)  # the continuation runs out: "end"
    assert toks == [3, 1, 2] and info["stop"] == "end"


def test_fallback_uses_the_model_only_without_a_match():
    calls = []

    def model(prefix, k, p_min=None):
        calls.append(k)
        return [0] * k, None, {"stop": "max"}

    d = FallbackDraft(NgramDraft().draft_step, model).draft_step
    assert d([1, 2, 3, 1, 2], 2)[0] == [3, 1] and calls == []
    assert d([1, 2, 3, 4], 2)[0] == [0, 0] and calls == [2]


def test_ngram_draft_is_exact_through_the_decoder():
    """A repetitive Markov target drafted by n-gram lookup (one-hot proposals,
    verified by accept_onehot): emitted sequences follow the target's law."""
    T = np.array([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.7, 0.2, 0.1]], np.float32)

    def target_step(prefix, proposed):
        return T[(prefix + proposed)[len(prefix) - 1:]]

    dec = specgguf.SpeculativeDecoder(NgramDraft(n_min=1).draft_step, target_step, k=3,
                                      greedy=False, generator=7)
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
