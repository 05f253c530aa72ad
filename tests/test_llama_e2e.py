"""End to end on the real SmolLM2 pair from models.lock (fetched by scripts/setup.sh)."""

import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

llama_cpp = pytest.importorskip("llama_cpp")

import specgguf  # noqa: E402
from specgguf import models  # noqa: E402
from specgguf.api import SpeculativeLlama  # noqa: E402
from specgguf.llama_adapter import LlamaPair  # noqa: E402
from specgguf.policy import DraftPolicy  # noqa: E402

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "Write a detailed essay about the history of the printing press.",
]


def msgs(prompt):
    return [{"role": "user", "content": prompt}]


def load(name, n_ctx=1024):
    return llama_cpp.Llama(str(models.fetch(name)), n_ctx=n_ctx, n_threads=2, verbose=False)


@pytest.fixture(scope="module")
def target():
    return load("smollm2-135m-f32")


@pytest.fixture(scope="module")
def draft():
    return load("smollm2-135m-q4_1")


@pytest.fixture(scope="module")
def poor_draft():
    return load("smollm2-135m-q2_k")


@pytest.fixture(scope="module")
def spec(target, poor_draft):
    # The poor draft rejects often, which exercises the KV cut-backs.
    return SpeculativeLlama(target, poor_draft)


def plain_greedy(llm, ids, n):
    """Target-only greedy decoding through llama-cpp-python's own loop."""
    llm.reset()
    out = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(tok)
        if len(out) == n:
            break
    llm.reset()
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_identical_to_target_alone(spec, target, prompt):
    ids = spec.tokenize(msgs(prompt), chat=True)
    res = spec.generate(ids, max_tokens=80, k=4)
    assert len(res.tokens) >= 64
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))
    assert res.stats["drafted"] > 0


def test_kv_bookkeeping_matches_fresh_evaluation(target, poor_draft):
    pair = LlamaPair(target, poor_draft)
    ids = SpeculativeLlama(target, poor_draft).tokenize(msgs(PROMPTS[1]), chat=True)
    dec = specgguf.SpeculativeDecoder(pair.draft_step, pair.target_step, k=4)
    out = dec.generate(ids, max_new=60)
    assert dec.stats.accepted < dec.stats.drafted  # there were rejections
    seq = ids + out
    cached = pair.target.eval(seq, 1)  # reuses the cache: only the last token is new
    assert len(pair.target.tokens) == len(seq)
    pair.target.reset()
    fresh = pair.target.eval(seq, 1)
    # Batch shapes differ (one token vs the whole sequence), so the matmuls
    # round differently: equal within float tolerance, same argmax.
    np.testing.assert_allclose(cached, fresh, rtol=1e-3, atol=2e-2)
    assert cached.argmax() == fresh.argmax()
    pair.reset()


def test_sampled_seed_reproduces(spec):
    a = spec.generate(msgs(PROMPTS[0]), chat=True, max_tokens=40, temperature=0.8, seed=123)
    b = spec.generate(msgs(PROMPTS[0]), chat=True, max_tokens=40, temperature=0.8, seed=123)
    assert a.tokens == b.tokens and a.text == b.text


def test_emitted_token_follows_target_distribution(target, draft):
    """Real warped distributions at a real prefix: the first emitted token of a
    round follows the target's warped p (chi-square), not the draft's q."""
    pair = LlamaPair(target, draft, temperature=1.5, top_k=20, top_p=1.0, min_p=0.0, seed=0)
    ids = SpeculativeLlama(target, draft).tokenize(msgs("Name a colour."), chat=True)
    toks, q, _ = pair.draft_step(ids, 1)
    p = pair.target_step(ids, toks)
    pair.reset()
    rng = np.random.default_rng(0)
    cq = np.cumsum(q[0], dtype=np.float64)
    counts = np.zeros(p.shape[1])
    n = 20000
    for _ in range(n):
        t = int(min(np.searchsorted(cq, rng.random() * cq[-1], side="right"), len(cq) - 1))
        acc, nxt = specgguf.accept(p, q, [t], rng)
        counts[t if acc else nxt] += 1
    p0 = p[0] / p[0].sum()
    support = p0 > 0
    assert counts[~support].sum() == 0
    expected = p0[support].astype(np.float64)
    expected *= n / expected.sum()
    assert stats.chisquare(counts[support], expected).pvalue > 1e-3
    qn = q[0].astype(np.float64)[support] / q[0].astype(np.float64)[support].sum() * n
    if np.all(qn > 0):
        assert stats.chisquare(counts[support], qn * (n / qn.sum())).pvalue < 1e-3  # power


