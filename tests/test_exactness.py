"""Bit-identical output: every token of a speculative run is the one plain
decoding gives, not "up to near-ties".

llama.cpp's batch kernels sum in other orders than its one-token kernels;
specgguf's build of llama.cpp (scripts/patches/llama-batch-invariant.patch)
computes a forward of fewer than 64 tokens row by row as one-token forwards
do, and :func:`specgguf.llama.model.forwards` keeps every verification row in
such forwards and every prompt in the chunks plain decoding reads it in. Here:
the forward itself (bit for bit), then greedy and seeded text on prompts of
several kinds built from the standard library's own text (tests/corpus.py; the
whole corpus runs in bench/exactness.py), in process and through the server's
slots with concurrent requests.
"""

import threading

import pytest

pytest.importorskip("llama_cpp")

from specgguf.api import SpeculativeLlama  # noqa: E402
from specgguf.llama import models  # noqa: E402
from specgguf.llama.invariance import INVARIANT_TOKENS, batch_invariance, probe  # noqa: E402
from specgguf.llama.model import LlamaModel, forwards, load_llama  # noqa: E402
from tests.corpus import subset  # noqa: E402

TOKENS = 40
PROMPTS = subset(2)  # two of each kind: code, prose, chat


def _run(spec, prompt, **settings):
    return spec.generate(prompt, max_tokens=TOKENS, **settings).tokens


# ---- the forward -------------------------------------------------------------------------


def test_forwards_keep_prompt_chunks_whole_and_rounds_small():
    rows = lambda a, b: [(0, p) for p in range(a, b)]  # noqa: E731
    prompt, draft = rows(0, 100), rows(100, 105)
    # Without invariance: every row in order, n_batch at a time (llama.cpp's own packing).
    assert forwards([prompt, draft], 512, 0) == [prompt + draft]
    assert forwards([prompt, draft], 64, 0) == [(prompt + draft)[:64], (prompt + draft)[64:]]
    # With it: a chunk of 64 or more rows alone (as plain decoding reads it), rounds under 64.
    assert forwards([prompt, draft], 512, 64) == [prompt, draft]
    other = [(1, p) for p in range(40, 49)]
    assert forwards([draft, other, rows(105, 110)], 512, 64) == [draft + other + rows(105, 110)]
    many = [[(s, p) for p in range(9)] for s in range(8)]  # 8 slots x 9 rows: 72 rows
    out = forwards(many, 512, 64)
    assert [r for b in out for r in b] == [r for p in many for r in p] and all(len(b) < 64 for b in out)
    assert forwards([rows(0, 40), rows(40, 70)], 512, 64) == [rows(0, 40) + rows(40, 63), rows(63, 70)]


def test_batch_invariance_is_on_in_this_build():
    assert batch_invariance() == INVARIANT_TOKENS, (
        "llama.cpp is not built with scripts/patches/llama-batch-invariant.patch: run scripts/setup.sh")


@pytest.mark.parametrize("value, bound, warned", [("0", 0, False), ("32", 32, False), ("lots", INVARIANT_TOKENS, True)])
def test_the_switch_follows_the_environment(value, bound, warned):
    """SPECGGUF_BATCH_INVARIANT sets the bound for the process (0: off); a
    value that is not a number is named in a warning and the default kept."""
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "from specgguf.llama.invariance import batch_invariance as b; "
                        "print(b())"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SPECGGUF_BATCH_INVARIANT=value))
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) == bound
    assert ("SPECGGUF_BATCH_INVARIANT must be a number" in r.stderr) == warned, r.stderr


@pytest.mark.parametrize("name", ["smollm2-135m-f32", "smollm2-135m-q4_1", "smollm2-135m-q2_k"])
def test_a_batch_scores_each_token_as_one_token_forwards_do(name):
    """The default target (F32: llamafile's tinyBLAS), the draft and the
    K-quant file (Q2_K: the repacked gemm), rows compared bit for bit."""
    import inspect
    import textwrap
    llm = load_llama(models.fetch(name), n_ctx=512, n_threads=2)
    model = LlamaModel(llm)
    ids = llm.tokenize(inspect.getsource(textwrap).encode(), add_bos=True)[:60]
    for batch in (2, 9, 33):
        got = probe(model, ids, batch=batch)
        assert got["identical"] == got["rows"] == len(ids) - len(ids) // 4, (batch, got)
        assert got["max_diff"] == 0.0 and got["argmax_flips"] == 0


def test_the_stock_kernels_are_the_drafts_alone_and_for_one_forward():
    """kernels(False) turns the bound off for the forward inside it and back
    after, on error too; the bound itself never moves."""
    from specgguf.llama import invariance
    lib = invariance._lib
    with invariance.kernels(False):
        assert lib.ggml_cpu_get_batch_invariant() == 0
    with pytest.raises(RuntimeError), invariance.kernels(False):
        raise RuntimeError("a forward failed")
    with invariance.kernels(True):
        assert lib.ggml_cpu_get_batch_invariant() == INVARIANT_TOKENS
    assert lib.ggml_cpu_get_batch_invariant() == batch_invariance() == INVARIANT_TOKENS


