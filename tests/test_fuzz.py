"""Adversarial inputs to every op: each call either raises a clear ValueError
or TypeError naming the argument, or returns exactly what specgguf.testing.reference
returns (up to a decision that lies within rounding of its threshold).

Inputs: NaN, +-inf, negative and all-zero rows; denormals and magnitudes of
1e-38 and 1e38; float64, float16 and integer arrays; non-contiguous,
negative-stride, Fortran-order and read-only views; V from 1 to 262,144 and
K from 0 to 32; token ids out of range or negative; mismatched shapes;
uniforms outside [0, 1)."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import specgguf
from specgguf.testing import reference
from specgguf.ops import sampling

TIE = 1e-9
N = int(os.environ.get("SPECGGUF_FUZZ_EXAMPLES", "300"))  # the sanitizer job runs fewer, each slower
SPECIALS = [np.nan, np.inf, -np.inf, -1.0, -1e-30, 0.0, 1e-45, 3e38]


def layout(x: np.ndarray, how: str) -> np.ndarray:
    """The same values as ``x`` in another memory layout."""
    if how == "fortran":
        return np.asfortranarray(x)
    if how == "strided":  # every other column of a wider array
        wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if how == "reversed":  # negative stride
        return x[..., ::-1].copy()[..., ::-1]
    if how == "readonly":
        y = x.copy()
        y.setflags(write=False)
        return y
    return x


@st.composite
def arrays(draw, rows, v):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    magnitude = draw(st.sampled_from([1.0, 1e-38, 1e-42, 1e38, 7.0]))
    x = rng.random((rows, v)) * magnitude
    x[rng.random((rows, v)) < draw(st.sampled_from([0.0, 0.3, 0.95]))] = 0.0
    for _ in range(draw(st.integers(0, 2))):
        if rows:
            x[draw(st.integers(0, rows - 1)), draw(st.integers(0, v - 1))] = draw(st.sampled_from(SPECIALS))
    if rows and draw(st.booleans()) and draw(st.booleans()):
        x[draw(st.integers(0, rows - 1))] = 0.0  # an all-zero row
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float64, np.float16, np.int32, np.uint8]))
    with np.errstate(invalid="ignore", over="ignore"):
        if np.dtype(dtype).kind in "iu":
            x = np.nan_to_num(x * 100, nan=0, posinf=200, neginf=0).clip(0, 200)
        return layout(x.astype(dtype), draw(st.sampled_from(["c", "c", "fortran", "strided", "reversed", "readonly"])))


@st.composite
def cases(draw):
    v = draw(st.sampled_from([1, 2, 3, 31, 32, 33, 255, 256, 257, 1000, 4099]))
    k = draw(st.integers(0, 32))
    target, draft = draw(arrays(k + 1, v)), draw(arrays(k, v))
    tokens = [draw(st.integers(0, v - 1)) for _ in range(k)]
    if k and draw(st.integers(0, 9)) == 0:
        tokens[draw(st.integers(0, k - 1))] = draw(st.sampled_from([-1, v, v + 7, -(2**40)]))
    u = [draw(st.floats(0.0, 1.0, exclude_max=True)) for _ in range(k + 1)]
    if draw(st.integers(0, 9)) == 0:
        u[draw(st.integers(0, k))] = draw(st.sampled_from([1.0, -0.25, 1.5, np.nan, np.inf]))
    return target, draft, tokens, np.array(u)


def as_seen(x):
    """What the compiled op reads: the values as float32."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(x, dtype=np.float32)


def expect(call_ours, call_ref, arg_errors):
    """Ours raises what the argument checks or the reference raise, naming the
    same argument, or returns the reference's result."""
    for failed, pattern in arg_errors:
        if failed:
            with pytest.raises(ValueError, match=pattern):
                call_ours()
            return
    try:
        want = call_ref()
    except ValueError as e:
        with pytest.raises(ValueError, match=str(e).split(" contains")[0].split(" has")[0]):
            call_ours()
        return
    got = call_ours()
    if len(want) == 3 and want[2] <= TIE:
        return  # a decision within rounding of its threshold: either answer is right
    assert got == tuple(want[:2])


def token_errors(tokens, v):
    return [(any(not 0 <= t < v for t in tokens), r"draft_tokens\[\d+\] = -?\d+ is out of range")]


def uniform_errors(u):
    return [(not all(0 <= x < 1 for x in u), r"uniforms\[\d+\] = .* is not in \[0, 1\)")]