def test_stop_string_inside_accepted_block(spec):
    full = spec.generate(msgs(PROMPTS[2]), chat=True, max_tokens=48)
    stop = full.text[len(full.text) // 2: len(full.text) // 2 + 5]
    cut = spec.generate(msgs(PROMPTS[2]), chat=True, max_tokens=48, stop=stop)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]


def test_stream_equals_text(spec):
    pieces = list(spec.generate(msgs(PROMPTS[0]), chat=True, max_tokens=30, stream=True))
    assert "".join(pieces) == spec.generate(msgs(PROMPTS[0]), chat=True, max_tokens=30).text


def test_full_context_window(target, draft):
    small_t, small_d = load("smollm2-135m-f32", n_ctx=64), load("smollm2-135m-q4_1", n_ctx=64)
    s = SpeculativeLlama(small_t, small_d)
    ids = s.tokenize(msgs(PROMPTS[0]), chat=True)
    res = s.generate(ids, max_tokens=500)
    assert res.finish_reason == "length"
    n_ctx = llama_cpp.llama_n_ctx(small_t.ctx)  # llama.cpp may round 64 up
    assert len(ids) + len(res.tokens) <= n_ctx
    with pytest.raises(ValueError, match="context window"):
        s.generate(ids * (n_ctx // len(ids) + 1), max_tokens=5)


def test_models_usable_after_an_exception(spec, target):
    m = msgs(PROMPTS[1])
    ref = spec.generate(m, chat=True, max_tokens=20).tokens
    assert len(ref) == 20
    it = spec.run(m, max_tokens=40, k=4, chat=True)
    next(it)
    with pytest.raises(KeyboardInterrupt):
        it.throw(KeyboardInterrupt)  # as a Ctrl-C arriving mid-generation
    assert spec.generate(m, chat=True, max_tokens=20).tokens == ref
    with pytest.raises(ValueError, match="out of range"):
        spec.generate([1, 10**9], max_tokens=5)
    assert spec.generate(m, chat=True, max_tokens=20).tokens == ref


def test_bad_model_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        SpeculativeLlama(str(tmp_path / "missing.gguf"), "smollm2-135m-q4_1")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        SpeculativeLlama(str(junk), "smollm2-135m-q4_1")


def test_vocab_mismatch_is_refused(tmp_path, target):
    import gguf
    src = models.fetch("smollm2-135m-q2_k")
    changed = tmp_path / "changed-vocab.gguf"
    shutil.copyfile(src, changed)
    reader = gguf.GGUFReader(str(changed), "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    text = field.parts[field.data[1000]]
    text[0] = ord("Z") if text[0] != ord("Z") else ord("Y")  # same length, other text
    reader.data.flush()
    del reader
    with pytest.raises(ValueError, match=r"token 1000 is .* in the draft but .* in the target"):
        SpeculativeLlama(target, str(changed))


def test_lock_refuses_tampered_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path))
    entries, _ = models.load_lock()
    e = entries["smollm2-135m-q2_k"]
    bad = tmp_path / e.file
    shutil.copyfile(models.LOCK_PATH.parent / "models.lock", bad)  # wrong content, wrong size
    with pytest.raises(ValueError, match="sha256 .* pins"):
        models.fetch("smollm2-135m-q2_k")
    assert not bad.exists()


def test_derivation_reproduces_pinned_sha(tmp_path, monkeypatch):
    src = models.fetch("smollm2-135m-q4_1")
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path))
    shutil.copyfile(src, tmp_path / src.name)  # parent present: only the derivation runs
    out = models.fetch("smollm2-135m-q2_k")
    entries, _ = models.load_lock()
    assert models.sha256_of(out) == entries["smollm2-135m-q2_k"].sha256