def test_a_draft_row_that_reaches_a_seeded_text_is_row_invariant(target, poor_draft):
    """A draft's forwards take the stock kernels (a Q4_1 draft token costs 15%
    less) unless a sequence in them reads the draft's bits (exact p/q with a
    seed), whose q is then what a fresh row-invariant cache gives, to the bit,
    also after the stock kernels wrote the slot's cache. Q2_K: the stock
    kernels read a prompt in other sums, as the unseeded control shows."""
    import inspect
    import textwrap

    import numpy as np

    from specgguf.llama.adapter import SlotDrafter
    from specgguf.ops.drafter import Ask
    from specgguf.ops.sampling import Sampler
    ids = poor_draft.tokenize(inspect.getsource(textwrap).encode(), add_bos=True)[:48]
    warping = (0.8, 40, 0.95, 0.05)
    seeded, unseeded = Sampler("exact", warping, generator=1, seed=1), Sampler("exact", warping, generator=1)
    model = LlamaModel(poor_draft, slots=2)
    assert model.stock_pays and not LlamaModel(target).stock_pays  # quantized weights, F32 ones

    def first_q(sampler, stock, slot=0, reset=True):
        if reset:
            model.reset()
        (draft,), _ = SlotDrafter(model, stock=stock).propose([Ask(slot, ids, sampler, 1, None, len(ids))])
        return draft.probs[0]

    fresh = first_q(seeded, stock=False)
    assert np.array_equal(first_q(seeded, stock=True), fresh)
    assert not np.array_equal(first_q(unseeded, stock=True), fresh)  # the stock kernels' own bits
    assert model.stock_from[0] == 0
    assert np.array_equal(first_q(seeded, stock=True, reset=False), fresh)  # read again, row-invariant
    model.reset()
    first_q(unseeded, stock=True, reset=False)
    model.load(1, model.save(0))  # a stashed cache carries where the stock kernels wrote it
    assert model.stock_from[1] == 0
    assert np.array_equal(first_q(seeded, stock=True, slot=1, reset=False), fresh)


# ---- greedy and seeded text, in process ----------------------------------------------------


@pytest.fixture(scope="module")
def spec():
    return SpeculativeLlama(models.fetch("smollm2-135m-f32"), models.fetch("smollm2-135m-q4_1"),
                            n_ctx=1024, n_threads=2)


@pytest.fixture(scope="module")
def poor():
    return SpeculativeLlama(models.fetch("smollm2-135m-f32"), models.fetch("smollm2-135m-q2_k"),
                            n_ctx=1024, n_threads=2)


@pytest.mark.parametrize("kind,prompt", PROMPTS, ids=[f"{k}{i % 2}" for i, (k, _) in enumerate(PROMPTS)])
def test_greedy_text_is_plain_greedy_token_for_token(spec, poor, kind, prompt):
    plain = _run(spec, prompt, temperature=0, k=0)
    assert plain
    for k in (1, 3, 8, "auto"):
        assert _run(spec, prompt, temperature=0, k=k) == plain, k
    assert _run(poor, prompt, temperature=0, k=4) == plain, "poor draft"
    assert _run(poor, prompt, temperature=0, k=0) == plain, "the same target loaded again"


@pytest.mark.parametrize("kind,prompt", PROMPTS[::2], ids=["code", "prose", "chat"])
def test_seeded_text_is_the_same_whatever_the_draft_and_k(spec, poor, kind, prompt):
    """Drafter-invariant sampling (the default with a seed): the text is
    plain seeded sampling's, whatever K and draft verify it."""
    settings = dict(temperature=0.8, seed=11)
    plain = _run(spec, prompt, k=0, **settings)
    for k in (2, 6, "auto"):
        assert _run(spec, prompt, k=k, **settings) == plain, k
    assert _run(poor, prompt, k=3, **settings) == plain, "poor draft"


def test_several_prompts_in_shared_rounds_are_each_what_they_get_alone():
    """Four slots: every round verifies all requests in one batch, prompts
    join while others decode; each text equals its plain decoding alone."""
    spec = SpeculativeLlama(models.fetch("smollm2-135m-f32"), models.fetch("smollm2-135m-q4_1"),
                            n_ctx=1024, n_threads=2, parallel=4)
    prompts = [p for _, p in PROMPTS]
    alone = [_run(spec, p, temperature=0, k=0) for p in prompts]
    for k in (3, "auto"):
        together = spec.generate_many(prompts, max_tokens=TOKENS, temperature=0, k=k)
        assert [r.tokens for r in together] == alone, k
    seeded = [_run(spec, p, temperature=0.8, seed=5, k=0) for p in prompts[:4]]
    together = spec.generate_many(prompts[:4], max_tokens=TOKENS, temperature=0.8, seed=5, k=4)
    assert [r.tokens for r in together] == seeded


# ---- through the server's slots ------------------------------------------------------------


def test_the_servers_concurrent_requests_are_each_plain_decodings_text(session_state):
    """`serve --parallel 4`, six requests at once (two wait for a slot),
    greedy and seeded: each text is what the same request gets alone with
    ``k: 0``; slots do not perturb each other's arithmetic."""
    import httpx
    from tests.test_server import Served
    s = Served("--parallel", "4", "--ctx", "1024", key=None)
    try:
        def body(i, kind, prompt, **extra):
            b = {"max_tokens": TOKENS, "temperature": 0.0, **extra}
            if kind == "chat":
                return "/v1/chat/completions", dict(b, messages=prompt)
            return "/v1/completions", dict(b, prompt=prompt)

        def text(path, b):
            r = httpx.post(s.url + path, json=b, timeout=300)
            assert r.status_code == 200, r.text
            c = r.json()["choices"][0]
            return c["message"]["content"] if "message" in c else c["text"]

        greedy, seeded = PROMPTS[::2] + PROMPTS[3:4], PROMPTS[1:2] + PROMPTS[5:6]  # six: two wait
        reqs = [body(i, kind, p) for i, (kind, p) in enumerate(greedy)]
        reqs += [body(i, kind, p, temperature=0.8, seed=i) for i, (kind, p) in enumerate(seeded)]
        alone = [text(path, dict(b, k=0)) for path, b in reqs]
        got = [None] * len(reqs)

        def one(i):
            got[i] = text(*reqs[i])
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == alone, s.text()[-2000:]
    finally:
        s.stop()
