"""Every bad input to the ops: the right exception, a message naming the problem."""

import numpy as np
import pytest

import specgguf

T = np.full((3, 10), 0.1, np.float32)  # K = 2, V = 10
D = np.full((2, 10), 0.1, np.float32)
TOK = [1, 2]


def bad(arr, row, col, value):
    arr = arr.copy()
    arr[row, col] = value
    return arr


GREEDY_CASES = [
    (("not an array", TOK), TypeError, "target_probs must hold real numbers"),
    ((None, TOK), TypeError, "target_probs must hold real numbers"),
    ((T.astype(np.complex64), TOK), TypeError, "dtype complex64"),
    ((T.astype(bool), TOK), TypeError, "dtype bool"),
    ((T[0], TOK), ValueError, r"target_probs has shape \(10,\); expected \(K\+1, V\) = \(3, V\)"),
    ((T[:2], TOK), ValueError, r"target_probs has shape \(2, 10\); expected \(K\+1, V\) = \(3, V\) for K = 2"),
    ((np.zeros((3, 0), np.float32), TOK), ValueError, "V = 0"),
    ((T, [1.0, 2.0]), TypeError, "draft_tokens must be integer token ids"),
    ((T, [[1, 2]]), ValueError, r"draft_tokens must be 1-D"),
    ((T, [1, 10]), ValueError, r"draft_tokens\[1\] = 10 is out of range for V = 10"),
    ((T, [-1, 2]), ValueError, r"draft_tokens\[0\] = -1 is out of range"),
    ((T, 3), ValueError, "draft_tokens must be 1-D"),
    ((bad(T, 0, 4, np.nan), TOK), ValueError, "target_probs row 0 contains NaN or \\+Inf"),
    ((bad(T, 0, 4, np.inf), TOK), ValueError, "target_probs row 0 contains NaN or \\+Inf"),
]


@pytest.mark.parametrize("args,exc,msg", GREEDY_CASES)
def test_verify_greedy_errors(kernel, args, exc, msg):
    with pytest.raises(exc, match=msg):
        specgguf.verify_greedy(*args)


U = [0.5, 0.5, 0.5]
ACCEPT_CASES = [
    ((T, D[:1], TOK, U), ValueError, r"draft_probs has shape \(1, 10\); expected \(K, V\) = \(2, V\)"),
    ((T, D[:, :9], TOK, U), ValueError, "V must match"),
    ((T, D.astype(object), TOK, U), TypeError, "draft_probs must hold real numbers"),
    ((bad(T, 0, 3, np.nan), D, TOK, U), ValueError, "target_probs row 0 contains NaN, Inf or a negative"),
    ((bad(T, 0, 3, np.inf), D, TOK, U), ValueError, "target_probs row 0 contains NaN, Inf"),
    ((bad(T, 0, 3, -0.1), D, TOK, U), ValueError, "target_probs row 0 contains NaN, Inf or a negative"),
    ((T, bad(D, 0, 9, -1e-30), TOK, U), ValueError, "draft_probs row 0 contains NaN, Inf or a negative"),
    ((T, bad(D, 0, 0, np.nan), TOK, U), ValueError, "draft_probs row 0"),
    ((np.zeros_like(T), D, TOK, U), ValueError, "target_probs row 0 has zero total mass"),
    ((T, np.zeros_like(D), TOK, U), ValueError, "draft_probs row 0 has zero total mass"),
    ((T, D, TOK, [0.5, 0.5]), ValueError, r"uniforms must have shape \(K\+1,\) = \(3,\)"),
    ((T, D, TOK, [0.5, 1.0, 0.5]), ValueError, r"uniforms\[1\] = 1.0+ is not in \[0, 1\)"),
    ((T, D, TOK, [0.5, np.nan, 0.5]), ValueError, r"uniforms\[1\]"),
    ((T, D, TOK, [1, 0, 0]), TypeError, "uniforms must be floats"),
    ((T, D, [1, 99], U), ValueError, r"draft_tokens\[1\] = 99 is out of range for V = 10"),
]


@pytest.mark.parametrize("args,exc,msg", ACCEPT_CASES)
def test_accept_errors(kernel, args, exc, msg):
    with pytest.raises(exc, match=msg):
        specgguf.accept_uniforms(*args)


def test_bad_rows_are_found_on_big_rows(kernel):
    """NaN/negatives deep inside a long row (SIMD body, not the tail) are caught."""
    v = 5000
    t = np.full((2, v), 1.0, np.float32)
    d = np.full((1, v), 1.0, np.float32)
    for value in (np.nan, np.inf, -np.inf, -1.0):
        with pytest.raises(ValueError, match="target_probs row 1"):
            specgguf.accept_uniforms(bad(t, 1, 1234, value), d, [0], [0.1, 0.1])
    for value in (np.nan, np.inf):
        with pytest.raises(ValueError, match="target_probs row 0"):
            specgguf.verify_greedy(bad(t, 0, 777, value), [0])


def test_bad_generator_and_no_draws_lost():
    g = np.random.default_rng(0)
    state = g.bit_generator.state
    with pytest.raises(ValueError, match="out of range"):
        specgguf.accept(T, D, [1, 99], g)
    assert g.bit_generator.state == state  # a rejected call consumed no draws
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        specgguf.accept(T, D, TOK, generator="seed")
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        specgguf.accept(T, D, TOK, generator=True)


def test_set_kernel_rejects_unknown():
    with pytest.raises(ValueError, match="not available"):
        specgguf.set_kernel("sse9")


@pytest.mark.parametrize("args,exc,msg", [
    ((T, [1, 10], U), ValueError, r"draft_tokens\[1\] = 10 is out of range"),
    ((T[:2], TOK, U), ValueError, r"target_probs has shape \(2, 10\); expected \(K\+1, V\)"),
    ((bad(T, 0, 3, -1.0), TOK, U), ValueError, "target_probs row 0 contains NaN, Inf or a negative"),
    ((np.zeros_like(T), TOK, U), ValueError, "target_probs row 0 has zero total mass"),
    ((T, [1.5, 2], U), TypeError, "draft_tokens must be integer"),
    ((T, TOK, [0.5]), ValueError, r"uniforms must have shape"),
])
def test_accept_onehot_errors(kernel, args, exc, msg):
    with pytest.raises(exc, match=msg):
        specgguf.accept_onehot_uniforms(*args)
