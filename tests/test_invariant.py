"""Drafter-invariant verification (the shared-noise race): exact against the
numpy reference, the target's law by chi-square, and output independent of
the draft, K and the policy."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import specgguf
from specgguf.testing import reference
from specgguf.ops.ngram import NgramDrafter
from specgguf.ops.sampling import Sampler
from tests.conftest import ALPHA, chi2_pvalue, examples


def test_uniforms_match_the_reference_and_are_uniform():
    toks = np.arange(20000)
    u = specgguf.race_uniforms(7, 3, toks)
    assert all(u[t] == reference.race_uniform(7, 3, int(t)) for t in (0, 1, 2, 999, 19999))
    assert ((u > 0) & (u < 1)).all()
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    assert chi2_pvalue(counts, np.full(20, 1 / 20)) > ALPHA
    # Other seeds and positions give other, unrelated draws.
    assert not np.array_equal(u, specgguf.race_uniforms(8, 3, toks))
    assert abs(np.corrcoef(u, specgguf.race_uniforms(7, 4, toks))[0, 1]) < 0.03


@settings(max_examples=examples(150), deadline=None)
@given(v=st.sampled_from([1, 2, 7, 64, 300, 5000]), k=st.integers(0, 6), seed=st.integers(0, 2**64 - 1),
       pos=st.integers(0, 2**40), sparse=st.floats(0.0, 0.99), data=st.data())
def test_matches_the_reference_exactly(v, k, seed, pos, sparse, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    p = rng.random((k + 1, v)).astype(np.float32)
    p[rng.random((k + 1, v)) < sparse] = 0
    p[np.arange(k + 1), rng.integers(0, v, k + 1)] += 0.1  # no empty row
    picks = specgguf.race_pick(p, seed, pos)
    assert [int(x) for x in picks] == [reference.race_pick(p[i], seed, pos + i) for i in range(k + 1)]
    # Drafts that copy the first j race picks, then differ.
    j = data.draw(st.integers(0, k))
    draft = [int(x) for x in picks[:j]] + [int((picks[i] + 1) % v) if v > 1 else 0 for i in range(j, k)]
    got = specgguf.accept_invariant(p, draft, seed, pos)
    assert got == reference.accept_invariant(p, draft, seed, pos)
    if v > 1:
        assert got == (j, int(picks[j]))


def test_each_position_samples_the_target_exactly():
    """Over positions 0..N-1 of one seed, race picks follow p (chi-square),
    with the power to reject a nearby law."""
    p = np.array([0.05, 0.3, 0.0, 0.15, 0.02, 0.38, 0.1], np.float32)
    n = 40000
    rows = np.tile(p, (n, 1))
    for seed in (1, 2**63 + 5):
        picks = specgguf.race_pick(rows, seed, 0)
        counts = np.bincount(picks, minlength=len(p))
        assert counts[2] == 0
        assert chi2_pvalue(counts, p) > ALPHA
        wrong = p.astype(np.float64) + np.array([0.01, -0.01, 0, 0, 0, 0, 0])
        assert chi2_pvalue(counts, wrong) < ALPHA  # power


def test_acceptance_meets_the_coupling_bound():
    """A draft proposing its own race winner on q is accepted with probability
    at least (1 - TV) / (1 + TV) (Daliri, Musco, Suresh 2024)."""
    rng = np.random.default_rng(0)
    for _ in range(3):
        p = rng.dirichlet(np.full(50, 0.3)).astype(np.float32)
        q = (0.6 * p + 0.4 * rng.dirichlet(np.full(50, 0.3))).astype(np.float32)
        tv = 0.5 * np.abs(p.astype(np.float64) / p.sum() - q / q.sum()).sum()
        n = 20000
        same = specgguf.race_pick(np.tile(p, (n, 1)), 11, 0) == specgguf.race_pick(np.tile(q, (n, 1)), 11, 0)
        rate, sd = same.mean(), np.sqrt(0.25 / n)
        assert rate > (1 - tv) / (1 + tv) - 4 * sd
        assert rate < 1 - tv + 4 * sd  # and no more than the optimal coupling's 1 - TV


T = np.array([[0.1, 0.6, 0.2, 0.1], [0.3, 0.1, 0.5, 0.1], [0.5, 0.2, 0.1, 0.2], [0.2, 0.2, 0.2, 0.4]],
             np.float32)


def markov_target(prefix, proposed):
    return T[(prefix + proposed)[len(prefix) - 1:]]


def drafts(kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "ngram":
        return NgramDrafter(n_min=1)

    def draft_step(prefix, k):
        seq, out = list(prefix), []
        for i in range(k):
            if kind == "race":  # the matching race on a perturbed q: accepted often
                q = (T[seq[-1]] + 0.05).astype(np.float32)
                tok = int(specgguf.race_pick(q[None, :], 99, len(seq) - 3)[0])
            else:
                tok = int(rng.integers(4))
            out.append(tok)
            seq.append(tok)
        return out, None
    return draft_step


@pytest.mark.parametrize("kind", ["race", "random", "ngram"])
def test_output_is_plain_seeded_sampling_whatever_the_draft(kind):
    prompt = [0, 1, 2]
    plain = specgguf.SpeculativeDecoder(drafts("random", 0), markov_target, k=0,
                                        sampler=Sampler("invariant", seed=99, origin=3)).generate(prompt, 60)
    accepted = 0
    for k in (1, 3, 8, "auto"):
        dec = specgguf.SpeculativeDecoder(drafts(kind, 1), markov_target, k=k,
                                          sampler=Sampler("invariant", seed=99, origin=3))
        assert dec.generate(prompt, 60) == plain
        accepted += dec.stats.accepted
    assert accepted > 0 or kind == "ngram"
    other = specgguf.SpeculativeDecoder(drafts(kind, 1), markov_target, k=3,
                                        sampler=Sampler("invariant", seed=98, origin=3))
    assert other.generate(prompt, 60) != plain


def test_sequences_follow_the_markov_law():
    prompt, length = [0, 1, 2], 3
    counts = np.zeros(4**length)
    for seed in range(8000):
        dec = specgguf.SpeculativeDecoder(drafts("race", seed), markov_target, k=2,
                                          sampler=Sampler("invariant", seed=seed, origin=3))
        out = dec.generate(prompt, length)
        counts[sum(t * 4**i for i, t in enumerate(out))] += 1
    law = np.zeros(4**length)
    for code in range(4**length):
        seq = [prompt[-1]] + [(code // 4**i) % 4 for i in range(length)]
        law[code] = np.prod([T[a, b] for a, b in zip(seq, seq[1:])])
    assert chi2_pvalue(counts, law) > ALPHA


@pytest.mark.parametrize("args,exc,msg", [
    ((np.ones((2, 4), np.float32), [1], -1, 0), ValueError, r"seed must be in \[0, 2\*\*64\)"),
    ((np.ones((2, 4), np.float32), [1], 2**64, 0), ValueError, "seed must be in"),
    ((np.ones((2, 4), np.float32), [1], "7", 0), TypeError, "seed must be an int"),
    ((np.ones((2, 4), np.float32), [1], 1.5, 0), TypeError, "seed must be an int"),
    ((np.ones((2, 4), np.float32), [1], 1, -3), ValueError, "position must be in"),
    ((np.ones((2, 4), np.float32), [4], 1, 0), ValueError, r"draft_tokens\[0\] = 4 is out of range"),
    ((np.ones((3, 4), np.float32), [1], 1, 0), ValueError, r"target_probs has shape \(3, 4\)"),
    ((np.array([[1, np.nan, 1, 1]] * 2, np.float32), [0], 1, 0), ValueError, "row 0 contains NaN"),
    ((np.array([[1, -1, 1, 1]] * 2, np.float32), [0], 1, 0), ValueError, "row 0 contains NaN, Inf or a negative"),
    ((np.zeros((2, 4), np.float32), [0], 1, 0), ValueError, "row 0 has zero total mass"),
])
def test_bad_arguments(args, exc, msg):
    with pytest.raises(exc, match=msg):
        specgguf.accept_invariant(*args)


def test_numpy_integer_seeds_and_the_same_result_on_every_kernel(kernel):
    p = np.random.default_rng(3).random((4, 1000)).astype(np.float32)
    assert specgguf.accept_invariant(p, [1, 2, 3], np.uint64(5), np.int64(2)) == \
        specgguf.accept_invariant(p, [1, 2, 3], 5, 2)