def test_cli_errors_are_one_line():
    r = subprocess.run([sys.executable, "-m", "specgguf", "--target", "/nonexistent.gguf", "-p", "hi"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().startswith("specgguf: error:") and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "specgguf", "--temp", "-1", "-p", "hi"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "must be >= 0" in r.stderr


def test_cli_runs_default_pair():
    r = subprocess.run([sys.executable, "-m", "specgguf", "-p", "Hello", "-n", "8", "--json", "--chat"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import json
    out = json.loads(r.stdout)
    assert len(out["tokens"]) <= 8 and out["stats"]["rounds"] >= 1


def test_auto_k_seeded_run_reproduces(spec):
    m = msgs(PROMPTS[0])
    a = spec.generate(m, chat=True, max_tokens=40, temperature=0.8, seed=9, k="auto", p_min="auto")
    b = spec.generate(m, chat=True, max_tokens=40, temperature=0.8, seed=9, k="auto", p_min="auto")
    assert a.tokens == b.tokens
    assert a.stats["k_hist"] == b.stats["k_hist"]  # the same choices, so the same draws


def test_auto_k_greedy_is_still_exact(spec, target):
    ids = spec.tokenize(msgs(PROMPTS[1]), chat=True)
    res = spec.generate(ids, max_tokens=48, k="auto")
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))


def test_draft_confidence_cutoff(target, draft):
    pair = LlamaPair(target, draft)
    ids = SpeculativeLlama(target, draft).tokenize(msgs(PROMPTS[0]), chat=True)
    toks, _, info = pair.draft_step(ids, 4, p_min=1.0)  # nothing is that certain
    assert toks == [] and info["stop"] == "cutoff"
    toks, _, info = pair.draft_step(ids, 4, p_min=0.0)
    assert len(toks) == 4 and info["stop"] == "max"
    assert all(0.0 < c <= 1.0 for c in info["confidence"])
    pair.reset()


COPY_PROMPT = ("Repeat the following text exactly, word for word: The quick brown fox jumps over the "
               "lazy dog. Speculative decoding lets a small draft model propose several tokens that a "
               "large target model verifies in a single batched forward pass.")


def test_ngram_draft_end_to_end(target):
    s = SpeculativeLlama(target, "ngram")
    ids = s.tokenize(msgs(COPY_PROMPT), chat=True)
    res = s.generate(ids, max_tokens=40, k=4)
    assert res.stats["drafted"] > 0 and res.stats["accepted"] > 0
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))
    sampled = s.generate(ids, max_tokens=40, k=4, temperature=0.8, seed=3)
    assert sampled.tokens == s.generate(ids, max_tokens=40, k=4, temperature=0.8, seed=3).tokens


