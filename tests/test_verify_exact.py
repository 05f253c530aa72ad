"""The ops against the plain numpy reference (same uniforms) and across kernel paths."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import specgguf
from tests.conftest import examples
from specgguf.testing import reference

TIE = 1e-9  # decisions closer than this (relative) to a threshold may round either way


@st.composite
def rounds(draw, max_v=600, max_k=6):
    k = draw(st.integers(0, max_k))
    v = draw(st.integers(1, max_v))
    scale = draw(st.sampled_from([1e-30, 1e-6, 1.0, 1e6, 1e30]))
    sparsity = draw(st.sampled_from([0.0, 0.5, 0.99]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    def masses(rows):
        m = rng.exponential(size=(rows, v)) * (rng.random((rows, v)) >= sparsity)
        m[np.arange(rows), rng.integers(0, v, rows)] += 1.0  # no zero-mass row
        return (m * scale).astype(np.float32)

    target, draft = masses(k + 1), masses(k)
    # Tokens: sometimes the target's argmax (so greedy accepts), else random.
    tokens = np.where(rng.random(k) < 0.6, target[:k].argmax(1), rng.integers(0, v, k))
    u = draw(hnp.arrays(np.float64, k + 1, elements=st.floats(0, 1, exclude_max=True)))
    return target, draft, tokens.astype(np.int64), u


@settings(max_examples=examples(300), deadline=None)
@given(rounds())
def test_accept_matches_reference(case):
    target, draft, tokens, u = case
    got = specgguf.accept_uniforms(target, draft, tokens, u)
    n, tok, margin = reference.accept_uniforms(target, draft, tokens, u)
    if margin > TIE:
        assert got == (n, tok)


@settings(max_examples=examples(300), deadline=None)
@given(rounds())
def test_greedy_matches_reference(case):
    target, _, tokens, _ = case
    assert specgguf.verify_greedy(target, tokens) == reference.verify_greedy(target, tokens)


@settings(max_examples=examples(100), deadline=None)
@given(rounds(max_v=3000))
def test_kernel_paths_agree_bit_for_bit(case):
    target, draft, tokens, u = case
    with np.errstate(divide="ignore"):
        logits = np.log(target)  # zeros become -inf: masked logits
    results = set()
    before = specgguf.get_kernel()
    try:
        for name in specgguf.kernels():
            specgguf.set_kernel(name)
            results.add((specgguf.accept_uniforms(target, draft, tokens, u),
                         specgguf.verify_greedy(target, tokens),
                         specgguf.verify_greedy(logits, tokens)))
    finally:
        specgguf.set_kernel(before)
    assert len(results) == 1


@pytest.mark.parametrize("v", [1, 31, 32, 255, 256, 257, 1000, 32000, 128256])
def test_kernel_paths_agree_at_chunk_edges(kernel, v):
    """Every path against scalar at sizes around the 256-element chunk and the
    32-lane stride, on sampling scans that land in every chunk."""
    rng = np.random.default_rng(v)
    k = 3
    target = rng.random((k + 1, v)).astype(np.float32)
    draft = rng.random((k, v)).astype(np.float32)
    for trial in range(20):
        tokens = rng.integers(0, v, k)
        u = rng.random(k + 1)
        u[:k] = 0.999 if trial % 2 else u[:k]  # odd trials reject at row 0
        got = specgguf.accept_uniforms(target, draft, tokens, u)
        specgguf.set_kernel("scalar")
        want = specgguf.accept_uniforms(target, draft, tokens, u)
        want_g = specgguf.verify_greedy(target, target[:k].argmax(1))
        specgguf.set_kernel(kernel)
        assert got == want
        assert specgguf.verify_greedy(target, target[:k].argmax(1)) == want_g


def test_greedy_rules():
    t = np.zeros((4, 5), np.float32)
    t[0, 2] = t[1, 3] = t[2, 1] = t[3, 4] = 1.0
    assert specgguf.verify_greedy(t, [2, 3, 1]) == (3, 4)  # all accepted: bonus
    assert specgguf.verify_greedy(t, [2, 0, 1]) == (1, 3)  # miss at 1: its argmax
    assert specgguf.verify_greedy(t[:1], []) == (0, 2)  # K = 0
    tie = np.ones((1, 5), np.float32)
    assert specgguf.verify_greedy(tie, []) == (0, 0)  # ties: lowest index
    # Logits with masked (-inf) entries are fine; only the argmax is read.
    logits = np.full((2, 600), -np.inf, np.float32)
    logits[0, 300] = 0.0
    logits[1, 599] = -5.0
    assert specgguf.verify_greedy(logits, [300]) == (1, 599)
    # Rows after the first miss are not read (a NaN there is never seen).
    t[2, 0] = np.nan
    assert specgguf.verify_greedy(t, [0, 3, 1]) == (0, 2)


def test_accept_deterministic_cases():
    p = np.array([[0.0, 1.0, 0.0], [0.25, 0.25, 0.5]], np.float32)
    q_same = np.array([[0.0, 1.0, 0.0]], np.float32)
    # p == q: always accepted; bonus from p_1 by inverse CDF.
    assert specgguf.accept_uniforms(p, q_same, [1], [0.999, 0.1]) == (1, 0)
    assert specgguf.accept_uniforms(p, q_same, [1], [0.999, 0.6]) == (1, 2)
    # Draft puts all mass on token 0 where p has none: always rejected,
    # correction from norm(max(0, p - q)) = p here.
    q_bad = np.array([[1.0, 0.0, 0.0]], np.float32)
    assert specgguf.accept_uniforms(p, q_bad, [0], [0.0, 0.5]) == (0, 1)
    # Unnormalized masses give the same answers as normalized ones.
    assert specgguf.accept_uniforms(p * 7, q_same * 1e-3, [1], [0.5, 0.6]) == (1, 2)
    # K = 0: a sample from p_0; draft_probs may be None.
    assert specgguf.accept_uniforms(p[1:], None, [], [0.3]) == (0, 1)
    assert specgguf.accept(p[1:], None, [], generator=0)[0] == 0


def test_generator_contract():
    rng = np.random.default_rng(0)
    t = rng.random((5, 50)).astype(np.float32)
    d = rng.random((4, 50)).astype(np.float32)
    tok = rng.integers(0, 50, 4)
    u = np.random.default_rng(7).random(5)
    assert specgguf.accept(t, d, tok, np.random.default_rng(7)) == specgguf.accept_uniforms(t, d, tok, u)
    assert specgguf.accept(t, d, tok, 7) == specgguf.accept_uniforms(t, d, tok, u)
    g = np.random.default_rng(3)
    specgguf.accept(t, d, tok, g)
    ref = np.random.default_rng(3)
    ref.random(5)
    assert g.random() == ref.random()  # exactly K+1 draws consumed


def test_input_kinds_without_numpy_arrays():
    t = [[0.1, 0.9], [0.8, 0.2]]
    assert specgguf.verify_greedy(t, [1]) == (1, 0)
    assert specgguf.verify_greedy(np.array(t, np.float64), np.array([1], np.uint8)) == (1, 0)
    assert specgguf.verify_greedy(memoryview(np.array(t, np.float32)), [1]) == (1, 0)
    nc = np.asfortranarray(np.array(t, np.float32))  # non-contiguous: converted
    assert specgguf.verify_greedy(nc, [1]) == (1, 0)
    assert specgguf.accept_uniforms(np.array(t, np.float16), [[0.5, 0.5]], [1], [0.0, 0.5]) == (1, 0)


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    t = torch.tensor([[0.1, 0.9], [0.8, 0.2]])
    assert specgguf.verify_greedy(t, torch.tensor([1])) == (1, 0)
    assert specgguf.accept_uniforms(t, torch.tensor([[0.5, 0.5]]), torch.tensor([1]), [0.0, 0.5]) == (1, 0)


@settings(max_examples=examples(300), deadline=None)
@given(rounds())
def test_accept_onehot_equals_accept_with_onehot_rows(case):
    """The point-mass path needs no draft rows but must decide exactly as accept()."""
    target, _, tokens, u = case
    k, v = len(tokens), target.shape[1]
    onehot = np.zeros((k, v), np.float32)
    onehot[np.arange(k), tokens] = 1.0
    got = specgguf.accept_onehot_uniforms(target, tokens, u)
    assert got == specgguf.accept_uniforms(target, onehot, tokens, u)
    n, tok, margin = reference.accept_uniforms(target, onehot, tokens, u)
    if margin > TIE:
        assert got == (n, tok)
    before = specgguf.get_kernel()
    try:
        for name in specgguf.kernels():
            specgguf.set_kernel(name)
            assert specgguf.accept_onehot_uniforms(target, tokens, u) == got
    finally:
        specgguf.set_kernel(before)


@pytest.mark.parametrize("v", [5, 1000, 32000, 128256])
def test_quick_sum_shortcut_never_changes_a_decision(v):
    """accept() decides most positions from float32 row sums with an error
    bound (v * 2^-24), and falls back to the double sums inside it. Put u just
    inside and just outside that bound around the exact threshold: every
    kernel path must give the reference's decision."""
    rng = np.random.default_rng(v)
    delta = v * 2.0**-24
    p = rng.random((2, v)).astype(np.float32) + 0.01
    q = (p[:1] * np.exp(0.3 * rng.standard_normal(v))).astype(np.float32)
    t = int(np.argmin(p[0] / q[0]))  # a token whose ratio p/q is below 1
    ratio = (p[0, t] / p[0].astype(np.float64).sum()) / (q[0, t] / q[0].astype(np.float64).sum())
    assert ratio < 1
    before = specgguf.get_kernel()
    try:
        for f in [0.0, 0.3, 0.9, 0.99, 1.01, 1.1, 3.0, 30.0]:
            for sign in (-1, 1):
                u0 = ratio * (1 + sign * f * delta)
                if not 0 <= u0 < 1:
                    continue
                u = np.array([u0, 0.5])
                n_ref, tok_ref, margin = reference.accept_uniforms(p, q, [t], u)
                got = set()
                for name in specgguf.kernels():
                    specgguf.set_kernel(name)
                    got.add(specgguf.accept_uniforms(p, q, [t], u))
                assert len(got) == 1
                if margin > TIE:
                    assert got == {(n_ref, tok_ref)}
    finally:
        specgguf.set_kernel(before)