@settings(max_examples=N + N // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_accept_uniforms(case):
    target, draft, tokens, u = case
    v = target.shape[1]
    expect(lambda: specgguf.accept_uniforms(target, draft, tokens, u),
           lambda: reference.accept_uniforms(as_seen(target), as_seen(draft), tokens, u),
           token_errors(tokens, v) + uniform_errors(u))


@settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_accept_onehot_uniforms(case):
    target, _, tokens, u = case
    expect(lambda: specgguf.accept_onehot_uniforms(target, tokens, u),
           lambda: reference.accept_onehot_uniforms(as_seen(target), tokens, u),
           token_errors(tokens, target.shape[1]) + uniform_errors(u))


@settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_verify_greedy(case):
    target, _, tokens, _ = case
    expect(lambda: specgguf.verify_greedy(target, tokens),
           lambda: reference.verify_greedy(as_seen(target), tokens), token_errors(tokens, target.shape[1]))


@settings(max_examples=2 * N // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(), st.integers(0, 2**64 - 1), st.integers(0, 2**50))
def test_accept_invariant(case, seed, pos):
    target, _, tokens, _ = case
    expect(lambda: specgguf.accept_invariant(target, tokens, seed, pos),
           lambda: reference.accept_invariant(as_seen(target), tokens, seed, pos),
           token_errors(tokens, target.shape[1]))


@settings(max_examples=2 * N // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(), st.sampled_from([0.1, 0.8, 1.0, 3.0]), st.sampled_from([0, 1, 40, 10**6]),
       st.sampled_from([0.0, 0.5, 0.95, 1.0]), st.sampled_from([0.0, 0.05, 1.0]))
def test_warp(case, temperature, top_k, top_p, min_p):
    logits = case[0]
    if np.dtype(logits.dtype).kind == "f":  # logits may be negative: flip the sign of some
        logits = logits * np.where(np.arange(logits.shape[1]) % 3 == 0, -1, 1).astype(logits.dtype)
    seen = as_seen(logits)
    try:
        want = reference.warp(seen, temperature, top_k, top_p, min_p)
    except ValueError as e:
        with pytest.raises(ValueError, match=str(e).split(" contains")[0]):
            sampling.warp(logits, temperature, top_k, top_p, min_p)
        return
    got = sampling.warp(logits, temperature, top_k, top_p, min_p)
    assert got.dtype == np.float32 and got.shape == seen.shape
    np.testing.assert_array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)


def test_the_generator_forms_equal_the_uniform_forms_and_bad_calls_draw_nothing():
    rng = np.random.default_rng(0)
    for v, k in ((1, 0), (7, 3), (1000, 32)):
        t = rng.random((k + 1, v)).astype(np.float32) + 0.01
        d = rng.random((k, v)).astype(np.float32) + 0.01
        tok = list(rng.integers(0, v, k))
        for seed in range(5):
            u = np.random.default_rng(seed).random(k + 1)
            assert specgguf.accept(t, d, tok, np.random.default_rng(seed)) == specgguf.accept_uniforms(t, d, tok, u)
            assert specgguf.accept_onehot(t, tok, np.random.default_rng(seed)) == \
                specgguf.accept_onehot_uniforms(t, tok, u)
        g = np.random.default_rng(1)
        with pytest.raises(ValueError):
            specgguf.accept(t, np.ones((k + 1, v), np.float32), tok, g)  # K+1 draft rows: a mismatch
        assert g.random() == np.random.default_rng(1).random()  # no draw was consumed


@pytest.mark.parametrize("k", [0, 1, 32])
def test_the_largest_vocabulary(k):
    v = 262144
    rng = np.random.default_rng(k)
    t = rng.random((k + 1, v)).astype(np.float32)
    d = rng.random((k, v)).astype(np.float32)
    tok = [int(x) for x in rng.integers(0, v, k)]
    u = rng.random(k + 1)
    n, nxt, margin = reference.accept_uniforms(t, d, tok, u)
    if margin > TIE:
        assert specgguf.accept_uniforms(t, d, tok, u) == (n, nxt)
    assert specgguf.verify_greedy(t, tok) == reference.verify_greedy(t, tok)
    assert specgguf.accept_invariant(t, tok, 5, 9) == reference.accept_invariant(t, tok, 5, 9)


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: specgguf.accept_uniforms(np.ones((2, 4)), np.ones((1, 5)), [1], [0.5, 0.5]), ValueError, "V must match"),
    (lambda: specgguf.accept_uniforms(np.ones((2, 4)), np.ones((2, 4)), [1], [0.5, 0.5]), ValueError,
     r"draft_probs has shape \(2, 4\)"),
    (lambda: specgguf.accept_uniforms(np.ones((2, 4)), np.ones((1, 4)), [1], [0.5]), ValueError,
     r"uniforms must have shape \(K\+1,\)"),
    (lambda: specgguf.accept_uniforms(np.ones((2, 4)), np.ones((1, 4)), [1], ["a", "b"]), TypeError, "uniforms"),
    (lambda: specgguf.verify_greedy(np.ones((2, 4), dtype=complex), [1]), TypeError, "target_probs"),
    (lambda: specgguf.verify_greedy(np.ones((2, 4)), np.array([1.5])), TypeError, "draft_tokens"),
    (lambda: specgguf.verify_greedy(np.ones((2, 4)), [[1]]), ValueError, "draft_tokens must be 1-D"),
    (lambda: specgguf.accept_onehot(np.ones((3, 4)), [1], 0), ValueError, r"target_probs has shape \(3, 4\)"),
    (lambda: specgguf.accept_onehot(np.ones((2, 4)), [1], "seed"), TypeError, "generator"),
    (lambda: specgguf.race_pick(np.ones(4), 1, 0), ValueError, "probs must be 2-D"),
    (lambda: sampling.warp(np.ones((1, 4)), 0.8, -1, 0.9, 0.0), ValueError, "top_k"),
    (lambda: sampling.warp(np.ones((1, 4)), -0.8, 1, 0.9, 0.0), ValueError, "temperature"),
    (lambda: sampling.warp(np.ones((1, 4)), 0.8, 1.5, 0.9, 0.0), TypeError, "top_k"),
    (lambda: sampling.warp("logits", 0.8, 1, 0.9, 0.0), TypeError, "logits"),
])
def test_argument_errors_name_the_argument(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()