def test_cli_ngram_and_auto():
    r = subprocess.run([sys.executable, "-m", "specgguf", "--draft", "ngram", "--chat", "-p", COPY_PROMPT,
                        "-n", "24", "--stats"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "K chosen per round" in r.stderr
    r = subprocess.run([sys.executable, "-m", "specgguf", "-k", "2", "--p-min", "auto", "-p", "hi"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "with -k auto" in r.stderr


def test_text_stream_utf8_and_stop_strings(target):
    """Multi-byte characters split across byte-level tokens come out whole;
    a stop string spanning tokens cuts the text exactly before it."""
    from specgguf.api import TextStream
    text = "Rocket 🚀 café, 日本語 and naïve façade."
    ids = target.tokenize(text.encode(), add_bos=False, special=False)
    detok = lambda t: target.detokenize([t], special=False)
    assert any(len(detok(t).decode("utf-8", "ignore")) == 0 for t in ids)  # some tokens split a character
    ts = TextStream(detok)
    pieces = [ts.add(t) for t in ids] + [ts.finish()]
    assert "".join(pieces) == ts.text == text and "\ufffd" not in "".join(pieces)
    ts = TextStream(detok, stops=["語 and na"])
    pieces = []
    for t in ids:
        pieces.append(ts.add(t))
        if ts.stopped:
            break
    pieces.append(ts.finish())
    assert "".join(pieces) == text[: text.index("語 and na")] and ts.stopped


def test_learned_acceptance_is_stored_for_later_runs(target, poor_draft):
    s = SpeculativeLlama(target, poor_draft)
    s.generate(msgs(PROMPTS[2]), chat=True, max_tokens=24, k="auto")
    entry = s._calibration()
    assert "learned" in entry and "draft" in entry and len(entry["target"]) == s.K_MAX + 1
    again = SpeculativeLlama(target, poor_draft)
    again.generate(msgs(PROMPTS[2]), chat=True, max_tokens=4, k="auto")
    stored = entry["learned"]["total_tried"]
    fresh = DraftPolicy(SpeculativeLlama.K_MAX)
    fresh.load_state(entry["learned"])
    assert fresh.total_tried == pytest.approx(min(DraftPolicy.PRIOR_CAP, stored))
    # A new object (as a new process would) starts from what the first learned.
    assert again._policy is not None and (stored == 0 or again._policy.total_tried > 0)


def test_calibration_measures_the_drafts_acceptance(target, draft, poor_draft):
    good = LlamaPair(target, draft).measure_acceptance()
    assert good == LlamaPair(target, draft).measure_acceptance()  # a fixed value, as seeded runs need
    poor = LlamaPair(target, poor_draft).measure_acceptance()
    for m in (good, poor):
        assert 0.0 <= m["greedy"] <= 1.0 and 0.0 <= m["sampled"] <= 1.0
    # The Q4_1 draft agrees with the F32 target far more often than the Q2_K one.
    assert good["greedy"] > poor["greedy"] + 0.1 and good["sampled"] > poor["sampled"]
    # A seeded policy starts from the stored measurement, read the same way every call.
    s = SpeculativeLlama(target, poor_draft)
    assert s.prior_acceptance(greedy=False) == s._calibration()["acceptance"]["sampled"]
    assert SpeculativeLlama(target, "ngram").prior_acceptance(greedy=True) is None
    with pytest.raises(ValueError, match="no draft model"):
        LlamaPair(target, None).measure_acceptance()


def test_first_run_calibrates_before_its_settings(tmp_path, monkeypatch, target, poor_draft):
    """The run that measures the calibration (no stored one) samples as asked
    and gives the text later runs with the same seed give: the measurement
    happens before the run's settings are made, never in its middle."""
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path))
    s = SpeculativeLlama(target, poor_draft)
    m = msgs(PROMPTS[1])
    first = s.generate(m, chat=True, max_tokens=24, temperature=1.0, seed=5, k="auto")
    assert (tmp_path / "calibration.json").exists()
    again = SpeculativeLlama(target, poor_draft).generate(m, chat=True, max_tokens=24, temperature=1.0,
                                                        seed=5, k="auto")
    assert first.tokens == again.tokens
    greedy = s.generate(m, chat=True, max_tokens=24, k=0)
    assert first.tokens != greedy.tokens  # it sampled: temperature 1 leaves the greedy path in 24 tokens


def test_auto_k_skips_a_draft_that_could_not_repay_its_prompt_prefill(target, draft):
    """A long prompt and a 6-token answer: whatever this machine's costs, the
    draft's prefill of the prompt costs more than drafting could save on 6
    tokens, so k="auto" decodes plainly and the draft never runs - and the
    output is still the target's greedy output."""
    s = SpeculativeLlama(target, draft)
    long_prompt = " ".join(["The printing press changed how books were made."] * 40)
    ids = s.tokenize(long_prompt)
    assert len(ids) > 300
    res = s.generate(ids, max_tokens=6, k="auto")
    assert res.stats["k_hist"] == {0: res.stats["rounds"]}
    assert s.pair.draft.seconds == 0.0  # not one draft forward
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))
    costs = s.costs()
    assert costs.draft_prefill > 0 and costs.draft > costs.draft_prefill  # batching pays per token