def canonical_total(row):
    """The row total exactly as cpp/verify.h defines it: chunks of 256, 32
    double lanes added in index order, folded in halves, chunks in sequence."""
    x = np.asarray(row, np.float64)
    total = 0.0
    for start in range(0, len(x), 256):
        chunk = x[start:start + 256]
        lanes = np.zeros(32)
        for j in range(0, len(chunk), 32):
            block = chunk[j:j + 32]
            lanes[:len(block)] += block
        for half in (16, 8, 4, 2, 1):
            lanes[:half] += lanes[half:2 * half]
        total += lanes[0]
    return total


def test_quick_sum_bound_is_rigorous_on_rows_that_maximise_float_error():
    """A row whose float32 sum loses almost all of its small entries (one 1.0,
    then 2^20 - 1 entries of 2^-25: added in order, each rounds away) is as far
    from its double total as a float sum can be, at V = 2^20. Around the exact
    threshold, every kernel path must take the canonical double totals'
    decision (float and double errors, and the test's own roundings, are all
    inside the bound)."""
    v = 1 << 20
    p = np.full((2, v), 2.0**-25, np.float32)
    p[:, 0] = 1.0
    q = np.ones((1, v), np.float32)
    t = 5
    P, Q = canonical_total(p[0]), canonical_total(q[0])
    assert abs(float(np.float32(p[0].sum(dtype=np.float32))) - P) > 0  # float sums really lose mass
    ratio = (float(p[0, t]) * Q) / (float(q[0, t]) * P)
    before = specgguf.get_kernel()
    try:
        for rel in [-0.2, -0.07, -0.0625, -0.03, -1e-6, -1e-12, 0.0, 1e-12, 1e-6, 0.03, 0.0625, 0.07, 0.2]:
            u0 = ratio * (1 + rel)
            u = np.array([u0, 0.5])
            want = u0 * float(q[0, t]) * P < float(p[0, t]) * Q  # the double totals' test
            for name in specgguf.kernels():
                specgguf.set_kernel(name)
                n, _ = specgguf.accept_uniforms(p, q, [t], u)
                assert (n == 1) == want, (name, rel)
    finally:
        specgguf.set_kernel(before)


def test_sampling_at_the_top_of_the_unit_interval():
    """u just below 1 samples the last token with mass, on every path."""
    p = np.zeros((1, 512), np.float32)
    p[0, [3, 300, 400]] = [0.5, 0.25, 0.75]
    u = np.array([np.nextafter(1.0, 0.0)])
    for name in specgguf.kernels():
        before = specgguf.get_kernel()
        specgguf.set_kernel(name)
        try:
            assert specgguf.accept_uniforms(p, np.zeros((0, 512), np.float32), [], u) == (0, 400)
            assert specgguf.accept_onehot_uniforms(p, [], u) == (0, 400)
        finally:
            specgguf.set_kernel(before)
