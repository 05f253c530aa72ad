"""The compiled warp against the numpy reference, and its errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from specgguf import _core

from specgguf.testing import reference

from specgguf.ops import sampling


@settings(max_examples=200, deadline=None)
@given(v=st.integers(1, 300), n=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       temperature=st.sampled_from([0.1, 0.7, 1.0, 2.5]), top_k=st.sampled_from([0, 1, 5, 40, 1000]),
       top_p=st.sampled_from([0.0, 0.5, 0.9, 0.95, 1.0]), min_p=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       ties=st.booleans(), masked=st.booleans())
def test_warp_matches_reference(v, n, seed, temperature, top_k, top_p, min_p, ties, masked):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, v)) * 4).astype(np.float32)
    if ties:
        logits = np.round(logits)  # many equal logits: order ties by index
    if masked:
        logits[rng.random((n, v)) < 0.3] = -np.inf
        logits[:, 0] = 0.0  # at least one finite value per row
    got = sampling.warp(logits, temperature, top_k, top_p, min_p)
    want = reference.warp(logits, temperature, top_k, top_p, min_p)
    np.testing.assert_array_equal(got > 0, want > 0)  # the same kept set
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(got.sum(1), 1.0, rtol=1e-5)
    if 0 < top_k:
        assert ((got > 0).sum(1) <= top_k).all()


def test_warp_rules():
    l = np.array([[3.0, 1.0, 3.0, -np.inf, 2.0]], np.float32)
    p = sampling.warp(l, 1.0, top_k=1, top_p=1.0, min_p=0.0)
    assert p.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]  # tie at the top: lower index
    p = sampling.warp(l, 1.0, top_k=0, top_p=1.0, min_p=0.0)
    assert p[0, 3] == 0.0 and p[0, 0] == p[0, 2]
    e = np.exp([3.0, 1.0, 3.0, 2.0])
    np.testing.assert_allclose(p[0, [0, 1, 2, 4]], e / e.sum(), rtol=1e-6)
    # min_p = 0.3 keeps tokens with p >= 0.3 * p_max: logits >= 3 + ln 0.3 = 1.80
    p = sampling.warp(l, 1.0, top_k=0, top_p=1.0, min_p=0.3)
    assert (p[0] > 0).tolist() == [True, False, True, False, True]


WARPS = [(0.8, 0, 1.0, 0.0), (0.8, 40, 0.95, 0.05), (1.3, 0, 0.9, 0.0), (0.5, 0, 1.0, 0.05),
         (0.7, 0, 0.95, 0.05), (1.0, 2000, 0.99, 0.0), (2.0, 0, 1.0, 0.0), (0.1, 0, 0.5, 0.0),
         (0.8, 1000, 1.0, 0.0), (1.0, 100, 0.9, 0.0)]


@pytest.mark.parametrize("setting", WARPS)
def test_warp_at_a_real_vocabulary_size_is_the_reference_on_every_kernel(setting):
    """V = 49152 (SmolLM2's): the O(V) paths (no top-k: the softmax, the
    top-p bins, the min-p select; large top-k: selection) give the same bits
    on every kernel path this CPU runs, and the reference's kept set and
    probabilities. The tied row (seven values) puts thousands of ties at
    large top-k's sampled threshold: at top-k 2000 fewer than k lie above
    it, and the selection takes the whole row instead."""
    rng = np.random.default_rng(7)
    v = 49152
    peaked = rng.standard_normal(v) * 2 + np.where(rng.random(v) < 2e-3, 9.0, 0.0)  # a few strong tokens
    flat = rng.standard_normal(v) * 3                                                # a wide nucleus
    tied = np.round(flat / 4)                                                        # ties at every cut
    logits = np.stack([peaked, flat, tied]).astype(np.float32)
    logits[:, ::97] = -np.inf
    want = reference.warp(logits, *setting)
    before = _core.get_kernel()
    try:
        outs = {}
        for name in _core.kernels():
            _core.set_kernel(name)
            outs[name] = sampling.warp(logits, *setting)
    finally:
        _core.set_kernel(before)
    got = outs["scalar"]
    for name, out in outs.items():
        np.testing.assert_array_equal(out, got, err_msg=f"kernel {name} differs from scalar")
    np.testing.assert_array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_warp_top_p_over_tied_tokens_is_exact():
    """20 tokens tied at the top, top_p 0.5: exactly 10 hold half the mass.
    Summing ten 0.05s gives 0.49999999999999994 and kept 11; sums of the
    masses themselves are exact there."""
    row = np.full((1, 31), -200.0, np.float32)
    row[0, 1:21] = 200.0
    for top_k in (0, 25):  # the whole-row path and the top-k path
        p = sampling.warp(row, 0.1, top_k=top_k, top_p=0.5, min_p=0.0)
        assert np.count_nonzero(p) == 10 and (p[0, 1:11] == np.float32(0.1)).all()
        np.testing.assert_array_equal(p, reference.warp(row, 0.1, top_k, 0.5, 0.0))


def test_warp_signed_zero_logits_tie():
    """-0.0 and +0.0 tie (ordered by index); a -0.0 top once put +0.0 a bin past the end."""
    l = np.array([[-0.0, 0.0, 0.0, -1.0]], np.float32)
    p = sampling.warp(l, 0.1, top_k=0, top_p=0.5, min_p=0.0)
    np.testing.assert_allclose(p, [[0.5, 0.5, 0.0, 0.0]])
    np.testing.assert_array_equal(p, reference.warp(l, 0.1, 0, 0.5, 0.0))


@pytest.mark.parametrize("kwargs,msg", [
    (dict(temperature=0.0), "temperature must be a finite number > 0"),
    (dict(temperature=np.nan), "temperature"),
    (dict(top_k=-1), "top_k must be >= 0"),
    (dict(top_p=1.5), r"top_p must be in \[0, 1\]"),
    (dict(min_p=-0.1), r"min_p must be in \[0, 1\]"),
])
def test_warp_bad_settings(kwargs, msg):
    args = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05) | kwargs
    with pytest.raises(ValueError, match=msg):
        sampling.warp(np.zeros((1, 5), np.float32), **args)


@pytest.mark.parametrize("row", [[0.0, np.nan], [0.0, np.inf], [-np.inf, -np.inf]])
def test_warp_bad_rows(row):
    with pytest.raises(ValueError, match="logits row 0"):
        sampling.warp(np.array([row], np.float32), 0.8, 40, 0.95, 0.05)
    with pytest.raises(ValueError, match="must be 2-D"):
        sampling.warp(np.zeros(5, np.float32), 0.8, 40, 0.95, 0.05)


PLAIN = (1.0, 0, 1.0, 0.0)  # temperature 1, no truncation: the warp is the softmax


def test_catchup_agreement_estimates_the_exact_rules_acceptance():
    """Emitted tokens follow p; the mean of min(1, q(x)/p(x)) over them is
    sum min(p, q), what a draft token sampled from q is accepted with."""
    rng = np.random.default_rng(7)
    p = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
    q = np.array([0.1, 0.3, 0.3, 0.2, 0.1])
    n = 20000
    sampler = sampling.Sampler("exact", PLAIN, origin=3)
    xs = rng.choice(5, size=n, p=p)
    sampler.emitted_p = {i: float(p[x]) for i, x in enumerate(xs)}
    context = [9, 9, 9] + xs.tolist()
    rows = np.tile(np.log(q).astype(np.float32), (n, 1))
    total, positions = sampling.agreement(sampler, rows, context, 3)
    assert positions == n
    want = np.minimum(p, q).sum()  # 0.75
    sd = np.sqrt(np.var(np.minimum(1.0, q[xs] / p[xs])) / n)
    assert abs(total / n - want) < 4 * sd
    # A draft that is the target agrees everywhere; positions not emitted under the rule do not count.
    same = np.tile(np.log(p).astype(np.float32), (10, 1))
    assert sampling.agreement(sampler, same, context, 3) == (pytest.approx(10.0), 10)
    sampler.emitted_p.pop(0)
    assert sampling.agreement(sampler, same, context, 3)[1] == 9


def test_catchup_agreement_is_the_verifiers_verdict_greedy_and_invariant():
    """Greedy and drafter-invariant: a position agrees exactly when the
    verifier would accept the token the draft proposes there."""
    from specgguf.ops.verify import accept_invariant, race_pick, verify_greedy
    rng = np.random.default_rng(11)
    v, n, origin = 50, 40, 5
    target = rng.standard_normal((n, v)).astype(np.float32) * 2
    draft = target + rng.standard_normal((n, v)).astype(np.float32)  # a close draft, not the same
    for rule in ("greedy", "invariant"):
        sampler = sampling.Sampler(rule, PLAIN, seed=123, origin=origin)
        p = sampler.warp(target)
        emitted = (np.argmax(target, 1) if rule == "greedy" else race_pick(p, 123, 0)).tolist()
        context = list(range(origin)) + emitted
        verdicts = 0
        for j in range(n):  # one-token drafts at each position, as a round would verify them
            tok, _, _ = sampler.pick(draft[j], context[:origin + j])
            rows = np.stack([p[j], p[j]])
            kept = verify_greedy(rows, [tok]) if rule == "greedy" else accept_invariant(rows, [tok], 123, j)
            verdicts += kept[0]
        got = sampling.agreement(sampler, draft, context, origin)
        assert got == (float(verdicts), n)
        assert 0 < verdicts < n  # the test tells agreement from disagreement
        # Rows before the output starts (the prompt) are skipped.
        prompt_rows = rng.standard_normal((2, v)).astype(np.float32)
        assert sampling.agreement(sampler, np.vstack([prompt_rows, draft]), context, origin - 2) == got


def test_a_draft_that_agrees_everywhere_measures_at_most_one():
    """Warped rows are float32: two identical rows' overlap summed to 1 + 7e-8
    for about half of them, and a seeded sampled run whose draft agreed with
    the target on its prompt failed with "a measured acceptance must be in
    [0, 1]" (found by the corpus check on a Q4_1 target)."""
    from specgguf.ops.sampling import Sampler, rows_agreement
    s = Sampler("exact", (0.8, 40, 0.95, 0.05))
    rows = (np.random.default_rng(1).standard_normal((64, 49152)) * 3).astype(np.float32)
    got = [rows_agreement(s, r[None], r[None]) for r in rows]
    assert all(0.999 < a <= 1.0 for a in got)
