"""The ops against the analytic law of speculative sampling (chi-square, fixed seeds).

With stationary p, q and a = sum(min(p, q)), the accepted length n of a round
with K drafts follows P(n = j) = a^j (1 - a) for j < K and P(n = K) = a^K, and
every emitted token follows p. Each test also checks that it has the power to
reject a wrong law, so it cannot pass vacuously.
"""

import zlib

import numpy as np
import pytest
import specgguf
from tests.conftest import ALPHA, chi2_pvalue


def normalize(x):
    x = np.asarray(x, np.float64)
    return x / x.sum()


def run_rounds(p, q, k, n_rounds, seed):
    """n_rounds of accept() with K draft tokens drawn from q each round.
    Returns (accepted lengths, first emitted tokens)."""
    rng = np.random.default_rng(seed)
    cq = np.cumsum(normalize(q))
    drafts = np.minimum(np.searchsorted(cq, rng.random((n_rounds, k)) * cq[-1], side="right"), len(q) - 1)
    target = np.tile(p.astype(np.float32), (k + 1, 1))
    draft = np.tile(q.astype(np.float32), (k, 1))
    lengths = np.empty(n_rounds, np.int64)
    first = np.empty(n_rounds, np.int64)
    for r in range(n_rounds):
        n, tok = specgguf.accept(target, draft, drafts[r], rng)
        lengths[r] = n
        first[r] = drafts[r, 0] if n > 0 else tok
    return lengths, first


def length_law(a, k):
    law = np.array([a**j * (1 - a) for j in range(k)] + [a**k])
    return law


def zipf(v, s, rng):
    w = 1.0 / np.arange(1, v + 1) ** s
    return w[rng.permutation(v)]


CASES = {
    "near_identical": lambda rng, v: (lambda p: (p, p * np.exp(0.3 * rng.standard_normal(v))))(rng.exponential(size=v)),
    "disjoint": lambda rng, v: (np.r_[np.ones(v // 2), np.zeros(v - v // 2)], np.r_[np.zeros(v // 2), np.ones(v - v // 2)]),
    "one_hot_draft": lambda rng, v: (rng.exponential(size=v), np.eye(v)[1]),
    "zipf_noisy": lambda rng, v: (lambda p: (p, p * np.exp(1.0 * rng.standard_normal(v))))(zipf(v, 1.1, rng)),
}


@pytest.mark.parametrize("case,v,k", [
    ("near_identical", 50, 4), ("disjoint", 40, 4), ("one_hot_draft", 10, 3),
    ("zipf_noisy", 1000, 4), ("zipf_noisy", 128256, 5), ("near_identical", 32000, 4),
])
def test_accepted_length_follows_law(case, v, k):
    rng = np.random.default_rng(zlib.crc32(case.encode()) + v)
    p, q = CASES[case](rng, v)
    p, q = normalize(p), normalize(q)
    a = np.minimum(p, q).sum()
    n_rounds = 3000 if v > 10000 else 6000
    lengths, first = run_rounds(p, q, k, n_rounds, seed=v + k)
    counts = np.bincount(lengths, minlength=k + 1)
    law = length_law(a, k)
    if law.max() == 1.0:  # a point mass (disjoint rows: a = 0): every round must land on it
        assert counts[np.argmax(law)] == n_rounds
    else:
        assert chi2_pvalue(counts, law) > ALPHA
    se = lengths.std() / np.sqrt(n_rounds) + 1e-9
    assert abs(lengths.mean() - mean_length(a, k)) < 4 * se
    # Power: the sample-and-compare acceptance a' = sum(p q) is a different law.
    a_wrong = (p * q).sum()
    if abs(mean_length(a_wrong, k) - mean_length(a, k)) > 0.05:
        assert abs(lengths.mean() - mean_length(a_wrong, k)) > 4 * se


def mean_length(a, k):
    return sum(a**i for i in range(1, k + 1))


@pytest.mark.parametrize("case", ["near_identical", "one_hot_draft", "zipf_noisy"])
def test_first_emitted_token_follows_p(case):
    v, k = 12, 3
    rng = np.random.default_rng(11)
    p, q = CASES[case](rng, v)
    p, q = normalize(p), normalize(q)
    _, first = run_rounds(p, q, k, 20000, seed=5)
    counts = np.bincount(first, minlength=v)
    assert chi2_pvalue(counts, p) > ALPHA
    assert chi2_pvalue(counts, q) < ALPHA  # power: the draft's law is rejected


def test_markov_chain_through_decoder():
    """A two-token Markov target and a different Markov draft, run through
    SpeculativeDecoder: emitted 4-token sequences follow the target's law."""
    T = np.array([[0.7, 0.3], [0.2, 0.8]], np.float32)
    D = np.array([[0.4, 0.6], [0.5, 0.5]], np.float32)
    draft_rng = np.random.default_rng(1)

    def draft_step(prefix, k):
        toks, probs, last = [], [], prefix[-1]
        for _ in range(k):
            row = D[last]
            last = int(draft_rng.random() >= row[0])
            toks.append(last)
            probs.append(row)
        return toks, np.array(probs)

    def target_step(prefix, proposed):
        seq = prefix + proposed
        return T[seq[len(prefix) - 1:]]

    dec = specgguf.SpeculativeDecoder(draft_step, target_step, k=3, greedy=False, generator=2)
    n_runs, length = 12000, 4
    counts = np.zeros(2**length)
    for _ in range(n_runs):
        out = dec.generate([0], max_new=length)
        counts[int("".join(map(str, out)), 2)] += 1
    law = np.zeros(2**length)
    for code in range(2**length):
        seq = [0] + [int(b) for b in format(code, f"0{length}b")]
        law[code] = np.prod([T[a, b] for a, b in zip(seq, seq[1:])])
    assert chi2_pvalue(counts, law) > ALPHA
    draft_law = np.array([np.prod([D[a, b] for a, b in zip(s, s[1:])]) for s in
                          ([0] + [int(b) for b in format(c, f"0{length}b")] for c in range(2**length))])
    assert chi2_pvalue(counts, draft_law) < ALPHA


def test_onehot_draft_law():
    """A point-mass draft proposing token 1 every position: acceptance a = p(1)
    per position, and the first emitted token follows p."""
    rng = np.random.default_rng(3)
    v, k, n_rounds = 8, 3, 20000
    p = normalize(rng.exponential(size=v))
    target = np.tile(p.astype(np.float32), (k + 1, 1))
    toks = np.ones(k, np.int64)
    lengths = np.empty(n_rounds, np.int64)
    first = np.empty(n_rounds, np.int64)
    for r in range(n_rounds):
        n, tok = specgguf.accept_onehot(target, toks, rng)
        lengths[r], first[r] = n, (1 if n > 0 else tok)
    assert chi2_pvalue(np.bincount(lengths, minlength=k + 1), length_law(p[1], k)) > ALPHA
    assert chi2_pvalue(np.bincount(first, minlength=v), p) > ALPHA
    assert chi2_pvalue(np.bincount(first, minlength=v), np.eye(v)[1]) < ALPHA  # power
